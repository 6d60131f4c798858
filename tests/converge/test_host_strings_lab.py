"""
One host's strings in the lab: lab-deb12's fwupd is a STAND-IN (lab/fwupd.py) reporting
devices whose names hold a NUL, an escape sequence that retitles and recolours the terminal,
a carriage return and a line naming lab-deb13, and a C1 control in a vendor. The deploy (with
``updates_firmware = "apply"``, so that it reads fwupd and names an offered update in an
operation), ``sparkrig report``, the suite's per-host table and a ``sparkrig rollout`` batch
stay clean and lab-deb13 is untouched by what lab-deb12 wrote. Before: an ESC reached the
operator's terminal raw through the operation's name, the report's cells and the suite's table,
and a NUL in a reboot reason ended the rollout for every host.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import lab
from lab import fwupd as stand_in
from tests.support import REPO, host_table, run_check, run_deploy

pytestmark = pytest.mark.lab

HOSTILE, OTHER = "lab-deb12", "lab-deb13"
LIMIT = ["--limit", HOSTILE, "--limit", OTHER]
# pyinfra's own colours (SGR sequences) are the only escape sequences its log may hold.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
# Raw, what would drive the terminal; "\n" ends lines and "\t" is text.
_RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _raw(text: str) -> list[str]:
    return sorted({repr(ch) for ch in _RAW.findall(_COLOUR.sub("", text))})


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.fixture
def hostile_fwupd(lab_hosts, tmp_path):
    """The STAND-IN fwupd on lab-deb12, and an inventory where lab-deb12 applies firmware
    updates and expects a device the stand-in names otherwise."""
    names = {h.name for h in lab_hosts}
    if not {HOSTILE, OTHER} <= names:
        pytest.skip(f"needs {HOSTILE} and {OTHER} in the lab (it has {sorted(names)})")
    inventory = tmp_path / "hostile_fwupd.py"
    inventory.write_text(
        "from inventory.lab import lab as _lab\n"
        f"lab = [(n, {{**d, 'updates_firmware': 'apply', 'updates_expected_firmware': {{'System Firmware': '2.91'}}}}"
        f" if n == {HOSTILE!r} else d) for n, d in _lab if n in ({HOSTILE!r}, {OTHER!r})]\n"
    )
    first = run_deploy(str(inventory), *LIMIT, deploy="tests/converge/updates_deploy.py")  # fwupd installed
    assert first.returncode == 0, first.log[-3000:]
    stand_in.install(HOSTILE)
    yield str(inventory)
    stand_in.remove(HOSTILE)
    lab.run_ssh(HOSTILE, "sudo rm -f /run/reboot-required /run/reboot-required.pkgs", check=False)


def test_a_hosts_device_names_reach_no_terminal_raw_and_leave_the_other_host_alone(hostile_fwupd):
    deploy = run_deploy(hostile_fwupd, *LIMIT, deploy="tests/converge/updates_deploy.py")
    assert deploy.returncode == 0, deploy.log[-3000:]
    assert _raw(deploy.log) == [], deploy.log[-3000:]
    names = [op["name"] for op in deploy.report["results"]["operations"]]
    applied = [name for name in names if name.startswith("Updates | Firmware updated through fwupd")]
    assert applied and "NIC \\x1b]0;pwned\\x07\\x1b[31mred\\x0d\\x0a  lab-deb13: forged 28.45.1200" in applied[0]
    assert not [name for name in names if _RAW.search(name)], names

    table = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools.report", hostile_fwupd, *LIMIT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert table.returncode == 0, table.stdout + table.stderr
    assert _raw(table.stdout) == [], table.stdout
    assert "System\\x00Firmware" in table.stdout, table.stdout
    lines = table.stdout.splitlines()
    assert any(re.fullmatch(rf"{OTHER}\s+\S+\s+fwupd reports no devices", line) for line in lines), table.stdout
    assert not any(line.startswith(f"  {OTHER}") for line in lines), table.stdout
    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "sparkrig.tools.report", hostile_fwupd, *LIMIT, "--json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    )
    assert report["hosts"][OTHER]["firmware"]["devices"] == {}, report["hosts"][OTHER]
    assert not [s for s in _strings(report["hosts"][HOSTILE]) if _RAW.search(s)], report["hosts"][HOSTILE]

    suite = run_check(hostile_fwupd, [HOSTILE, OTHER], "-k", "test_updates and firmware")
    assert suite.returncode == 1, suite.stdout + suite.stderr
    table_part = "\n".join(host_table(suite.stdout))
    assert _raw(table_part) == [], table_part
    findings = [line for line in table_part.splitlines() if "::test_" in line]
    assert findings and all(line.startswith(f"  {HOSTILE}: ") for line in findings), table_part
    assert "firmware device 'System Firmware' is not present" in findings[0], findings


def test_a_rollout_batch_with_the_hostile_fwupd_stays_clean_and_names_that_host_alone(hostile_fwupd, tmp_path):
    """``sparkrig rollout`` (the whole deploy, then the suite) over both hosts in one batch:
    its messages, pyinfra's log it passes on, and its table hold nothing raw; lab-deb13's
    outcome is its own."""
    rollout = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkrig.tools",
            "rollout",
            hostile_fwupd,
            "--batch",
            "2",
            "--max-fail",
            "2",
            "--state",
            str(tmp_path / "state" / "r.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert "Traceback" not in rollout.stderr, rollout.stderr[-3000:]
    assert _raw(rollout.stderr) == [], rollout.stderr[-3000:]
    failed = [line for line in rollout.stderr.splitlines() if line.startswith("  lab-")]
    assert not [line for line in failed if line.startswith(f"  {OTHER} ")], rollout.stderr[-3000:]
    # lab-deb12's expected "System Firmware" is not present (the stand-in's is "System\x00Firmware").
    assert any(line.startswith(f"  {HOSTILE} (batch 1): control ") for line in failed), rollout.stderr[-3000:]
