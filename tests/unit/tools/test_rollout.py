"""Gated rollouts (tools/rollout.py, tools/rollout_plan.py): batch sizes and the failure budget
as Ansible's serial and max_fail_percentage, the state a rollout resumes from, the loop's
decisions, the table, and the per-host outcome read from pyinfra and the suite's JUnit."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sparkrig.tools import rollout, rollout_plan
from sparkrig.tools.rollout import Options, Steps, converge, proof_outcomes, run_batches
from sparkrig.tools.rollout_plan import (
    FAILED,
    PENDING,
    PROVEN,
    Amount,
    HostState,
    State,
    load,
    over_budget,
    parse_amount,
    plan,
    save,
    table,
)
from tests.support import REPO

HOSTS = ["s1", "s2", "s3", "s4", "s5"]


# --- options, batches, budget ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "budget", "amount"),
    [
        ("2", False, Amount(count=2)),
        ("25%", False, Amount(percent=25)),
        ("100%", False, Amount(percent=100)),
        ("0", True, Amount(count=0)),
        ("0%", True, Amount(percent=0)),
        ("10%", True, Amount(percent=10)),
        ("1", True, Amount(count=1)),
    ],
)
def test_sizes_and_budgets_parse(text, budget, amount):
    assert parse_amount(text, "--x", budget) == amount


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("0", False),
        ("0%", False),
        ("101%", False),
        ("-1", False),
        ("1.5", False),
        ("25 %", False),
        ("", False),
        ("150%", True),
        ("-1", True),
        ("10%%", True),
        ("one", True),
        ("01", True),
    ],
)
def test_bad_sizes_and_budgets_are_one_error_naming_the_option(text, budget):
    with pytest.raises(ValueError, match=r"^--x '.*': expected a number of hosts \((0|1) or more\) or a share"):
        parse_amount(text, "--x", budget)


def test_a_count_is_hosts_and_a_share_rounds_down_but_never_to_zero():
    assert plan(HOSTS, Amount(count=2)) == [["s1", "s2"], ["s3", "s4"], ["s5"]]
    assert plan(HOSTS, Amount(percent=50)) == [["s1", "s2"], ["s3", "s4"], ["s5"]]  # 2.5 -> 2
    assert plan(HOSTS, Amount(percent=10)) == [[h] for h in HOSTS]  # 0.5 -> 0 -> 1
    assert plan(HOSTS, Amount(percent=100)) == [HOSTS]
    assert plan(HOSTS[:3], Amount(percent=66)) == [["s1"], ["s2"], ["s3"]]  # 1.98 -> 1


def test_the_canary_goes_alone_first_and_shares_are_of_all_hosts():
    # Ansible's serial: [1, "50%"]: 50% of the five hosts is 2, after the canary.
    assert plan(HOSTS, Amount(percent=50), Amount(count=1)) == [["s1"], ["s2", "s3"], ["s4", "s5"]]
    assert plan(HOSTS, Amount(count=10), Amount(percent=40)) == [["s1", "s2"], ["s3", "s4", "s5"]]
    assert plan(HOSTS[:1], Amount(count=2), Amount(count=3)) == [["s1"]]
    assert plan([], Amount(count=1), Amount(count=1)) == []


@pytest.mark.parametrize(
    ("failed", "size", "budget", "stops"),
    [
        (0, 1, "0", False),
        (1, 1, "5", True),  # every host of a batch failed: stops whatever the budget
        (1, 2, "1", False),
        (2, 3, "1", True),
        (2, 3, "2", False),
        (1, 3, "0", True),
        (1, 4, "25%", False),
        (1, 4, "24%", True),  # a share is compared exactly: more than it stops
        (2, 4, "50%", False),
        (2, 4, "49%", True),
        (1, 3, "33%", True),
        (1, 3, "34%", False),
        (1, 10, "0%", True),
        (9, 10, "100%", False),
        (10, 10, "100%", True),
    ],
)
def test_a_batch_stops_the_rollout_when_its_failures_are_over_the_budget(failed, size, budget, stops):
    assert over_budget(failed, size, parse_amount(budget, "--max-fail", budget=True)) is stops


def _not_loaded_inventory(tmp_path: Path) -> tuple[Path, Path]:
    loads = tmp_path / "loads"
    inventory = tmp_path / "fleet.py"
    inventory.write_text(
        f"open({str(loads)!r}, 'a').write('loaded\\n')\n"
        'hosts = [("sparkrig-rollout-test.invalid", {"ssh_connect_timeout": 2})]\n'
    )
    return inventory, loads


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--batch", "0"],
            "rollout: --batch '0': expected a number of hosts (1 or more) or a share of the hosts "
            "(1% to 100%), e.g. 2 or 25%\n",
        ),
        (
            ["--max-fail", "150%"],
            "rollout: --max-fail '150%': expected a number of hosts (0 or more) or a share of a "
            "batch (0% to 100%), e.g. 1 or 10%\n",
        ),
        (["--canary", "x"], None),
    ],
)
def test_bad_options_stop_before_the_inventory_is_even_loaded(tmp_path, args, error):
    inventory, loads = _not_loaded_inventory(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkrig.tools",
            "rollout",
            str(inventory),
            *args,
            "--state",
            str(tmp_path / "state" / "r.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == (error or result.stderr) and result.stderr.count("\n") == 1, result.stderr
    assert not loads.exists()  # no host contacted: pyinfra never even read the inventory


def test_a_relative_inventory_is_the_callers_for_the_hosts_and_the_batches(tmp_path, monkeypatch):
    """The rollout reads its hosts from INVENTORY and deploys each batch with INVENTORY: a
    relative path is the caller's, for both (the batch runs from the repository, where the
    same relative name is another file or none). The inventory notes each load of it; its
    host's name does not resolve (.invalid), so the batch fails without reaching anything."""
    _inventory, loads = _not_loaded_inventory(tmp_path)
    assert not (REPO / "fleet.py").exists()
    monkeypatch.chdir(tmp_path)
    state = tmp_path / "state" / "r.json"
    assert rollout.main(["fleet.py", "--state", str(state)]) == 1  # the host is unreachable
    # debug-inventory, then the batch's deploy: both loaded this file.
    assert loads.read_text().count("loaded") >= 2, loads.read_text()
    assert load(state).hosts["sparkrig-rollout-test.invalid"].status == FAILED


