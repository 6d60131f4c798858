"""
Swap off survives a reboot: the converged lab hosts, which started with swap entries in
their fstab (tests/conftest.py STOCK_FSTAB), boot again with a valid fstab and nothing
that turns swap on.
"""

import base64

import pytest

import lab
from tests.conftest import STOCK_FSTAB

pytestmark = pytest.mark.lab


# What the converge must leave: swap lines commented, every other byte as it was.
EXPECTED_FSTAB = {
    "lab-deb12": (
        b"# /etc/fstab: static file system information.\n"
        b"# sparkrig swap off: /swap.img\tnone\tswap\tsw\t0\t0\n"
        b"# sparkrig swap off: LABEL=SWAP   none  swap  defaults,pri=5  0 0\r\n"
        b"/dev/sdb1 /mnt/swapdata ext4 noauto,nofail 0 2"
    ),
    "lab-deb13": (
        b"# sparkrig swap off: UUID=5f3c9d3e-2a41-4b8e-9d0c-3f1e2a7b6c5d none swap sw,nofail 0 0\n"
        b"# /dev/sdc2 none swap sw 0 0\n"
        b"/dev/sdb1\t/mnt/swap\\040data\text4\tnoauto\t0\t2\n"
    ),
}


@pytest.mark.parametrize("name", sorted(STOCK_FSTAB))
def test_fstab_swap_lines_commented_every_other_byte_kept_and_backed_up(first_converge, name):
    assert first_converge.returncode == 0, first_converge.log
    fstab = base64.b64decode(lab.run_ssh(name, "base64 -w0 /etc/fstab").stdout)
    backup = base64.b64decode(lab.run_ssh(name, "sudo base64 -w0 /etc/fstab.sparkrig.bak").stdout)
    assert fstab == EXPECTED_FSTAB[name]
    assert backup == STOCK_FSTAB[name]


@pytest.mark.parametrize("name", sorted(STOCK_FSTAB))
def test_host_reboots_with_valid_fstab_and_no_swap_unit(first_converge, name):
    assert first_converge.returncode == 0, first_converge.log
    lab.restart(name)
    state = lab.run_ssh(name, "systemctl is-system-running --wait", check=False).stdout.strip()
    failed = lab.run_ssh(name, "systemctl --failed --no-legend --plain", check=False).stdout
    assert state == "running", failed
    units = lab.run_ssh(name, "systemctl list-units --all --no-legend --plain '*.swap'").stdout
    assert all(" active " not in f" {line} " for line in units.splitlines()), units
    verify = lab.run_ssh(name, "findmnt --fstab --types swap --noheadings", check=False)
    assert verify.stdout.strip() == ""
