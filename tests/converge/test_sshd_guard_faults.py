"""
SSH guard faults in the lab: a deploy never restarts sshd into a lockout.

Each test restores what it broke, so the fleet stays converged for the compliance suite.
"""

import shlex

import pytest

import lab
from sparkrig.operations.sshd_guard.operations import DROPIN_NAME, VERIFY_DROPIN
from tests.conftest import LAB_INVENTORY
from tests.support import run_deploy

pytestmark = pytest.mark.lab
HOST = "lab-deb13"  # ssh.socket activation, as on DGX OS
DROPIN = f"/etc/systemd/system/ssh.service.d/{DROPIN_NAME}"


def test_broken_sshd_config_stops_the_restart_before_anything_changes(first_converge):
    assert first_converge.returncode == 0, first_converge.log
    lab.run_ssh(HOST, f"sudo sh -c 'echo BogusOption yes > /etc/ssh/sshd_config.d/broken.conf; rm {DROPIN}'")
    try:
        result = run_deploy(LAB_INVENTORY, "--limit", HOST)
        assert result.returncode != 0
        assert "refusing to restart ssh.service: sshd -t fails" in result.log
        assert "Bad configuration option: BogusOption" in result.log
        # Nothing changed: the drop-in was not rewritten, and SSH still works.
        assert lab.run_ssh(HOST, f"test -e {DROPIN} || echo absent").stdout.strip() == "absent"
    finally:
        lab.run_ssh(HOST, "sudo rm -f /etc/ssh/sshd_config.d/broken.conf")
    repaired = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert repaired.returncode == 0, repaired.log
    assert repaired.changed() == {HOST: ["SSH guard | Reserve memory for sshd, keep its sessions killable"]}


def test_a_dropin_systemd_would_ignore_is_rejected(first_converge):
    bad = "/tmp/bad-dropin.conf"
    lab.run_ssh(HOST, f"printf '[Service]\\nOOMScoreAdjst=0\\nMemoryMin=12xM\\n' > {bad}")
    result = lab.run_ssh(HOST, f"sudo sh -c {shlex.quote(VERIFY_DROPIN)} verify ssh.service {bad}", check=False)
    assert result.returncode != 0
    assert "Unknown key 'OOMScoreAdjst'" in result.stderr
    good = lab.run_ssh(HOST, f"sudo sh -c {shlex.quote(VERIFY_DROPIN)} verify ssh.service {DROPIN}", check=False)
    assert good.returncode == 0, good.stderr