def test_rollout_options_go_anywhere_and_pyinfra_options_after_a_double_dash(monkeypatch):
    seen = []
    monkeypatch.setattr(rollout, "rollout", lambda options: seen.append(options) or 0)
    assert (
        rollout.main(
            [
                "inventory/lab.py",
                "--batch",
                "25%",
                "--limit",
                "debian12",
                "--canary",
                "1",
                "--max-fail",
                "10%",
                "--resume",
                "--",
                "--data",
                "a=1",
            ]
        )
        == 0
    )
    assert seen == [Options("inventory/lab.py", "25%", "1", "10%", ["debian12"], True, None, ["--data", "a=1"])]
    assert Options("i", " 2 ", None, "10%", [], True, None, []).given() == {
        "batch": "2",
        "canary": None,
        "max_fail": "10%",
    }


# --- the loop ---------------------------------------------------------------------------


class Fleet:
    """The loop's steps for unit tests: which hosts each step saw, and the hosts that fail
    it with why (the real steps run pyinfra and the suite: tests/converge/test_fleet_lab.py)."""

    def __init__(self, deploy_fails=None, control_fails=None, interrupt_on=None):
        self.deploy_fails, self.control_fails = deploy_fails or {}, control_fails or {}
        self.interrupt_on = interrupt_on
        self.converged: list[list[str]] = []
        self.proved: list[list[str]] = []

    def steps(self) -> Steps:
        return Steps(self._converge, self._prove)

    def _converge(self, hosts):
        if self.interrupt_on in hosts:
            raise KeyboardInterrupt
        self.converged.append(list(hosts))
        return {h: why for h, why in self.deploy_fails.items() if h in hosts}

    def _prove(self, hosts):
        self.proved.append(list(hosts))
        return {h: why for h, why in self.control_fails.items() if h in hosts}


