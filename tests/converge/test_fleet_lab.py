"""
Fleets in the lab: the five hosts of every flavour, faults that stay on one host, and drift the
compliance suite finds and the next converge fixes (a box reprovisioned from scratch:
tests/converge/test_cluster_lab.py, a cluster node reinstalled).

The fault tests work on the "-b" hosts (lab-deb12-b, lab-deb13-b) and leave every host
converged, so the compliance suite that runs after them checks the whole fleet again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

import lab
from lab import dgxos
from sparkrig.operations.sshd_guard.operations import DROPIN_NAME
from sparkrig.tools import check
from tests.compliance.conftest import host_of
from tests.conftest import LAB_INVENTORY
from tests.support import PYINFRA, REPO, DeployResult, host_table, run_deploy

pytestmark = pytest.mark.lab

FLEET = {name for name, _flavour in lab.DEFAULT_FLEET}


@dataclass
class SuiteRun:
    """One run of the compliance suite in its own pytest: exit code, output, and each
    host's controls with their outcome (from its JUnit XML)."""

    returncode: int
    output: str
    outcomes: dict[str, dict[str, str]]

    def failed(self, host: str) -> set[str]:
        return {control for control, outcome in self.outcomes[host].items() if outcome == "failed"}


def run_suite(tmp_path: Path, *args: str) -> SuiteRun:
    """``sparkrig check inventory/lab.py --junitxml ...``, as a user runs it (pytest's options after --)."""
    junit = tmp_path / f"compliance-{time.monotonic_ns()}.xml"
    result = subprocess.run(
        check.command(LAB_INVENTORY, junitxml=str(junit), extra=["-q", "-rfs", *args]),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    outcomes: dict[str, dict[str, str]] = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            target = host_of(f"x::{case.get('name', '')}", FLEET)
            if target is None:
                continue
            control = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name').split('[')[0]}"
            outcome = (
                "failed"
                if case.find("failure") is not None or case.find("error") is not None
                else "skipped"
                if case.find("skipped") is not None
                else "passed"
            )
            outcomes.setdefault(target, {})[control] = outcome
    return SuiteRun(result.returncode, result.stdout + result.stderr, outcomes)


def _assert_converged(result: DeployResult, hosts: set[str]) -> None:
    assert result.returncode == 0, result.log
    assert result.errors() == {}, result.log
    assert result.hosts() == hosts


# --- the whole fleet ------------------------------------------------------------------


def test_the_fleet_passes_the_read_only_suite_run_through_its_inventory_without_workers(first_converge, tmp_path):
    """Every host of the inventory, read side by side, its controls shared between the run's
    process and forks of it (a read-only run starts no xdist workers: tests/compliance/forks.py),
    with the verdict of the same run in one process (--forks 0). The controls that act run in
    workers in the rollouts' and the drift's runs below, and on every host in the session's own
    suite at the end: not a third time here."""
    assert first_converge.returncode == 0, first_converge.log
    suite = run_suite(tmp_path, "-m", "not action")
    assert suite.returncode == 0, suite.output[-6000:]
    assert set(suite.outcomes) == FLEET
    for host, controls in suite.outcomes.items():
        assert not suite.failed(host)
        assert sum(o == "passed" for o in controls.values()) >= 40, (host, controls)
    assert "bringing up nodes" not in suite.output, suite.output[:2000]
    table = host_table(suite.output)
    assert FLEET <= {line.split()[0] for line in table if line[:1].strip()}, table
    alone = run_suite(tmp_path, "-m", "not action", "--forks", "0")
    assert alone.outcomes == suite.outcomes
    assert host_table(alone.output)[: len(FLEET) + 1] == table[: len(FLEET) + 1]


# The gated rollout's hosts: in the inventory's order (that of the default fleet, and of a lab
# booted with these three), so --canary 1 --batch 50% makes three batches of one, the faulty
# host the second.
ROLLOUT_HOSTS = ["lab-deb12", "lab-deb12-b", "lab-deb13-b"]
ROLLOUT_FAULTY = "lab-deb12-b"


def test_a_gated_rollout_stops_at_a_host_failing_a_control_and_resume_finishes_the_rest(first_converge, tmp_path):
    """--canary 1 --batch 50% --max-fail 1 over three hosts: the second converges, then drifts
    (a FAULT: swap back in its fstab, by tests/converge/rollout_fault.py in the suite that proves
    it), fails its swap control, and, every host of its batch failed, stops the rollout before
    the third. --resume, the fault gone, leaves the proven canary alone and finishes."""
    state = tmp_path / "rollout-state" / "lab.json"
    command = [
        sys.executable,
        "-m",
        "sparkrig.tools",
        "rollout",
        LAB_INVENTORY,
        "--limit",
        ",".join(ROLLOUT_HOSTS),
        "--canary",
        "1",
        "--batch",
        "50%",
        "--max-fail",
        "1",
        "--state",
        str(state),
    ]
    fault = {
        "PYTEST_ADDOPTS": "-p tests.converge.rollout_fault",
        "SPARKRIG_TEST_FAULT_HOST": ROLLOUT_FAULTY,
        # The fault goes in as the suite starts; a read sent before it (early.py) would miss it.
        "SPARKRIG_COMPLIANCE_EARLY": "0",
    }
    swap_control = f"control test_swap.py::test_fstab_has_no_active_swap_entry[ssh://{ROLLOUT_FAULTY}]"
    resumed = None
    try:
        first = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=1500, env={**os.environ, **fault}
        )
        assert first.returncode == 1, first.stderr[-6000:]
        assert "rollout: 3 hosts in 3 batches (1, 1, 1 hosts), --max-fail 1 per batch" in first.stderr
        assert "rollout: batch 1/3 (canary): lab-deb12\n" in first.stderr
        assert "rollout: batch 2/3: lab-deb12-b\n" in first.stderr
        assert "batch 3/3" not in first.stderr
        table = first.stderr[first.stderr.index("\nbatch ") :]
        assert table.splitlines()[1:4] == [
            "batch       hosts  converged  rebooted  drained-out  proven  failed  not started",
            "1 (canary)  1      1          0         0            1       0       0",
            "2           1      1          0         0            0       1       0",
        ], table
        assert f"  {ROLLOUT_FAULTY} (batch 2): {swap_control}" in table, table
        assert "not started: lab-deb13-b" in table
        assert (
            "rollout: stopped after batch 2: 1 of its 1 hosts failed, over --max-fail 1 "
            "(every host of the batch failed); fix it, then go on with --resume"
        ) in first.stderr

        resumed = subprocess.run([*command, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=1500)
        assert resumed.returncode == 0, resumed.stderr[-6000:]
        assert (
            "rollout: resuming" in resumed.stderr
            and ": 1 proven, 1 failed, 0 converged, 1 not started" in resumed.stderr
        )
        assert "rollout: batch 1/3 (canary): proven before (lab-deb12)" in resumed.stderr
        # The canary was neither deployed to nor checked again: pyinfra never named it, nor the suite's table.
        assert "[lab-deb12]" not in resumed.stderr
        assert not re.search(r"^lab-deb12 +\d", resumed.stderr, re.MULTILINE)
        assert "rollout: all 3 hosts converged and proven" in resumed.stderr
        assert "\n3           1      1          0         0            1       0       0" in resumed.stderr
    finally:
        if resumed is None or resumed.returncode != 0:  # the fault stays on no host
            run_deploy(LAB_INVENTORY, "--limit", ROLLOUT_FAULTY)


# --- one host's fault stays on that host ------------------------------------------------


def test_an_unreachable_host_is_reported_the_others_finish_and_a_rerun_converges_it(first_converge, tmp_path):
    down = "lab-deb12-b"
    lab.kill(down)
    try:
        result = run_deploy(LAB_INVENTORY)
        assert result.returncode != 0
        assert result.hosts() == FLEET - {down}, result.log
        assert result.errors() == {} and result.changed() == {}, result.log
        assert down in result.log and "Could not connect" in result.log, result.log[-3000:]

        rollout = subprocess.run(
            [
                sys.executable,
                "-m",
                "sparkrig.tools",
                "rollout",
                LAB_INVENTORY,
                "--limit",
                f"{down},lab-deb13-b",
                "--state",
                str(tmp_path / "r" / "s.json"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert rollout.returncode == 1
        assert f"\n  {down} (batch 1): deploy: Could not connect" in rollout.stderr, rollout.stderr[-3000:]
        assert "not started: lab-deb13-b" in rollout.stderr
        assert "rollout: stopped after batch 1: 1 of its 1 hosts failed, over --max-fail 0" in rollout.stderr
        assert "batch 2/2" not in rollout.stderr
    finally:
        lab.restart(down)
    _assert_converged(run_deploy(LAB_INVENTORY, "--limit", down), {down})


STANDIN_NVIDIA_SMI = "/usr/local/bin/nvidia-smi"


def test_a_box_that_contradicts_its_profile_stops_before_anything_changes(first_converge):
    """The lab's hosts have no GPU: a STAND-IN nvidia-smi (named as such, removed after)
    reports an sm_120 card, as an RTX 50xx box's does, and answers other queries (the version
    report's driver_version) as nvidia-smi does without a driver."""
    host = "lab-deb13-b"
    script = dgxos.nvidia_smi_standin("12.0, sparkrig-lab stand-in GPU")
    lab.run_ssh(host, f"sudo tee {STANDIN_NVIDIA_SMI} >/dev/null && sudo chmod 755 {STANDIN_NVIDIA_SMI}", input=script)
    try:
        wrong = run_deploy(LAB_INVENTORY, "--limit", host, "--data", "hardware_profile=hopper")
        assert wrong.returncode != 0
        assert "--> Starting operation: Hardware profile | The box is the hardware its profile says" in wrong.log, (
            wrong.log
        )
        assert (
            "hardware_profile 'hopper' says compute capability 9.0, but the box is x86_64, "
            "GPU sparkrig-lab stand-in GPU (12.0)"
        ) in wrong.log
        # The first operation failed the only host (pyinfra: "No hosts remaining!"), so no
        # other ran: had the hopper profile changed anything (its arch list 9.0 in the CUDA
        # env file), the run with the host's own profile would change it back.
        assert "No hosts remaining" in wrong.log
        _assert_converged(same := run_deploy(LAB_INVENTORY, "--limit", host), {host})
        assert same.changed() == {}, same.log

        auto = run_deploy(LAB_INVENTORY, "--limit", host, "--data", "hardware_profile=auto")
        # "auto" reads the box and takes rtx50, the profile it was converged with: no change.
        _assert_converged(auto, {host})
        assert auto.changed() == {}, auto.log
    finally:
        lab.run_ssh(host, f"sudo rm -f {STANDIN_NVIDIA_SMI}")


# Holds dpkg's frontend lock as apt does (a POSIX record lock), the way unattended-upgrades
# holds it for minutes after a fresh boot.
HOLD_DPKG_LOCK = (
    "import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'w'); fcntl.lockf(f, fcntl.LOCK_EX); time.sleep(900)"
)


def test_a_held_dpkg_lock_fails_that_host_after_a_bounded_wait(first_converge):
    host = "lab-deb13-b"
    unit = "sparkrig-test-holds-dpkg-lock"
    # A package the deploy must install again.
    lab.run_ssh(host, "sudo DEBIAN_FRONTEND=noninteractive apt-get -q -y remove earlyoom >/dev/null")
    lab.run_ssh(
        host,
        f"sudo systemd-run --unit={unit} --description='stand-in for unattended-upgrades' "
        f"python3 -c {shlex.quote(HOLD_DPKG_LOCK)}",
    )
    try:
        started = time.monotonic()
        # With a neighbour, which must finish: the lock is held on one box only.
        result = run_deploy(
            LAB_INVENTORY, "--limit", host, "--limit", "lab-deb13", "--data", "packages_dpkg_lock_timeout_s=5"
        )
        assert result.returncode != 0
        # The install failed; pyinfra lists the operations the failed host then skipped too.
        assert list(result.errors()) == [host], result.log
        assert result.errors()[host][0] == "Memory watchdog | Install earlyoom", result.log
        assert "lab-deb13" in result.hosts() and "lab-deb13" not in result.changed(), result.log
        assert "/var/lib/dpkg/lock-frontend is held by process" in result.log
        assert "(python3), still after 5 s (packages_dpkg_lock_timeout_s)" in result.log
        assert time.monotonic() - started < 120
    finally:
        lab.run_ssh(host, f"sudo systemctl stop {unit}", check=False)
    rerun = run_deploy(LAB_INVENTORY, "--limit", host)
    _assert_converged(rerun, {host})
    assert "Memory watchdog | Install earlyoom" in rerun.changed()[host]
    _assert_converged(run_deploy(LAB_INVENTORY, "--limit", host), {host})


def test_a_host_killed_mid_deploy_converges_on_the_next_run_with_no_half_written_file(first_converge, tmp_path):
    host = "lab-deb12-b"
    lab.recreate(host)  # a fresh box: a whole deploy's work to interrupt
    deploy = subprocess.Popen(
        [PYINFRA, "-y", "--json", LAB_INVENTORY, "deploy.py"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Cut the power while dpkg is unpacking on it (the worst moment for a package manager).
        deadline = time.monotonic() + 900
        while lab.run_ssh(host, "pgrep -x dpkg", check=False, timeout=30).returncode != 0:
            assert deploy.poll() is None, "the deploy ended before dpkg ran on " + host
            assert time.monotonic() < deadline, "dpkg never ran on " + host
            time.sleep(0.3)
        lab.kill(host)
        out, err = deploy.communicate(timeout=1800)
    finally:
        deploy.kill()

    result = DeployResult(deploy.returncode, json.loads(out) if out.strip() else None, err)
    assert result.returncode != 0
    others = FLEET - {host}
    assert not set(result.errors()) & others, result.log
    assert result.hosts() >= others

    lab.restart(host)
    rerun = run_deploy(LAB_INVENTORY, "--limit", host)
    _assert_converged(rerun, {host})
    leftovers = lab.run_ssh(host, "sudo find / -xdev -name '.*.sparkrig-new' -print").stdout
    assert leftovers == "", f"half-written files remain: {leftovers}"
    assert lab.run_ssh(host, "sudo dpkg --audit").stdout.strip() == ""
    _assert_converged(run_deploy(LAB_INVENTORY, "--limit", host), {host})
    suite = run_suite(tmp_path, "--limit", host)
    assert suite.returncode == 0, suite.output[-6000:]
    assert set(suite.outcomes) == {host}


# --- drift ------------------------------------------------------------------------------

DRIFT = "lab-deb12-b"  # Debian 12: ssh.service; DGX OS's starting state (Debian's docker.io)
DROPIN = f"/etc/systemd/system/ssh.service.d/{DROPIN_NAME}"
REMOVE_NVIDIA_RUNTIME = (
    "import json; p = '/etc/docker/daemon.json'; d = json.load(open(p)); d['runtimes'].pop('nvidia'); "
    "d.pop('runtimes') if not d['runtimes'] else None; open(p, 'w').write(json.dumps(d, indent=2))"
)

# What the drift below must fail, and only that.
DRIFTED_CONTROLS = {
    "test_swap.py::test_fstab_has_no_active_swap_entry",
    "test_sshd_guard.py::test_sshd_unit_and_system_slice_reserve_memory",
    "test_containers.py::test_nvidia_runtime_is_registered",
    "test_containers.py::test_a_container_runs_with_the_nvidia_runtime",
}


def test_drift_fails_exactly_its_controls_and_one_converge_fixes_exactly_those(first_converge, tmp_path):
    # By hand, outside sparkrig: swap back in fstab, the SSH drop-in edited, the runtime removed.
    lab.run_ssh(DRIFT, "echo '/swap.img none swap sw 0 0' | sudo tee -a /etc/fstab >/dev/null")
    lab.run_ssh(DRIFT, f"sudo sed -i 's/^MemoryMin=.*/MemoryMin=1M/' {DROPIN} && sudo systemctl daemon-reload")
    lab.run_ssh(DRIFT, f"sudo python3 -c {shlex.quote(REMOVE_NVIDIA_RUNTIME)} && sudo systemctl restart docker")

    drifted = run_suite(tmp_path, "--limit", DRIFT)
    assert drifted.returncode != 0
    assert set(drifted.outcomes) == {DRIFT}
    assert drifted.failed(DRIFT) == DRIFTED_CONTROLS, drifted.output[-6000:]
    # The whole suite: its controls that act spread over xdist's workers (how many: tests/unit/tools/test_fleet.py).
    assert "bringing up nodes" in drifted.output, drifted.output[:2000]

    fixed = run_deploy(LAB_INVENTORY, "--limit", DRIFT)
    _assert_converged(fixed, {DRIFT})
    assert sorted(fixed.changed()[DRIFT]) == sorted(DRIFT_FIXES), fixed.log

    clean = run_suite(tmp_path, "--limit", DRIFT)
    assert clean.returncode == 0, clean.output[-6000:]
    assert not clean.failed(DRIFT)
    _assert_converged(run_deploy(LAB_INVENTORY, "--limit", DRIFT), {DRIFT})


# What the converge after that drift must change, and only that.
DRIFT_FIXES = [
    "Swap off | Swap off now and at every boot (fstab entries, swap and zram units)",
    "SSH guard | Reserve memory for sshd, keep its sessions killable",
    "Docker and the NVIDIA container toolkit | "
    "Register the nvidia runtime in /etc/docker/daemon.json (other keys kept)",
    "Docker and the NVIDIA container toolkit | Restart Docker: /etc/docker/daemon.json changed",
]
