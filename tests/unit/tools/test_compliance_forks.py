"""tests/compliance/forks.py: a real pytest run whose controls are shared between its process
and forks of it, each report made where the control ran and reported once, by the first."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from tests.compliance import forks
from tests.support import REPO

# Three "hosts" (a parameter), controls that pass, fail, skip and print; each writes which
# process ran it. Host c's fork dies after its first control, unless it runs in the first process.
CONFTEST = """
import os
import pytest
from tests.compliance import forks

def host_of(item):
    return item.callspec.params["h"]

def pytest_runtestloop(session):
    return forks.run(session, int(os.environ["FORKS"]), host_of)
"""
CONTROLS = """
import os
import warnings
import pytest

warnings.warn(UserWarning("said at collection"))

@pytest.fixture(params=["a", "b", "c"], scope="module")
def h(request):
    return request.param

def _ran(h, name):
    with open(os.environ["RAN"], "a") as out:
        out.write(f"{h} {name} {os.getpid()}\\n")

def test_passes(h):
    _ran(h, "passes")
    print("said nothing a host sees")

def test_fails(h):
    _ran(h, "fails")
    assert h == "a", f"{h} is not a"

def test_skips(h):
    _ran(h, "skips")
    pytest.skip(f"nothing to check on {h}")

def test_warns(h):
    _ran(h, "warns")
    warnings.warn(UserWarning(f"careful on {h}"))

def test_dies(h):
    _ran(h, "dies")
    if h == "c" and os.environ.get("DIE") and os.getpid() != int(os.environ["FIRST"]):
        os._exit(7)