def _state(batches, max_fail="0", canary="1") -> State:
    return State.new(
        "/inv.py",
        {"batch": "2", "canary": canary, "max_fail": max_fail},
        batches,
        {h: f"d-{h}" for b in batches for h in b},
    )


BATCHES = [["s1"], ["s2", "s3"], ["s4", "s5"]]


def test_each_batch_is_proven_before_the_next_and_a_budget_lets_one_failure_pass(tmp_path, capsys):
    fleet = Fleet(control_fails={"s2": "control test_swap.py::test_off[ssh://s2]: /swap.img in fstab"})
    state = _state(BATCHES, max_fail="1")
    assert run_batches(state, tmp_path / "r.json", fleet.steps()) == 1
    assert fleet.converged == BATCHES and fleet.proved == BATCHES
    assert [state.hosts[h].status for h in HOSTS] == [PROVEN, FAILED, PROVEN, PROVEN, PROVEN]
    assert state.stopped == ""
    assert "rollout: 4 of 5 hosts proven, the failed ones within the budget" in capsys.readouterr().err


def test_over_the_budget_the_rollout_stops_and_says_so(tmp_path, capsys):
    fleet = Fleet(
        deploy_fails={"s2": "deploy: Swap off: sparkrig: boom"},
        control_fails={"s3": "control test_x.py::test_y[ssh://s3]: wrong"},
    )
    state = _state(BATCHES, max_fail="1")
    assert run_batches(state, tmp_path / "r.json", fleet.steps()) == 1
    assert fleet.converged == BATCHES[:2] and fleet.proved == [["s1"], ["s3"]]  # s2 never reached the suite
    assert (
        state.stopped == "stopped after batch 2: 2 of its 2 hosts failed, over --max-fail 1 "
        "(every host of the batch failed)"
    )
    assert (state.hosts["s2"].converged, state.hosts["s3"].converged) == (False, True)
    assert [state.hosts[h].status for h in ("s4", "s5")] == [PENDING, PENDING]
    assert load(tmp_path / "r.json").stopped == state.stopped  # saved
    err = capsys.readouterr().err
    assert "rollout: stopped after batch 2" in err and "go on with --resume" in err


def test_a_failed_canary_stops_the_rollout_whatever_the_budget(tmp_path):
    fleet = Fleet(control_fails={"s1": "control test_x.py::test_y[ssh://s1]: wrong"})
    assert run_batches(_state(BATCHES, max_fail="50%"), tmp_path / "r.json", fleet.steps()) == 1
    assert fleet.converged == [["s1"]]


def test_resume_leaves_proven_hosts_alone_and_runs_the_rest(tmp_path):
    path = tmp_path / "r.json"
    state = _state(BATCHES)
    run_batches(state, path, Fleet(control_fails={"s2": "control t.py::t[ssh://s2]: x"}).steps())
    assert [state.hosts[h].status for h in HOSTS] == [PROVEN, FAILED, PROVEN, PENDING, PENDING]
    again = load(path)
    fleet = Fleet()
    assert run_batches(again, path, fleet.steps()) == 0
    assert fleet.converged == [["s2"], ["s4", "s5"]]  # s1 and s3 were proven: left alone
    assert all(again.hosts[h].status == PROVEN for h in HOSTS)


def test_ctrl_c_saves_where_it_was_and_resume_goes_on_from_there(tmp_path, capsys):
    path = tmp_path / "r.json"
    try:
        assert run_batches(_state(BATCHES), path, Fleet(interrupt_on="s4").steps()) == 130
    except KeyboardInterrupt:
        pytest.fail("Ctrl+C went through the rollout: nothing said where it stopped")
    saved = load(path)
    assert saved.stopped == "interrupted (Ctrl+C)"
    assert [saved.hosts[h].status for h in HOSTS] == [PROVEN, PROVEN, PROVEN, PENDING, PENDING]
    assert saved.hosts["s4"].why == "interrupted while converging"
    assert (
        "not started: s4 (interrupted while converging), s5 (interrupted while converging)" in capsys.readouterr().err
    )
    fleet = Fleet()
    assert run_batches(saved, path, fleet.steps()) == 0
    assert fleet.converged == [["s4", "s5"]]


