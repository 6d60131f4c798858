"""
Reboots, drained, in the lab: the gated rollout (tools.rollout) reboots lab-deb12 and lab-deb13
(one cluster in the lab's inventory) for real, with updates_reboot = "when-required" given as
pyinfra's --data. A host with a pending reboot (/run/reboot-required) and a running detached job
is drained (spark-run refuses new jobs meanwhile), the job is waited for, the host reboots (the
lab boots it again: lab/fleet.py's boot loop), its boot id changes, it is checked and undrained,
the suite proves it. And a drain that outlasts updates_drain_timeout leaves its host out.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import lab
from sparkrig.operations.jobs.operations import DRAIN
from tests.conftest import LAB_INVENTORY
from tests.support import REPO

pytestmark = pytest.mark.lab

CLUSTER = ["lab-deb12", "lab-deb13"]
WHEN_REQUIRED = ["--data", "updates_reboot=when-required"]


def _boot_id(host: str) -> str:
    return lab.run_ssh(host, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def _rollout(tmp_path: Path, hosts: list[str], *data: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparkrig.tools.rollout",
            LAB_INVENTORY,
            "--limit",
            ",".join(hosts),
            "--batch",
            str(len(hosts)),
            "--state",
            str(tmp_path / "rollout-state" / "lab.json"),
            "--",
            *WHEN_REQUIRED,
            *data,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_drained(host: str, rollout: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while lab.run_ssh(host, f"test -e {DRAIN}", check=False).returncode != 0:
        assert rollout.poll() is None, f"the rollout ended before draining {host}:\n{rollout.stdout.read()}"
        assert time.monotonic() < deadline, f"{host} was not drained within {timeout} s"
        time.sleep(1)


class _Output:
    """The rollout's output, read as it comes (a thread), so that a test can act when the
    rollout says something, and show the rollout's own lines when it fails."""

    def __init__(self, rollout: subprocess.Popen):
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(rollout,), daemon=True)
        self._thread.start()

    def _read(self, rollout: subprocess.Popen) -> None:
        for line in rollout.stdout:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> str:
        with self._seen:
            found = self._seen.wait_for(
                lambda: any(line.startswith(prefix) for line in self.lines) or not self._thread.is_alive(), timeout
            )
            said = [line for line in self.lines if line.startswith(prefix)]
        assert found and said, f"the rollout never said {prefix!r} within {timeout} s:\n{self.said()}"
        return said[0]

    def text(self) -> str:
        self._thread.join(timeout=60)
        return "".join(self.lines)

    def said(self) -> str:
        """The rollout's own lines and its table (the suite's output left out)."""
        text = "".join(self.lines)
        table = text[text.find("batch  hosts") :] if "batch  hosts" in text else ""
        return "\n".join(line for line in text.splitlines() if line.startswith("rollout: ")) + "\n" + table


def _job_row(host: str, name: str) -> list[str] | None:
    for line in lab.run_ssh(host, "spark-jobs list").stdout.splitlines()[1:]:
        if line.split()[:1] == [name]:
            return line.split()
    return None


@pytest.fixture
def clean_cluster(first_converge):
    """The two hosts converged, not draining, no reboot pending, before and after."""
    assert first_converge.returncode == 0, first_converge.log

    def clean():
        for host in CLUSTER:
            lab.run_ssh(host, "sudo spark-jobs undrain >/dev/null; sudo rm -f /run/reboot-required")

    clean()
    yield
    clean()


