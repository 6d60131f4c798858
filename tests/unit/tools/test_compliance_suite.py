"""The compliance suite's own machinery (tests/compliance/conftest.py) and the controls'
pure rules: each mechanism's test fails when its line is removed."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests.compliance import conftest, reads
from tests.compliance.test_source_builds import target_problem


def _item(action: bool):
    marker = object()
    return SimpleNamespace(
        name="test_x", get_closest_marker=lambda name: marker if action and name == "action" else None
    )


@pytest.mark.parametrize("action", [True, False])
def test_a_control_marked_action_is_never_answered_from_the_prefetch(action):
    """The suite's protocol hook tells the layer whether the control acts: an action's reads
    are then read fresh (reads.answer ignores the prefetch), a read-only control's are not."""
    hook = conftest.pytest_runtest_protocol(_item(action), None)
    next(hook)
    try:
        assert reads.acting is action
    finally:
        hook.close()
    assert reads.acting is False


def test_a_read_only_control_is_guarded_and_stopped_at_its_time_limit(monkeypatch):
    """While a read-only control runs, testinfra's host refuses it (reads.guarded); a control
    that runs past its limit is stopped with ControlTimeout, and the guard and the alarm end
    with it."""
    monkeypatch.setattr(conftest, "READ_ONLY_TIMEOUT_S", 1)
    hook = conftest.pytest_runtest_call(_item(False))
    next(hook)
    started = time.monotonic()
    try:
        assert reads.guarded is True
        with pytest.raises(conftest.ControlTimeout, match="ran past its 1 s limit"):
            time.sleep(10)
    finally:
        hook.close()
    assert time.monotonic() - started < 5
    assert reads.guarded is False
    time.sleep(1.2)  # the alarm was cancelled: nothing fires now


def test_an_action_control_is_not_guarded_and_has_its_own_limit(monkeypatch):
    monkeypatch.setattr(conftest, "ACTION_TIMEOUT_S", 1)
    hook = conftest.pytest_runtest_call(_item(True))
    next(hook)
    try:
        assert reads.guarded is False
        with pytest.raises(conftest.ControlTimeout):
            time.sleep(10)
    finally:
        hook.close()


PROFILES = {"hardware_profiles": {"gb10": {"torch_cuda_arch_list": "12.1a"}, "hopper": {"torch_cuda_arch_list": "9.0"}}}


def test_a_build_target_honours_the_per_profile_override():
    """A source build's torch_cuda_arch_list for the host's profile wins over the profile's
    own: a wheel built for the override is right, one built for the profile's default wrong."""
    spec = {"torch_cuda_arch_list": {"hopper": "9.0a"}}
    assert target_problem({"target": "9.0a", "profile": "hopper"}, spec, PROFILES, "hopper") is None
    assert "wants '9.0a'" in target_problem({"target": "9.0", "profile": "hopper"}, spec, PROFILES, "hopper")
    # Without an override for this profile, the profile's own list.
    assert target_problem({"target": "12.1a", "profile": "gb10"}, spec, PROFILES, "gb10") is None
    assert target_problem({"target": "12.1a", "profile": "hopper"}, {}, PROFILES, "hopper") is not None


@pytest.mark.parametrize(
    ("markexpr", "read_only"),
    [
        ("not action", True),
        ("read", True),
        ("read and not lab", True),
        ("", False),
        ("action", False),
        ("not lab", False),
        ("read or action", False),
    ],
)
def test_a_read_only_selection_runs_without_workers(markexpr, read_only):
    """Only when -m leaves out every action control does the suite skip xdist's workers."""
    assert conftest.read_only_selection(markexpr) is read_only


def test_the_read_only_controls_run_without_workers_and_the_whole_suite_with_them(monkeypatch):
    def config(markexpr, args=()):
        option = SimpleNamespace(numprocesses=None, dist="no", markexpr=markexpr)
        return SimpleNamespace(
            args=list(args),
            option=option,
            pluginmanager=SimpleNamespace(hasplugin=lambda name: True),
            getoption=lambda name: {"--inventory": "inv.py", "--limit": []}[name],
        )

    monkeypatch.setattr(conftest, "inventory_host_data", lambda inv, limit: {"a": {}})
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    read_only, whole = config("not action"), config("")
    conftest.pytest_cmdline_main(read_only)
    conftest.pytest_cmdline_main(whole)
    assert read_only.option.numprocesses == 0
    assert whole.option.numprocesses == conftest.MIN_WORKERS
    # Named files or controls that never act need no workers either.
    swap, jobs = "tests/compliance/test_swap.py", "tests/compliance/test_jobs.py"
    for args, workers in (
        ([swap], 0),
        ([f"{jobs}::test_spark_preflight_passes_on_a_converged_host", swap], 0),
        ([jobs], conftest.MIN_WORKERS),
        ([f"{jobs}::test_spark_drop_caches_works_as_root_only"], conftest.MIN_WORKERS),
        (["tests/compliance"], conftest.MIN_WORKERS),
        ([f"{swap}::test_no_such_control"], conftest.MIN_WORKERS),
    ):
        named = config("", args)
        conftest.pytest_cmdline_main(named)
        assert named.option.numprocesses == workers, args