# --- the state file ---------------------------------------------------------------------


def test_the_state_is_written_atomically_in_a_private_directory(tmp_path, monkeypatch):
    path = tmp_path / "state" / "r.json"
    save(_state(BATCHES), path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.read_text()
    changed = _state(BATCHES)
    changed.stopped = "something"

    def lost_controller(src, dst):
        raise OSError("the controller died before the rename")

    monkeypatch.setattr(rollout_plan.os, "replace", lost_controller)
    with pytest.raises(OSError):
        save(changed, path)
    assert path.read_text() == before  # the old state whole, no half-written new one
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # nor a temporary file left


def test_a_state_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="must be a directory of yours that no one else may write"):
        save(_state(BATCHES), shared / "r.json")


def test_the_default_state_is_the_callers_own_one_per_inventory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    one, two = rollout_plan.default_state_path("/a/fleet.py"), rollout_plan.default_state_path("/b/fleet.py")
    assert one.parent == tmp_path / "xdg" / "sparkrig" / "rollouts" and one != two
    monkeypatch.setenv("XDG_STATE_HOME", "relative/not/allowed")
    assert rollout_plan.default_state_path("/a/fleet.py").is_relative_to(Path.home())


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"inventory": "/other.py"}, "the saved rollout is of /inv.py, not /other.py: start afresh without --resume"),
        ({"hosts": ["s1", "s2", "s3", "s4"]}, "the saved rollout has other hosts (left out now: s5): start afresh"),
        ({"hosts": [*HOSTS, "s6"]}, "the saved rollout has other hosts (new: s6): start afresh"),
        ({"options": {"batch": "3"}}, "the saved rollout ran with --batch 2, not 3: resume with the same options"),
        ({"digests": {"s1": "new"}}, "the settings of proven hosts changed since the saved rollout (s1): start afresh"),
    ],
)
def test_a_state_of_another_rollout_is_refused_with_one_line(change, error):
    state = _state(BATCHES)
    state.hosts["s1"] = HostState(PROVEN, True)
    args = {
        "inventory": "/inv.py",
        "hosts": HOSTS,
        "digests": dict(state.digests),
        "options": {"batch": None, "canary": "1", "max_fail": None},
    }
    for key, value in change.items():
        args[key] = {**args[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ValueError) as raised:
        state.refuse_mismatch(args["inventory"], args["hosts"], args["digests"], args["options"])
    assert str(raised.value).startswith(error) and "\n" not in str(raised.value)


def test_a_host_not_yet_proven_may_change_its_settings_for_the_resume():
    state = _state(BATCHES)
    state.hosts["s1"] = HostState(PROVEN, True)
    state.refuse_mismatch("/inv.py", HOSTS, {**state.digests, "s2": "fixed"}, {})


def test_a_state_file_that_is_not_one_is_refused(tmp_path):
    path = tmp_path / "state" / "r.json"
    save(_state(BATCHES), path)
    path.write_text('{"version": 99}')
    with pytest.raises(ValueError, match="is not a rollout state this version reads"):
        load(path)
    with pytest.raises(ValueError, match="--resume: no saved rollout at"):
        load(path.with_name("none.json"))


# --- the table --------------------------------------------------------------------------


def test_the_table_counts_each_batch_and_says_why_hosts_failed():
    state = _state(BATCHES)
    state.hosts.update(
        s1=HostState(PROVEN, True),
        s2=HostState(FAILED, True, "control t.py::t[ssh://s2]: x"),
        s3=HostState(FAILED, False, "deploy: Swap off: sparkrig: boom"),
    )
    assert table(state) == "\n".join(
        [
            "batch       hosts  converged  rebooted  drained-out  proven  failed  not started",
            "1 (canary)  1      1          0         0            1       0       0",
            "2           2      1          0         0            0       2       0",
            "3           2      0          0         0            0       0       2",
            "failed:",
            "  s2 (batch 2): control t.py::t[ssh://s2]: x",
            "  s3 (batch 2): deploy: Swap off: sparkrig: boom",
            "not started: s4, s5",
        ]
    )


# --- the outcome of the real steps --------------------------------------------------------


def test_a_failed_control_fails_its_host_read_from_a_real_junit(tmp_path):
    """pytest's own JUnit of controls named as testinfra names them (its id first in the brackets),
    run over xdist's workers grouped as the suite groups a host's container controls (JUnit's
    name then ends in xdist's ``@GROUP``): the suite's own line still names what it found."""
    (tmp_path / "test_fake_controls.py").write_text(
        "import pytest\n"
        "@pytest.mark.xdist_group('h1-b/containers')\n"
        "@pytest.mark.parametrize('h', ['ssh://h1', 'ssh://h1-b', 'ssh://h2'])\n"
        "def test_swap_is_off(h):\n"
        "    assert h != 'ssh://h1-b', '/swap.img is in /etc/fstab'\n"
        "@pytest.mark.parametrize('h', ['ssh://h1', 'ssh://h1-b', 'ssh://h2'])\n"
        "@pytest.mark.parametrize('unit', ['cuda_env'])\n"
        "def test_env(unit, h):\n"
        "    pass\n"
    )
    junit = tmp_path / "j.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tmp_path / "test_fake_controls.py"),
            f"--junitxml={junit}",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "1",
            "--dist",
            "loadgroup",
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    output = (
        "failed controls:\n  h1-b: test_fake_controls.py::test_swap_is_off[ssh://h1-b]: /swap.img is in fstab\n"
        "============= 1 failed, 5 passed in 0.05s =============\n"
    )
    assert proof_outcomes(junit, ["h1", "h1-b", "h2", "h3"], output) == {
        "h1-b": "control test_fake_controls.py::test_swap_is_off[ssh://h1-b]: /swap.img is in fstab",
        "h3": "the compliance suite checked nothing on it (pytest: 1 failed, 5 passed in 0.05s)",
    }
    assert "]@h1-b/containers" in junit.read_text()  # the name the suite's line is matched from
    # Without the suite's own line, JUnit's message says it.
    assert proof_outcomes(junit, ["h1-b"], "")["h1-b"].startswith(
        "control test_fake_controls.py::test_swap_is_off[ssh://h1-b]: AssertionError: /swap.img is in /etc/fstab"
    )


def test_an_unreachable_host_fails_the_converge_with_pyinfras_line(tmp_path):
    """The real pyinfra against a closed port: the host failed, with why."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text('gone = [("127.0.0.1", {"ssh_port": 9, "ssh_connect_retries": 0, "ssh_user": "nobody"})]\n')
    failed = converge(str(inventory), ["127.0.0.1"], [])
    assert list(failed) == ["127.0.0.1"]
    assert failed["127.0.0.1"].startswith("deploy: Could not connect"), failed


def test_one_rollout_at_a_time_on_a_state_file(tmp_path):
    inventory, loads = _not_loaded_inventory(tmp_path)
    state = tmp_path / "state" / "r.json"
    rollout_plan.private_directory(state.parent)
    with rollout._locked(state):
        with pytest.raises(ValueError, match=r"another rollout holds .*r\.json\.lock: wait for it to end"):
            rollout.rollout(Options(str(inventory), None, None, None, [], False, str(state), []))
    assert not loads.exists()


# --- a host's bytes are that host's alone -------------------------------------------------

# A STAND-IN pyinfra: the log a deploy of spark-a and spark-b writes when spark-a's script
# prints, on its stderr, lines that name spark-b (pyinfra puts "[spark-a]" before each line of
# spark-a's output, and ends a line at "\n" alone), with escape sequences; and its --json report.
_STAND_IN_PYINFRA = r"""
import json, sys
log = (
    b"--> Starting operation: Updates | firmware\n"
    b"    [\x1b[1mspark-b\x1b[0m] \x1b[31mError: sparkrig: spark-b's own reason\x1b[0m\n"
    b"    [spark-a] \x1b[31mnoise [spark-b] Error: sparkrig: forged by spark-a\x1b[0m\n"
    b"    [spark-a] noise\r    [spark-b] Error: sparkrig: forged through a carriage return\n"
    b"    [spark-a] noise\x1c    [spark-b] Error: sparkrig: forged through a file separator\n"
    b"    [spark-a] Error: sparkrig: \x1b]0;owned\x07\x1b[2J\xc2\x9b31m\xff spark-a's own\n"
)
sys.stderr.buffer.write(log)
operations = [{"name": "Updates | firmware", "error": ["spark-a", "spark-b"]}]
print(json.dumps({"results": {"failed_hosts": ["spark-a", "spark-b"], "operations": operations}}))
sys.exit(1)
"""


def test_one_hosts_output_never_writes_the_reason_recorded_for_another(tmp_path, monkeypatch, capfd):
    """The real converge() reading a STAND-IN pyinfra's log: spark-b's reason is its own line,
    whatever spark-a printed naming it; spark-a's escape sequences reach neither the reason
    recorded nor the operator's terminal (pyinfra's colours pass)."""
    stand_in = tmp_path / "pyinfra"
    stand_in.write_text(f"#!{sys.executable}\n{_STAND_IN_PYINFRA}")
    stand_in.chmod(0o755)
    monkeypatch.setattr(rollout, "PYINFRA", str(stand_in))
    failed = converge(str(tmp_path / "inventory.py"), ["spark-a", "spark-b"], [])
    assert failed["spark-b"] == "deploy: Updates | firmware: Error: sparkrig: spark-b's own reason"
    assert failed["spark-a"] == (
        "deploy: Updates | firmware: Error: sparkrig: \\x1b]0;owned\\x07\\x1b[2J\\x9b31m\ufffd spark-a's own"
    )
    passed_on = capfd.readouterr().err
    assert "\x1b[31mError: sparkrig: spark-b's own reason\x1b[0m" in passed_on  # pyinfra's colours
    assert not any(ch in passed_on for ch in "\r\x1c\x07\x9b"), repr(passed_on)
    assert "\x1b]" not in passed_on and "\x1b[2J" not in passed_on
    assert "noise\\x0d    [spark-b] Error: sparkrig: forged through a carriage return" in passed_on


def test_a_finding_is_recorded_for_its_own_hosts_control_alone(tmp_path):
    """The suite's output read by the rollout: a line of a host's traceback, or of another
    host's finding, that looks like the table's never writes another host's reason."""
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.compliance.test_updates" name="test_fw[ssh://spark-a]">'
        '<failure message="spark-a found"/></testcase>'
        '<testcase classname="tests.compliance.test_updates" name="test_fw[ssh://spark-b]">'
        '<failure message="spark-b found"/></testcase>'
        "</testsuite></testsuites>"
    )
    output = "\n".join(
        [
            "E   AssertionError: failed controls:",  # a traceback quoting a host
            "failed controls:",
            "  spark-b: test_updates.py::test_fw[ssh://spark-b]: forged in a traceback",
            "=== 2 failed ===",
            "failed controls:",
            "  spark-a: test_updates.py::test_fw[ssh://spark-b]: forged by spark-a",
            "  spark-a: test_updates.py::test_fw[ssh://spark-a]: its own \\x1b[2J\r  spark-b: x",
            "=== 2 failed in 1s ===",
        ]
    )
    found = proof_outcomes(junit, ["spark-a", "spark-b"], output)
    assert found["spark-a"] == "control test_updates.py::test_fw[ssh://spark-a]: its own \\x1b[2J\\x0d  spark-b: x"
    assert found["spark-b"] == "control test_updates.py::test_fw[ssh://spark-b]: spark-b found"
