"""
Firmware in the lab: the updates concern installs fwupd (``updates_firmware``'s default,
"report"), the real fwupd answers on the lab's Debian 12 and 13 hosts, the report says "fwupd
reports no devices" (a container has no firmware device: fwupd lists its CPU, without a
version), and the control of ``updates_expected_firmware`` fails naming the device that is not
present. fwupd's unit refuses containers: the lab's STAND-IN drop-in (lab/fleet.py,
FWUPD_LAB_DROP_IN) lets it start there, with /sys read-only. The version comparison and drift
are tested on recorded and HAND-WRITTEN fwupd JSON (tests/unit/operations/test_updates_firmware.py):
no lab host has a firmware version to compare.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

import lab
from sparkrig.operations.updates.facts import NOT_INSTALLABLE
from tests.conftest import LAB_INVENTORY
from tests.support import REPO, run_check, run_deploy

pytestmark = pytest.mark.lab

HOSTS = ("lab-deb12", "lab-deb13")
LIMIT = [arg for name in HOSTS for arg in ("--limit", name)]


def test_fwupd_is_installed_answers_and_the_report_says_no_devices(lab_hosts):
    hosts = [name for name in HOSTS if name in {h.name for h in lab_hosts}]
    assert hosts, [h.name for h in lab_hosts]
    first = run_deploy(LAB_INVENTORY, *LIMIT, deploy="tests/converge/updates_deploy.py")
    assert first.returncode == 0, first.log
    again = run_deploy(LAB_INVENTORY, *LIMIT, deploy="tests/converge/updates_deploy.py")
    assert again.returncode == 0 and again.changed() == {}, again.changed()
    for name in hosts:
        assert lab.run_ssh(name, "dpkg-query -W -f '${Status}' fwupd").stdout == "install ok installed"

    result = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools.report", LAB_INVENTORY, *LIMIT, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    for name in hosts:
        firmware = report["hosts"][name]["firmware"]
        # The real fwupd answered (not "absent", not an error), with no firmware device.
        assert (firmware["facts"]["fwupd"], firmware["facts"]["error"]) == ("read", ""), firmware
        assert firmware["summary"] == "fwupd reports no devices" and firmware["devices"] == {}, firmware
        assert report["hosts"][name]["versions"]["firmware"] == "fwupd reports no devices"
    table = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools.report", LAB_INVENTORY, *LIMIT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert table.returncode == 0, table.stderr
    for name in hosts:
        assert any(
            re.fullmatch(rf"{name}\s+\S+\s+fwupd reports no devices", line) for line in table.stdout.splitlines()
        ), table.stdout
    print(table.stdout)  # docs/updates.md's example


@pytest.fixture
def expecting_firmware(tmp_path) -> str:
    """The lab inventory, lab-deb12 expecting a system firmware version."""
    inventory = tmp_path / "expecting.py"
    inventory.write_text(
        "from inventory.lab import lab as _lab\n"
        "lab = [(n, {**d, 'updates_expected_firmware': {'System Firmware': '2.91'}}"
        " if n == 'lab-deb12' else d) for n, d in _lab]\n"
    )
    return str(inventory)


def test_an_expected_firmware_device_that_is_not_present_fails_its_control(lab_hosts, expecting_firmware):
    suite = run_check(expecting_firmware, ["lab-deb12"], "-k", "test_updates and firmware")
    assert suite.returncode == 1, suite.stdout + suite.stderr
    findings = [line.strip() for line in suite.stdout.splitlines() if "::test_" in line and ": " in line]
    assert findings == [
        "lab-deb12: test_updates.py::test_the_firmware_is_the_expected_version[ssh://lab-deb12]: "
        "firmware device 'System Firmware' is not present (fwupd reports no devices)"
    ], suite.stdout


OFFLINE = "lab-deb12-b"
# Every apt source but the lab's DGX OS stand-in repository (which serves no fwupd) is set
# aside: apt-get update still succeeds and apt then says "Unable to locate package fwupd", as
# on an offline box whose lists lack it.
ASIDE = "/root/sparkrig-test-sources-aside"
SOURCES_ASIDE = (
    f"mkdir -p {ASIDE} && for f in /etc/apt/sources.list /etc/apt/sources.list.d/*; do "
    f'case $f in */dgx.list) ;; *) [ -e "$f" ] && mv "$f" {ASIDE}/ ;; esac; done; '
    "apt-get update -qq && (apt-get purge -y -qq fwupd >/dev/null 2>&1 || true)"
)
SOURCES_BACK = (
    f'for f in {ASIDE}/*; do case ${{f##*/}} in sources.list) mv "$f" /etc/apt/ ;; '
    f'*) mv "$f" /etc/apt/sources.list.d/ ;; esac; done; rmdir {ASIDE} && apt-get update -qq'
)


def test_fwupd_absent_and_not_installable_fails_nothing_and_the_report_says_so(lab_hosts, lab_locks):
    assert OFFLINE in {h.name for h in lab_hosts}
    lab.run_ssh(OFFLINE, f"sudo sh -c {shlex.quote(SOURCES_ASIDE)}")
    try:
        policy = lab.run_ssh(OFFLINE, "LC_ALL=C apt-cache policy fwupd; sudo apt-get install -s fwupd", check=False)
        assert "Unable to locate package fwupd" in policy.stdout + policy.stderr, policy
        first = run_deploy(LAB_INVENTORY, "--limit", OFFLINE, deploy="tests/converge/updates_deploy.py")
        assert first.returncode == 0, first.log
        assert "Updates | Install fwupd (updates_firmware)" not in first.changed().get(OFFLINE, {}), first.changed()
        again = run_deploy(LAB_INVENTORY, "--limit", OFFLINE, deploy="tests/converge/updates_deploy.py")
        assert again.returncode == 0 and again.changed() == {}, again.changed()
        result = subprocess.run(
            [sys.executable, "-m", "sparkrig.tools.report", LAB_INVENTORY, "--limit", OFFLINE, "--json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        summary = json.loads(result.stdout)["hosts"][OFFLINE]["firmware"]["summary"]
        assert summary == f"fwupd not installed: {NOT_INSTALLABLE}", summary
        # "apply" insists: the same box fails its updates concern, naming apt's error.
        apply = run_deploy(
            LAB_INVENTORY,
            "--limit",
            OFFLINE,
            "--data",
            "updates_firmware=apply",
            deploy="tests/converge/updates_deploy.py",
        )
        assert apply.returncode != 0 and "Unable to locate package fwupd" in apply.log, apply.log
    finally:
        lab.run_ssh(OFFLINE, f"sudo sh -c {shlex.quote(SOURCES_BACK)}")
