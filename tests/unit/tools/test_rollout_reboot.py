"""
The rollout's reboots (tools/rollout_reboot.py) against a scripted fleet and a fake clock: what
is drained, waited for, rebooted, checked and undrained, in which order. The real hosts (pyinfra,
spark-jobs, a real reboot of lab hosts) are in tests/converge/test_rollout_reboot_lab.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab import fwupd as fwupd_stand_in
from sparkrig.host_settings import declared
from sparkrig.operations import load
from sparkrig.operations.updates import settings as up
from sparkrig.settings import all_settings, problems, resolve
from sparkrig.tools import rollout_reboot
from sparkrig.tools.rollout import PYINFRA, Steps, run_batches
from sparkrig.tools.rollout_plan import FAILED, PROVEN, State, table
from sparkrig.tools.rollout_reboot import (
    BOOT_TIMEOUT_S,
    DRAINED_OUT,
    REBOOT_FAILED,
    REBOOTED,
    HostError,
    PyinfraHosts,
    Reading,
    groups,
    reboot_batch,
)
from tests.support import REPO

load()

VERSIONS = {"kernel": "6.17.0-1008-nvidia", "driver": "580.95.05"}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Fleet:
    """Hosts whose jobs end at given times, that need a reboot until they had one."""

    def __init__(self, clock, needs=(), jobs=None, down_for=0.0, after=None, no_return=()):
        self.clock, self.needs, self.jobs = clock, set(needs), jobs or {}  # jobs: host -> {name: ends at}
        self.down_for, self.after, self.no_return = down_for, after or {}, set(no_return)
        self.boots = {h: 1 for h in ("a", "b", "c", "d")}
        self.up_at: dict[str, float] = {}
        self.log: list[tuple] = []

    def read(self, host):
        if self.clock() < self.up_at.get(host, 0) or (host in self.no_return and host in self.up_at):
            raise HostError("Could not connect")
        rebooted = self.boots[host] > 1
        reasons = ["/run/reboot-required exists"] if host in self.needs and not rebooted else []
        return Reading(
            f"boot-{host}-{self.boots[host]}", reasons, self.after.get(host, VERSIONS) if rebooted else VERSIONS
        )

    def drain(self, host, why):
        self.log.append(("drain", host, why))

    def running(self, host):
        return [name for name, end in self.jobs.get(host, {}).items() if self.clock() < end]

    def stop(self, host, jobs, wait):
        self.log.append(("stop", host, tuple(jobs)))
        self.jobs[host] = {}

    def reboot(self, host):
        self.log.append(("reboot", host, self.clock()))
        self.boots[host] += 1
        self.up_at[host] = self.clock() + self.down_for

    def undrain(self, host):
        self.log.append(("undrain", host, self.clock()))


def _settings(hosts, reboot="when-required", timeout=600, cluster=None, **more):
    return {
        h: declared(
            {
                "updates_reboot": reboot,
                "updates_drain_timeout": timeout,
                "cluster_name": (cluster or {}).get(h, ""),
                **more,
            }
        )
        for h in hosts
    }


def _run(hosts, fleet, settings, force=False):
    notes, said = [], []
    outcome = reboot_batch(
        hosts,
        settings,
        fleet,
        force,
        lambda *n: notes.append(n),
        said.append,
        clock=fleet.clock,
        sleep=fleet.clock.sleep,
    )
    return outcome, notes, said


def test_a_host_is_drained_its_jobs_waited_for_then_rebooted_checked_and_undrained():
    clock = Clock()
    fleet = Fleet(clock, needs={"a"}, jobs={"a": {"train": 42.0}})
    outcome, notes, said = _run(["a", "b"], fleet, _settings(["a", "b"], timeout=600))
    assert outcome == {"a": (REBOOTED, "boot id boot-a-1 -> boot-a-2")}
    assert [e[:2] for e in fleet.log] == [("drain", "a"), ("reboot", "a"), ("undrain", "a")]
    assert fleet.log[0][2] == "rollout: reboot (/run/reboot-required exists)"
    assert fleet.log[1][2] >= 42.0  # not before the job ended
    assert "a: waiting for 1 running job(s) (train), 600 s left of updates_drain_timeout" in said
    assert [n[:2] for n in notes] == [("a", "draining"), ("a", "rebooting"), ("a", REBOOTED)]


def test_updates_reboot_never_reads_and_touches_nothing():
    clock = Clock()
    fleet = Fleet(clock, needs={"a"})
    assert _run(["a"], fleet, _settings(["a"], reboot="never"))[0] == {}
    assert fleet.log == []


def test_a_drain_past_its_timeout_leaves_the_host_out_undrained_and_says_why():
    clock = Clock()
    fleet = Fleet(clock, needs={"a"}, jobs={"a": {"train": 10_000.0}})
    outcome, _, _ = _run(["a"], fleet, _settings(["a"], timeout=120))
    assert outcome["a"][0] == DRAINED_OUT
    assert outcome["a"][1] == (
        "reboot: drain timed out: 1 job(s) still running after updates_drain_timeout 120 s "
        "(train); left out, not rebooted, undrained (--force stops them; --resume tries again)"
    )
    assert [e[:2] for e in fleet.log] == [("drain", "a"), ("undrain", "a")]
    assert 120 <= fleet.log[1][2] < 130  # wall clock, polled every few seconds


def test_force_stops_the_jobs_after_the_timeout_and_reboots():
    clock = Clock()
    fleet = Fleet(clock, needs={"a"}, jobs={"a": {"train": 10_000.0}})
    outcome, _, _ = _run(["a"], fleet, _settings(["a"], timeout=120), force=True)
    assert outcome["a"][0] == REBOOTED
    assert [e[:2] for e in fleet.log] == [("drain", "a"), ("stop", "a"), ("reboot", "a"), ("undrain", "a")]


def test_a_cluster_is_drained_together_and_rebooted_one_node_at_a_time():
    clock = Clock()
    fleet = Fleet(clock, needs={"a", "b", "c"}, jobs={"b": {"nccl": 30.0}}, down_for=20.0)
    settings = _settings(["a", "b", "c"], cluster={"a": "duo", "b": "duo"})
    assert groups(["a", "b", "c"], settings) == [["a", "b"], ["c"]]
    outcome, _, _ = _run(["a", "b", "c"], fleet, settings)
    assert {h: o[0] for h, o in outcome.items()} == {"a": REBOOTED, "b": REBOOTED, "c": REBOOTED}
    steps = [e[:2] for e in fleet.log]
    assert steps[:2] == [("drain", "a"), ("drain", "b")]  # both drained before either reboots
    assert steps[2:6] == [("reboot", "a"), ("undrain", "a"), ("reboot", "b"), ("undrain", "b")]
    reboot_a, back_a, reboot_b = fleet.log[2][2], fleet.log[3][2], fleet.log[4][2]
    assert reboot_a >= 30.0 and back_a >= reboot_a + 20.0 and reboot_b >= back_a


def test_a_node_that_does_not_come_back_keeps_the_rest_of_its_cluster_up():
    clock = Clock()
    fleet = Fleet(clock, needs={"a", "b"}, no_return={"a"})
    outcome, _, _ = _run(["a", "b"], fleet, _settings(["a", "b"], cluster={"a": "duo", "b": "duo"}))
    assert outcome["a"][0] == REBOOT_FAILED
    assert outcome["a"][1].startswith(f"reboot: not back within {BOOT_TIMEOUT_S} s (Could not connect); left drained")
    assert outcome["b"] == (DRAINED_OUT, "reboot: left out, a of its cluster did not come back well; undrained")
    assert ("reboot", "b") not in [e[:2] for e in fleet.log] and ("undrain", "a") not in [e[:2] for e in fleet.log]


def test_a_host_back_with_another_kernel_than_expected_fails_and_stays_drained():
    clock = Clock()
    fleet = Fleet(clock, needs={"a"}, after={"a": {"kernel": "6.17.0-1007-nvidia", "driver": "580.95.05"}})
    outcome, _, _ = _run(["a"], fleet, _settings(["a"], updates_expected_kernel="6.17.0-1008-nvidia"))
    assert outcome["a"][0] == REBOOT_FAILED
    assert (
        "kernel 6.17.0-1007-nvidia is running, updates_expected_kernel is 6.17.0-1008-nvidia; left drained"
        in outcome["a"][1]
    )
    assert ("undrain", "a") not in [e[:2] for e in fleet.log]


def test_the_boot_is_known_by_a_new_boot_id_not_by_an_answer():
    """A host still answering on its old boot (the reboot not begun) is not taken as back."""
    clock = Clock()
    fleet = Fleet(clock, needs={"a"})
    fleet.reboot = lambda host: fleet.log.append(("asked", host, clock()))  # asked, never happens
    outcome, _, _ = _run(["a"], fleet, _settings(["a"]))
    assert outcome["a"] == (
        REBOOT_FAILED,
        f"reboot: not back within {BOOT_TIMEOUT_S} s (still the old boot); left drained",
    )


def test_the_rollout_fails_a_drained_out_host_proves_a_rebooted_one_and_the_table_says_which(tmp_path):
    state = State.new("/inv.py", {"batch": "2", "canary": "", "max_fail": "1"}, [["a", "b"]], {"a": "x", "b": "y"})
    proved = []

    def reboot(hosts, note):
        for host in hosts:
            note(host, "draining", "")
        note("a", REBOOTED, "")
        note("b", DRAINED_OUT, "why b")
        return {"a": (REBOOTED, "boot id 1 -> 2"), "b": (DRAINED_OUT, "reboot: drain timed out: ...")}

    steps = Steps(lambda hosts: {}, lambda hosts: proved.append(list(hosts)) or {}, reboot, lambda hosts: None)
    assert run_batches(state, tmp_path / "r.json", steps) == 1
    assert proved == [["a"]]  # b never reached the suite
    assert (state.hosts["a"].status, state.hosts["a"].reboot) == (PROVEN, REBOOTED)
    assert (state.hosts["b"].status, state.hosts["b"].reboot) == (FAILED, DRAINED_OUT)
    assert table(state).splitlines()[:2] == [
        "batch  hosts  converged  rebooted  drained-out  proven  failed  not started",
        "1      2      2          1         1            1       1       0",
    ]


def test_a_resumed_host_left_drained_by_a_stopped_rollout_is_undrained(tmp_path):
    state = State.new("/inv.py", {"batch": "1", "canary": "", "max_fail": "0"}, [["a"]], {"a": "x"})
    state.hosts["a"].reboot = "rebooting"  # the controller was lost mid-reboot
    undrained = []
    steps = Steps(lambda hosts: {}, lambda hosts: {}, lambda hosts, note: {}, undrained.extend)
    assert run_batches(state, tmp_path / "r.json", steps) == 0
    assert undrained == ["a"] and state.hosts["a"].reboot == ""


def test_a_host_drained_out_before_and_needing_no_reboot_now_is_counted_proven_alone(tmp_path):
    state = State.new("/inv.py", {"batch": "1", "canary": "", "max_fail": "0"}, [["a"]], {"a": "x"})
    state.hosts["a"].reboot, state.hosts["a"].status = DRAINED_OUT, FAILED  # its job has ended since
    steps = Steps(lambda hosts: {}, lambda hosts: {}, lambda hosts, note: {}, lambda hosts: None)
    assert run_batches(state, tmp_path / "r.json", steps) == 0
    assert (state.hosts["a"].status, state.hosts["a"].reboot) == (PROVEN, "")
    assert table(state).splitlines()[1] == "1      1      1          0         0            1       0       0"


@pytest.mark.parametrize("value", [59, 604801, "60", None])
def test_the_drain_timeout_is_bounded(value):
    assert len(problems(up.SETTINGS, {"updates_drain_timeout": value})) == 1


# --- the real reading: pyinfra's CLI on this machine (@local, read-only) -------------------


def test_the_reading_is_pyinfras_own_facts_of_the_host():
    """tools.rollout_reboot reads a host through `pyinfra --limit HOST INVENTORY fact ...`, its
    output parsed from pyinfra's log: here the machine the tests run on, through inventory/local.py
    (facts only, nothing changes). The lab runs the same against lab hosts, reboots included."""
    remote = PyinfraHosts(PYINFRA, str(REPO), str(REPO / "inventory" / "local.py"))
    reading = remote.read("@local")
    assert reading.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert reading.versions["kernel"] == os.uname().release
    assert ("/run/reboot-required exists" in reading.reasons) == Path("/run/reboot-required").exists()


def test_a_host_pyinfra_cannot_read_is_a_host_error():
    remote = PyinfraHosts(PYINFRA, str(REPO), str(REPO / "inventory" / "local.py"))
    with pytest.raises(HostError):
        remote.read("no-such-host")


def test_a_firmware_update_staged_for_the_next_boot_is_a_reason_to_reboot():
    """fwupd's reading is one of the rollout's reboot readings: an update staged for the next boot
    (its Firmware fact's ``reboot``) needs a reboot as /run/reboot-required does."""

    class Answers(PyinfraHosts):
        def __init__(self, firmware, cmdline=None):
            super().__init__(PYINFRA, str(REPO), "inventory.py")
            self.firmware = firmware
            self.cmdline = cmdline or {"running": ["ro"], "add": [], "remove": [], "loader": True, "generated": None}

        def _run(self, host, *args):
            facts = {
                "sparkrig.operations.updates.facts.BootId": "b1",
                "sparkrig.operations.updates.facts.Versions": {
                    "boot_kernels": ["6.1.0"],
                    "kernel": "6.1.0",
                    "reboot_required": False,
                },
                "sparkrig.operations.updates.facts.Firmware": self.firmware,
                "sparkrig.operations.updates.cmdline.KernelCmdline": self.cmdline,
            }
            assert list(args[1:]) == list(facts), args
            text = "".join(f"--> Fact data for: {name}\n{json.dumps({host: value})}\n" for name, value in facts.items())
            return 0, text.splitlines(), text

    staged = {"fwupd": "ok", "devices": [], "reboot": "System Firmware 1.2 -> 1.3 waits for a reboot"}
    assert Answers(staged).read("spark-01").reasons == ["firmware: System Firmware 1.2 -> 1.3 waits for a reboot"]
    assert Answers({**staged, "reboot": ""}).read("spark-01").reasons == []
    # The kernel's command line: a drop-in asking what the running kernel did not boot with.
    pending = {"running": ["ro", "quiet"], "add": ["kho=off"], "remove": ["quiet"], "loader": True, "generated": None}
    assert Answers({**staged, "reboot": ""}, pending).read("spark-01").reasons == [
        "kernel command line: kho=off is not on it (/proc/cmdline)",
        "kernel command line: quiet is on it (/proc/cmdline)",
    ]
    booted = {**pending, "running": ["ro", "kho=off"]}
    assert Answers({**staged, "reboot": ""}, booted).read("spark-01").reasons == []


# --- a host's strings: that host's failure, never the run's ---------------------------------


class Scripted(PyinfraHosts):
    """The real PyinfraHosts (its reading, its drain and reboot commands) over a STAND-IN for
    pyinfra's CLI: each host's facts as ``pyinfra fact`` prints them, each command recorded as
    the argv subprocess would get, and answered with ``said`` lines."""

    def __init__(self, firmware: dict, said: dict | None = None):
        super().__init__(PYINFRA, str(REPO), "inventory.py")
        self.firmware, self.said = firmware, said or {}
        self.boots = {host: 1 for host in firmware}
        self.argvs: list[list[str]] = []

    def _run(self, host, *args):
        argv = [self.pyinfra, "-y", "--limit", host, self.inventory, *args]
        self.argvs.append(argv)
        if args[0] == "fact":
            facts = {
                "sparkrig.operations.updates.facts.BootId": f"boot-{self.boots[host]}",
                "sparkrig.operations.updates.facts.Versions": {
                    "boot_kernels": ["6.1.0"],
                    "kernel": "6.1.0",
                    "reboot_required": False,
                },
                "sparkrig.operations.updates.facts.Firmware": self.firmware[host] if self.boots[host] == 1 else {},
                "sparkrig.operations.updates.cmdline.KernelCmdline": {
                    "running": ["ro"],
                    "add": [],
                    "remove": [],
                    "loader": True,
                    "generated": None,
                },
            }
            text = "".join(f"--> Fact data for: {name}\n{json.dumps({host: value})}\n" for name, value in facts.items())
            return 0, text.split("\n"), text
        command = args[-1]
        if "systemctl reboot" in command:
            self.boots[host] += 1
        key = "running" if " running)" in command else command.split()[-1]
        lines = [f"[{host}] {line}" for line in self.said.get((host, key), [])]
        return 0, lines, "\n".join(lines)


def _hostile_firmware() -> dict:
    from sparkrig.operations.updates.facts import Firmware  # noqa: PLC0415
    from tests.unit.operations.test_host_strings import _fwupd_line  # noqa: PLC0415

    return Firmware().process([_fwupd_line(fwupd_stand_in.HOSTILE_DEVICES)])


def test_a_device_named_with_nul_and_esc_drains_and_reboots_its_host_with_clean_words(monkeypatch):
    """lab/fwupd.py's STAND-IN devices, read by the real Firmware parser (names escaped there):
    the node's reboot goes through, and no argument or message holds a NUL or an ESC."""
    clock = Clock()
    remote = Scripted({"a": _hostile_firmware(), "b": {"reboot": ""}})
    said: list[str] = []
    outcome = reboot_batch(
        ["a", "b"],
        _settings(["a", "b"], cluster={"a": "c1", "b": "c1"}),
        remote,
        False,
        lambda *n: None,
        said.append,
        clock=clock,
        sleep=clock.sleep,
    )
    assert outcome == {"a": (REBOOTED, "boot id boot-1 -> boot-2")}
    words = [word for argv in remote.argvs for word in argv] + said
    assert not [w for w in words if "\x00" in w or "\x1b" in w or "\x9b" in w], words
    assert any("System\\x00Firmware (needs-reboot)" in w for w in words if "drain --why" in w)


def test_a_hosts_unclean_strings_fail_that_host_naming_them_and_leave_its_cluster_undrained():
    """What pyinfra printed of a host's facts is checked again here: a NUL in the reboot reason
    (a fact that did not escape it), or an escape sequence in a job's name, fails that host
    with the field named; before, the NUL ended the rollout for every host, its cluster's
    healthy node left drained."""
    clock = Clock()
    unclean = {"fwupd": "read", "devices": [], "reboot": "fwupd: System\x00Firmware (pending)"}
    remote = Scripted({"a": unclean, "b": {"reboot": "fwupd: staged (pending)"}})
    outcome = reboot_batch(
        ["a", "b"],
        _settings(["a", "b"], cluster={"a": "c1", "b": "c1"}),
        remote,
        False,
        lambda *n: None,
        lambda message: None,
        clock=clock,
        sleep=clock.sleep,
    )
    kind, why = outcome["a"]
    assert kind == REBOOT_FAILED and "Firmware['reboot'] holds a control character" in why, why
    assert "\x00" not in why
    assert outcome["b"] == (REBOOTED, "boot id boot-1 -> boot-2")
    assert not [argv for argv in remote.argvs if argv[3] == "a" and argv[-2:-1] == ["--"]]  # a: nothing run

    remote = Scripted({"a": {"reboot": "fwupd: staged (pending)"}}, said={("a", "running"): ["job\x1b]0;owned\x07"]})
    outcome = reboot_batch(
        ["a"], _settings(["a"]), remote, False, lambda *n: None, lambda m: None, clock=clock, sleep=clock.sleep
    )
    kind, why = outcome["a"]
    assert kind == REBOOT_FAILED and "could not list its jobs" in why and "holds a control character" in why, why
    assert "\x1b" not in why


def test_the_running_jobs_are_the_commands_lines_never_sudos_own_warnings(tmp_path, monkeypatch):
    """On a host whose name does not resolve, sudo warns before it runs the command ("sudo: unable
    to resolve host ..."), on the output pyinfra hands back beside the command's: the drain counts
    only the lines of spark-jobs' own answer. Run through pyinfra's @local, its sudo a stand-in
    that warns as sudo does and then runs the command; spark-jobs a stand-in naming one job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sudo = bin_dir / "sudo"
    sudo.write_text(
        "#!/bin/sh\n"
        'echo "sudo: unable to resolve host r2: Name or service not known" >&2\n'
        'while [ "${1#-}" != "$1" ]; do shift; done\n'
        'exec "$@"\n'
    )
    jobs = bin_dir / "spark-jobs"
    jobs.write_text('#!/bin/sh\n[ "$1" = running ] && echo train-42\n')
    for path in (sudo, jobs):
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(rollout_reboot.JOB_COMMANDS, "spark-jobs", str(jobs))
    remote = PyinfraHosts(PYINFRA, str(REPO), str(REPO / "inventory" / "local.py"))
    assert any("unable to resolve host" in line for line in remote.root("@local", "true"))
    assert remote.running("@local") == ["train-42"]
    jobs.write_text("#!/bin/sh\nexit 0\n")
    assert remote.running("@local") == []


def test_the_reboot_reads_the_settings_the_deploy_resolves():
    """The reboot groups hosts by ``cluster_name`` and reads ``updates_*`` from the resolution
    every deploy makes (each concern's declared default under the host's data, read-only), not
    from a resolver of its own: a host without a cluster has the cluster concern's own default."""
    data = {"updates_drain_timeout": 120, "updates_reboot": "when-required"}
    settings = declared(data)
    assert dict(settings) == resolve(all_settings(), data)
    assert settings["cluster_name"] == next(s.default for s in all_settings() if s.key == "cluster_name")
    with pytest.raises(TypeError):
        settings["updates_reboot"] = "never"  # type: ignore[index]


def test_running_jobs_are_read_through_pyinfras_padded_host_prefix():
    """pyinfra pads ``[HOST]`` to the inventory's longest host name (pyinfra.api.host's
    print_prefix_padding): in the lab's whole fleet (lab-deb12-b beside lab-deb12) each job
    line came as ``[lab-deb12]   sparkrig-job NAME``, and the rollout saw no job and
    rebooted the host under it. Lines as that run printed them."""

    class Padded(PyinfraHosts):
        def __init__(self, padding: str):
            super().__init__(PYINFRA, str(REPO), "inventory.py")
            self.padding = padding

        def _run(self, host, *args):
            text = (
                "--> Starting operation: server.shell (jobs=...)\n"
                f"[{host}]{self.padding} sudo: unable to resolve host {host}: Name or service not known\n"
                f"[{host}]{self.padding} sparkrig-job hold-1\n"
                f"[{host}]{self.padding} sparkrig-job train.2\n"
                f"    [{host}]{self.padding} Success\n"
            )
            return 0, text.split("\n"), text

    for padding in ("", "  ", "     "):
        assert Padded(padding).running("lab-deb12") == ["hold-1", "train.2"], padding