def test_a_host_with_a_pending_reboot_and_a_running_job_is_drained_waited_for_rebooted_and_proven(
    clean_cluster, tmp_path
):
    job = f"hold-{time.monotonic_ns()}"
    before = {host: _boot_id(host) for host in CLUSTER}
    for host in CLUSTER:
        lab.run_ssh(host, "sudo touch /run/reboot-required")
    # The job ends when the test says so, after the rollout said it waits for it: a job of a
    # fixed length could end before a loaded machine's rollout lists it.
    release = f"{lab.run_ssh('lab-deb12', 'echo $HOME').stdout.strip()}/{job}.release"
    lab.run_ssh("lab-deb12", f"spark-run --detach {job} -- sh -c 'until test -e {release}; do sleep 1; done'")
    rollout = _rollout(tmp_path, CLUSTER, "--data", "updates_drain_timeout=300")
    output = _Output(rollout)
    try:
        _wait_drained("lab-deb12", rollout)
        refused = lab.run_ssh("lab-deb12", "spark-run -- true", check=False)
        assert refused.returncode == 75, refused
        assert re.fullmatch(
            r"spark-run: this host is draining since \S+ \S+ UTC \(rollout: reboot "
            r"\(/run/reboot-required exists\)\): it starts no new job until root runs spark-jobs undrain\n",
            refused.stderr,
        ), refused.stderr
        assert _job_row("lab-deb12", job)[2] == "active"  # the running job goes on
        output.wait_for(f"rollout: lab-deb12: waiting for 1 running job(s) ({job}), ", 600)
        lab.run_ssh("lab-deb12", f"touch {release}")
        rollout.wait(timeout=1200)
        out = output.text()
    finally:
        if rollout.poll() is None:
            rollout.kill()
        lab.run_ssh("lab-deb12", f"rm -f {release}", check=False)
    assert rollout.returncode == 0, output.said()
    lines = [line for line in out.splitlines() if line.startswith("rollout: lab-")]
    said = "\n".join(lines)
    # Drained together, the job waited for, then one node at a time: each back before the next goes down.
    assert lines[0].startswith("rollout: lab-deb12: draining (reboot (/run/reboot-required exists))"), said
    assert lines[1].startswith("rollout: lab-deb13: draining"), said
    assert lines[2].startswith(f"rollout: lab-deb12: waiting for 1 running job(s) ({job}), "), said
    assert [line.split(": ", 2)[1:] for line in lines[3:]] == [
        ["lab-deb12", f"rebooting (boot id {before['lab-deb12']})"],
        ["lab-deb12", lines[4].split(": ", 2)[2]],
        ["lab-deb13", f"rebooting (boot id {before['lab-deb13']})"],
        ["lab-deb13", lines[6].split(": ", 2)[2]],
    ], said
    after = {host: _boot_id(host) for host in CLUSTER}
    for host, line in zip(CLUSTER, (lines[4], lines[6])):
        assert after[host] != before[host]
        assert line.startswith(f"rollout: {host}: back after the reboot (boot id {after[host]}, kernel "), line
        assert line.endswith("): undraining"), line
        assert lab.run_ssh(host, f"test -e {DRAIN} || test -e /run/reboot-required", check=False).returncode == 1
    # The job ended by itself (exit 0), not stopped by the reboot.
    assert _job_row("lab-deb12", job)[2:3] == ["ended"] and _job_row("lab-deb12", job)[-1] == "0"
    assert (
        "batch  hosts  converged  rebooted  drained-out  proven  failed  not started\n"
        "1      2      2          2         0            2       0       0\n" in out
    ), output.said()
    assert "rollout: all 2 hosts converged and proven" in out
    assert lab.run_ssh("lab-deb12", "spark-run -- true").returncode == 0  # undrained: jobs start again
    lab.run_ssh("lab-deb12", f"spark-jobs forget {job}")


def test_a_drain_that_outlasts_updates_drain_timeout_leaves_the_host_out_undrained_and_reported(
    clean_cluster, tmp_path
):
    host, job = "lab-deb13", f"long-{time.monotonic_ns()}"
    before = _boot_id(host)
    lab.run_ssh(host, "sudo touch /run/reboot-required")
    lab.run_ssh(host, f"spark-run --detach {job} -- sleep 900")
    try:
        rollout = _rollout(tmp_path, [host], "--data", "updates_drain_timeout=60")
        output = _Output(rollout)
        rollout.wait(timeout=900)
        out = output.text()
        assert rollout.returncode == 1, output.said()
        assert (
            "batch  hosts  converged  rebooted  drained-out  proven  failed  not started\n"
            "1      1      1          0         1            0       1       0\n" in out
        ), output.said()
        assert (
            f"  {host} (batch 1): reboot: drain timed out: 1 job(s) still running after updates_drain_timeout "
            f"60 s ({job}); left out, not rebooted, undrained (--force stops them; --resume tries again)"
        ) in out
        assert _boot_id(host) == before
        assert _job_row(host, job)[2] == "active"
        assert lab.run_ssh(host, f"test -e {DRAIN}", check=False).returncode == 1  # undrained
    finally:
        lab.run_ssh(host, f"spark-jobs stop --wait 60 {job}; spark-jobs forget {job}", check=False)
