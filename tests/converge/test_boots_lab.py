"""
How every boot ended, in the lab: the updates concern keeps lab-deb12's journal across boots (its
journald drop-in written, validated on the host, a second run changes nothing), and the host's
real boots end three ways: rebooted by the rollout's own reboot command (tools/rollout_reboot.py,
through pyinfra: its mark logged as root, then `systemctl reboot`; nspawn exits 133 and the lab
boots it again), rebooted by hand (`systemctl reboot`), and killed from outside (lab.kill: SIGKILL
to its nspawn, then booted again). Before each, the lab's user forges the rollout's mark and a
reached reboot target with logger and logger --journald. `sparkrig report --json` classifies
the three boots, in order: rollout-reboot, reboot, power-lost; the compliance control passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import lab
from sparkrig.operations.updates import boots
from sparkrig.tools.rollout_reboot import PyinfraHosts
from tests.conftest import LAB_INVENTORY
from tests.support import PYINFRA, REPO, run_deploy

pytestmark = pytest.mark.lab

HOST = "lab-deb12"
DEPLOY = "tests/converge/updates_deploy.py"
# What a user may write into the journal: the mark by logger, and an entry of their own making
# with the fields a shutdown and the mark have (journald replaces those starting with _).
FORGE = (
    f"logger -t {boots.ROLLOUT_MARK} 'reboot by sparkrig rollout'; "
    "logger -t systemd 'Reached target reboot.target - System Reboot.'; "
    "printf 'MESSAGE=Reached target reboot.target\\nUNIT=reboot.target\\nJOB_TYPE=start\\nJOB_RESULT=done\\n"
    f"_PID=1\\n_UID=0\\n_TRANSPORT=kernel\\nSYSLOG_IDENTIFIER={boots.ROLLOUT_MARK}\\n' | logger --journald"
)


def _boot_id() -> str:
    return lab.run_ssh(HOST, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def _wait_new_boot(before: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(2)
        answer = lab.run_ssh(HOST, "cat /proc/sys/kernel/random/boot_id", check=False)
        if answer.returncode == 0 and answer.stdout.strip() not in ("", before):
            # systemd up enough to answer over SSH; journald writes the new boot's entries.
            return
    pytest.fail(f"{HOST} did not come back with a new boot id within {timeout} s")


def _forge() -> None:
    lab.run_ssh(HOST, FORGE)  # as the lab's user, not root
    lab.run_ssh(HOST, "sudo journalctl --sync")


def test_the_labs_real_reboots_and_a_kill_are_classified_and_forged_lines_change_nothing(lab_hosts, lab_locks):
    assert HOST in {h.name for h in lab_hosts}
    first = run_deploy(LAB_INVENTORY, "--limit", HOST, deploy=DEPLOY)
    assert first.returncode == 0, first.log
    again = run_deploy(LAB_INVENTORY, "--limit", HOST, deploy=DEPLOY)
    assert again.returncode == 0 and again.changed() == {}, again.changed()
    said = lab.run_ssh(HOST, f"cat {boots.JOURNALD_DROP_IN}").stdout
    assert "Storage=persistent" in said

    # 1. The rollout's own reboot command, through pyinfra as the rollout runs it.
    _forge()
    before = _boot_id()
    PyinfraHosts(PYINFRA, str(REPO), LAB_INVENTORY).reboot(HOST)
    _wait_new_boot(before)
    # 2. A reboot by hand, after the user forged the mark again.
    _forge()
    before = _boot_id()
    lab.run_ssh(HOST, "sudo systemd-run --quiet --on-active=2 systemctl reboot")
    _wait_new_boot(before)
    # 3. Killed from outside (power cut), after the user forged a shutdown and the mark.
    _forge()
    lab.kill(HOST)
    lab.restart(HOST)

    report = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "report", LAB_INVENTORY, "--limit", HOST, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stdout + report.stderr
    found = json.loads(report.stdout)["hosts"][HOST]
    ends = [boot["ended"] for boot in found["boots"]["boots"]]
    assert ends[-3:] == [boots.ROLLOUT_REBOOT, boots.REBOOT, boots.POWER_LOST], found["boots"]
    assert found["versions"]["boots"].endswith("rollout-reboot, reboot, power-lost")
    assert "boots" in found["differs"]

    control = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/compliance/test_updates.py::test_the_journal_is_kept_across_boots_and_crash_dumps_collected",
            "--inventory",
            LAB_INVENTORY,
            "--limit",
            HOST,
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert control.returncode == 0 and "1 passed" in control.stdout, control.stdout + control.stderr
