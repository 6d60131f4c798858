"""The compliance suite's own machinery (tests/compliance/conftest.py) and the controls'
pure rules: each mechanism's test fails when its line is removed."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from tests.compliance import conftest, reads, results, selection
from tests.compliance.test_source_builds import target_problem
from tests.support import check_on_local


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
    assert selection.read_only_selection(markexpr) is read_only


@pytest.mark.parametrize(
    ("args", "options"),
    [
        (["-m", "read"], ["--capture=sys", "-p", "no:logging"]),
        (["-q", "-mnot action", "-k", "swap"], ["--capture=sys", "-p", "no:logging"]),
        (["-m", "read", "-m", "action"], []),  # pytest takes the last -m
        ([], []),
        (["-k", "swap"], []),
        (["-m", "read", "-s"], ["-p", "no:logging"]),
        (["-m", "read", "--capture=fd"], ["-p", "no:logging"]),
        (["-m", "read", "--log-level=DEBUG"], ["--capture=sys"]),
        (["-m", "read", "-o", "log_cli=true"], ["--capture=sys"]),
    ],
)
def test_a_read_only_selection_runs_without_pytest_s_log_and_descriptor_capture(args, options):
    assert selection.read_only_options(args) == options


@pytest.mark.parametrize(
    ("options", "said"),
    [(["-m", "read"], "capture sys, logging False"), (["-n", "0"], "capture fd, logging True")],
)
def test_sparkrig_check_runs_a_read_only_selection_with_those_options(tmp_path, options, said):
    """The installed tool's entry point (sparkrig check), a real run of one control on @local."""
    probe = (
        "import os\n"
        "def pytest_runtest_call(item):\n"
        "    config = item.config\n"
        "    logging = config.pluginmanager.has_plugin('logging-plugin')\n"
        "    open(os.environ['PROBE'], 'a').write(f'capture {config.option.capture}, logging {logging}\\n')\n"
    )
    run, said_by = check_on_local(tmp_path, probe, "-k", "test_no_swap_is_active", *options)
    assert said_by.read_text().splitlines() == [said], run.stdout[-2000:] + run.stderr[-2000:]


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


# --- a host's strings in the suite's table --------------------------------------------------


def _report(nodeid: str, message: str, outcome: str = "failed"):
    crash = SimpleNamespace(message=message)
    return SimpleNamespace(
        nodeid=nodeid,
        when="call",
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        passed=outcome == "passed",
        longrepr=SimpleNamespace(reprcrash=crash) if outcome == "failed" else ("f", 1, f"Skipped: {message}"),
        keywords={},
        user_properties=[],
        start=0,
        stop=0,
    )


def test_the_per_host_table_escapes_what_a_host_wrote_and_keeps_one_line_per_finding():
    """A control's finding quotes the host (here a fwupd device's name, as lab/fwupd.py's
    STAND-IN names it): the table, which the rollout reads line by line, escapes it."""
    table = conftest.HostTable(["spark-a", "spark-b"])
    table.add(
        _report(
            "tests/compliance/test_updates.py::test_fw[ssh://spark-a]",
            "AssertionError: device 'NIC \x1b]0;pwned\x07\x1b[31mred\r  spark-b: test_updates.py::test_fw"
            "[ssh://spark-b]: forged\u2028x\x9b' is not at 2.91",
        )
    )
    table.add(_report("tests/compliance/test_updates.py::test_skip[ssh://spark-b]", "no GPU\x1b[2J", "skipped"))
    table.add(_report("tests/compliance/test_updates.py::test_fw[ssh://spark-b]", "", "passed"))
    lines = table.lines()
    text = "\n".join(lines)
    assert not any(ch in text for ch in "\x1b\x07\r\u2028\x9b"), repr(text)
    assert [line for line in lines if "spark-b: test_updates.py" in line] == []
    assert "device 'NIC \\x1b]0;pwned\\x07\\x1b[31mred" in text
    assert table.skips[("spark-b", "test_updates.py::test_skip[ssh://spark-b]")] == "no GPU\\x1b[2J"
    # The same words in results.json (tests/compliance/results.py), from the same helpers.
    record = results.Record()
    record.add(
        _report("tests/compliance/test_updates.py::test_fw[ssh://spark-a]", "AssertionError: NIC \x1b]0;pwned\x07")
    )
    assert record.reason == "NIC \\x1b]0;pwned\\x07", record.reason


# --- host.sudo() as root, where sudo is not installed ---------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the path under test is a root login's")
def test_an_action_controls_sudo_path_runs_as_root_without_sudo(tmp_path, monkeypatch):
    """testinfra's local backend, as root, with a STAND-IN sudo that is not there (it says
    "sudo: not found" and fails, as on the lent GPU machine): ``host.sudo()`` and
    ``host.sudo(user)``, as the action controls use them, run without it."""
    import testinfra  # noqa: PLC0415

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text("#!/bin/sh\necho 'sudo: not found' >&2\nexit 127\n")  # STAND-IN: no sudo
    (bin_dir / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin")
    host = testinfra.get_host("local://")
    assert host.run("sudo true").rc == 127  # the stand-in is what the command finds
    with host.sudo():
        assert host.check_output("id -u") == "0"
    with host.sudo("nobody"):
        assert host.check_output("id -un") == "nobody"