"""


def _run(tmp_path, forks_count: int, die: bool = False):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_controls.py").write_text(CONTROLS)
    ran = tmp_path / "ran"
    ran.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(REPO), FORKS=str(forks_count), RAN=str(ran), DIE="1" if die else "")
    script = "import os, sys, pytest\nos.environ['FIRST'] = str(os.getpid())\nsys.exit(pytest.main(sys.argv[1:]))\n"
    run = subprocess.run(
        [sys.executable, "-c", script, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", "--junitxml", "j.xml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line.split() for line in ran.read_text().splitlines()] if ran.exists() else []
    outcomes = {}
    for case in ET.parse(tmp_path / "j.xml").iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcomes[case.get("name")] = (kind, next((c.get("message", "") for c in case if c.tag != "system-out"), ""))
    return run, lines, outcomes


def test_each_host_runs_in_one_process_and_the_first_reports_every_control(tmp_path):
    alone, _, expected = _run(tmp_path, 1)
    run, lines, outcomes = _run(tmp_path, 3)
    pids = {}
    for host, _name, pid in lines:
        pids.setdefault(host, set()).add(pid)
    assert all(len(found) == 1 for found in pids.values()), pids
    assert len(set.union(*pids.values())) == 3  # three processes, a host each
    # What each control found is what it finds when one process runs them all.
    assert outcomes == expected
    assert outcomes["test_fails[b]"][0] == "failure" and "b is not a" in outcomes["test_fails[b]"][1]
    assert outcomes["test_skips[c]"] == ("skipped", "nothing to check on c")
    assert run.stdout.splitlines()[-1].split(" in ")[0] == alone.stdout.splitlines()[-1].split(" in ")[0]
    assert "SKIPPED [1] test_controls.py:" in run.stdout  # a skip's reason keeps its shape
    # One progress mark a control, from the first process alone (a fork prints nothing).
    progress = [sorted(out.splitlines()[0].split("[")[0].strip()) for out in (run.stdout, alone.stdout)]
    assert progress[0] == progress[1] and len(progress[0]) == 15
    # A control's warning is reported as where it ran alone: in the warnings' summary.
    for host in "abc":
        assert f"test_controls.py::test_warns[{host}]" in run.stdout and f"UserWarning: careful on {host}" in run.stdout
    assert run.stdout.count("careful on") == alone.stdout.count("careful on")
    assert run.stdout.count("said at collection") == alone.stdout.count("said at collection") > 0
    assert "4 warnings" in run.stdout.splitlines()[-1]
    assert run.returncode == 1


def test_a_fork_that_dies_fails_the_controls_it_left_naming_why(tmp_path):
    run, _lines, outcomes = _run(tmp_path, 3, die=True)
    assert outcomes["test_dies[c]"][0] == "failure"
    assert "ended before this one was reported (exited 7)" in run.stdout
    assert outcomes["test_passes[a]"][0] == "passed" and outcomes["test_fails[b]"][0] == "failure"


def _session(items, *, forks_given=None, targets="inventory", markexpr="read", numprocesses=0, **option):
    values = {"usepdb": False, "maxfail": 0, "collectonly": False, "markexpr": markexpr, "numprocesses": numprocesses}
    values.update(option)
    config = SimpleNamespace(
        getoption=lambda name: {"--forks": forks_given}[name],
        sparkrig_targets=targets,
        option=SimpleNamespace(**values),
    )
    return SimpleNamespace(config=config, items=items, testsfailed=0)


class _Item:
    def __init__(self, host, action=False):
        self.host, self.action = host, action

    def get_closest_marker(self, name):
        return object() if name == "action" and self.action else None


@pytest.mark.parametrize(
    ("why", "session", "expected"),
    [
        ("two hosts, two cores", _session([_Item("a"), _Item("b")]), 2),
        ("as many as asked", _session([_Item("a"), _Item("b"), _Item("c")], forks_given=3), 3),
        ("never more than hosts", _session([_Item("a"), _Item("b")], forks_given=5), 2),
        ("asked for none", _session([_Item("a"), _Item("b")], forks_given=0), 0),
        ("one host", _session([_Item("a"), _Item("a")]), 0),
        ("a control that acts", _session([_Item("a"), _Item("b", action=True)]), 0),
        ("against the lab", _session([_Item("a"), _Item("b")], targets="lab"), 0),
        ("xdist's workers run them", _session([_Item("a"), _Item("b")], numprocesses=2), 0),
        ("--maxfail", _session([_Item("a"), _Item("b")], maxfail=1), 0),
        ("--pdb", _session([_Item("a"), _Item("b")], usepdb=True), 0),
        ("--trace", _session([_Item("a"), _Item("b")], trace=True), 0),
        ("--setup-only", _session([_Item("a"), _Item("b")], setuponly=True), 0),
        ("a control of no host", _session([_Item("a"), _Item(None)]), 0),
    ],
)
def test_forks_only_where_nothing_can_differ(monkeypatch, why, session, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(forks.threading, "active_count", lambda: 1)  # an xdist worker has its own
    assert forks.wanted(session, lambda item: item.host) == expected, why


def test_no_fork_while_another_thread_runs(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(forks.threading, "active_count", lambda: 2)
    assert forks.wanted(_session([_Item("a"), _Item("b")]), lambda item: item.host) == 0


def test_a_host_s_controls_stay_in_one_share_and_the_shares_are_even():
    items = [_Item(h) for h in "aaaabbbccd"]
    found = forks.shares(items, lambda item: item.host, 2)
    assert sorted(found) == [[0, 1, 2, 3, 9], [4, 5, 6, 7, 8]]
    assert forks.shares(items, lambda item: item.host, 9) == [[0, 1, 2, 3], [4, 5, 6], [7, 8], [9]]


def test_the_suite_s_loop_shares_its_controls_where_forks_are_wanted(monkeypatch):
    from tests.compliance import conftest  # noqa: PLC0415

    calls = []
    monkeypatch.setattr(forks, "run", lambda session, count, hosts_of: calls.append((session, count, hosts_of)) or True)
    session = object()
    monkeypatch.setattr(forks, "wanted", lambda _session, _hosts_of: 2)
    assert conftest.pytest_runtestloop(session) is True
    assert calls == [(session, 2, conftest.item_host)]
    monkeypatch.setattr(forks, "wanted", lambda _session, _hosts_of: 1)
    assert conftest.pytest_runtestloop(session) is None  # pytest's own loop
    assert len(calls) == 1


def test_a_control_s_host_is_its_inventory_name():
    import testinfra  # noqa: PLC0415

    from tests.compliance import conftest  # noqa: PLC0415

    item = SimpleNamespace(
        callspec=SimpleNamespace(params={"_testinfra_host": testinfra.get_host("ssh://lab-deb12~3")})
    )
    assert conftest.item_host(item) == "lab-deb12~3"
    assert conftest.item_host(SimpleNamespace()) is None
