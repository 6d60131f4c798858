"""
Updates in the lab: a hold keeps the old version of a package through `apt-get -y upgrade`
run by hand, releasing it in the settings upgrades it on the next converge, the report marks
the host that differs, and a box that does not run its expected kernel fails the compliance
control (naming both versions) and, with updates_stop_on_unexpected, is refused before any change.

The packages are the lab's STAND-INs for a kernel and a driver package
(sparkrig-lab-standin-kernel, sparkrig-lab-standin-nvidia-driver, versions 1.0 and 2.0 in
the lab's DGX OS stand-in repository, lab/repo.py): lab hosts share the controller's kernel
and have no GPU. The tests work on lab-deb12-b (its apt source is that repository) and leave
every host converged with the default settings.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lab
from lab.config import DRIVER_STANDIN_PACKAGE as DRIVER
from lab.config import KERNEL_STANDIN_PACKAGE as KERNEL
from sparkrig.operations.updates.facts import RECORD
from sparkrig.operations.updates.operations import APT_CONF
from sparkrig.operations.updates.settings import PIN_FILE
from tests.conftest import LAB_INVENTORY
from tests.support import REPO, run_check, run_deploy

pytestmark = pytest.mark.lab

HOST = "lab-deb12-b"
HOLDS = [KERNEL, f"{DRIVER}=1.0"]
EXPECTED = "0.0.0-sparkrig-expected"


def _installed(host: str, package: str) -> str:
    return lab.run_ssh(host, f"dpkg-query -W -f '${{Version}}' {package}").stdout.strip()


def _hosts() -> dict[str, dict]:
    """The hosts of inventory/lab.py: the lab's, less the hostile host (its own inventory)."""
    hostile = {name for name, _ in lab.HOSTILE_FLEET}
    return {h["name"]: h for h in json.loads(lab.inventory_path().read_text())["hosts"] if h["name"] not in hostile}


def test_a_hold_survives_apt_get_upgrade_until_the_settings_release_it(first_converge):
    assert first_converge.returncode == 0, first_converge.log
    lab.run_ssh(
        HOST,
        "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        f"--allow-downgrades {KERNEL}=1.0 {DRIVER}=1.0 >/dev/null",
    )
    hold = ("--limit", HOST, "--data", "updates_hold=" + json.dumps(HOLDS))
    held = run_deploy(LAB_INVENTORY, *hold)
    assert held.returncode == 0, held.log
    assert set(held.changed()[HOST]) >= {
        f"Updates | Version pins ({PIN_FILE})",
        "Updates | Packages held as updates_hold says (apt-mark)",
        f"Updates | What sparkrig holds ({RECORD})",
    }, held.changed()
    again = run_deploy(LAB_INVENTORY, *hold)
    assert again.returncode == 0 and again.changed() == {}, again.changed()
    assert lab.run_ssh(HOST, "apt-mark showhold").stdout.split() == [KERNEL]

    by_hand = lab.run_ssh(HOST, "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get -y upgrade")
    assert "kept back" in by_hand.stdout and KERNEL in by_hand.stdout, by_hand.stdout
    assert (_installed(HOST, KERNEL), _installed(HOST, DRIVER)) == ("1.0", "1.0")

    released = run_deploy(LAB_INVENTORY, "--limit", HOST)  # updates_hold back to its default: []
    assert released.returncode == 0, released.log
    assert "Updates | Upgrade what a released hold kept back" in released.changed()[HOST]
    assert (_installed(HOST, KERNEL), _installed(HOST, DRIVER)) == ("2.0", "2.0")
    assert lab.run_ssh(HOST, "apt-mark showhold").stdout.split() == []
    assert lab.run_ssh(HOST, f"ls {PIN_FILE} {RECORD}", check=False).returncode != 0
    after = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert after.returncode == 0 and after.changed() == {}, after.changed()


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "report", LAB_INVENTORY, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_report_marks_the_host_that_differs(first_converge):
    assert first_converge.returncode == 0, first_converge.log
    hosts = _hosts()
    for name, host in hosts.items():
        version = "1.0" if name == HOST else "2.0"
        url = f"{host['apt_repo_url']}/dgx/baseos/{KERNEL}_{version}_all.deb"
        lab.run_ssh(
            name,
            "python3 -c 'import sys, urllib.request as u; u.urlretrieve(sys.argv[1], sys.argv[2])' "
            f"{url} /tmp/standin.deb && sudo dpkg -i /tmp/standin.deb >/dev/null && rm /tmp/standin.deb",
        )
    result = _report("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["hosts"]) == set(hosts) and report["errors"] == {}
    for name, row in report["hosts"].items():
        assert row["versions"]["kernel_pkgs"] == ("1.0" if name == HOST else "2.0")
        assert ("kernel_pkgs" in row["differs"]) == (name == HOST), (name, row["differs"])
    table = _report()
    assert table.returncode == 0, table.stderr
    line = next(line for line in table.stdout.splitlines() if line.startswith(HOST + " "))
    assert " 1.0 *" in line, table.stdout
    print(table.stdout)  # the README's example


@pytest.fixture
def expecting_another_kernel(tmp_path) -> str:
    """The lab inventory, with lab-deb12-b expecting a kernel it does not run and told to stop on it."""
    inventory = tmp_path / "expecting.py"
    inventory.write_text(
        "from inventory.lab import lab as _lab\n"
        f"lab = [(n, {{**d, 'updates_expected_kernel': {EXPECTED!r}, 'updates_stop_on_unexpected': True}}"
        f" if n == {HOST!r} else d) for n, d in _lab]\n"
    )
    return str(inventory)


def test_an_unexpected_kernel_fails_compliance_and_stops_the_deploy_on_that_host(
    first_converge, expecting_another_kernel
):
    assert first_converge.returncode == 0, first_converge.log
    running = lab.run_ssh(HOST, "uname -r").stdout.strip()
    both = f"kernel {running} is running, updates_expected_kernel is {EXPECTED}"

    suite = run_check(expecting_another_kernel, [HOST, "lab-deb13"], "-k", "test_updates")
    assert suite.returncode == 1, suite.stdout + suite.stderr
    # One line per failed control under the per-host table: host, control, what it found.
    findings = [line.strip() for line in suite.stdout.splitlines() if "::test_" in line and ": " in line]
    assert findings == [
        f"{HOST}: test_updates.py::test_the_running_kernel_is_the_expected_one[ssh://{HOST}]: {both}"
    ], suite.stdout

    # A change is pending on lab-deb12-b; the refusal comes before it, lab-deb13 goes on.
    lab.run_ssh(HOST, f"sudo rm {APT_CONF}")
    stopped = run_deploy(expecting_another_kernel, "--limit", HOST, "--limit", "lab-deb13")
    assert stopped.returncode != 0
    assert set(stopped.errors()) == {HOST}, stopped.errors()
    # The refusal is the host's first error (operations planned after it never ran, and count as failed).
    assert (
        stopped.errors()[HOST][0]
        == "Updates | The box runs the expected kernel and driver (updates_stop_on_unexpected)"
    )
    assert both in stopped.log, stopped.log[-3000:]
    assert HOST not in stopped.changed()
    assert lab.run_ssh(HOST, f"test -e {APT_CONF}", check=False).returncode == 1
    restored = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert restored.returncode == 0 and list(restored.changed()) == [HOST], restored.log


def test_systemd_oomd_is_masked_beside_earlyoom(first_converge):
    """Debian's own systemd-oomd (as Ubuntu 24.04 runs it), installed after a converge: the next
    one masks it and its socket (earlyoom is the watchdog), the one after changes nothing."""
    assert first_converge.returncode == 0, first_converge.log
    other = "lab-deb13-b"
    lab.run_ssh(
        other,
        "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-oomd >/dev/null",
        timeout=600,
    )
    # As the package leaves it (a rerun of this test finds it masked).
    lab.run_ssh(
        other,
        "sudo systemctl unmask -q systemd-oomd.service systemd-oomd.socket && "
        "sudo systemctl enable -q systemd-oomd.service systemd-oomd.socket",
    )
    assert lab.run_ssh(other, "systemctl is-enabled systemd-oomd.service").stdout.strip() == "enabled"
    masked = run_deploy(LAB_INVENTORY, "--limit", other)
    assert masked.returncode == 0, masked.log
    assert masked.changed() == {other: ["Updates | systemd-oomd is masked (earlyoom is the watchdog)"]}
    states = lab.run_ssh(other, "systemctl is-enabled systemd-oomd.service systemd-oomd.socket", check=False)
    assert states.stdout.split() == ["masked", "masked"], states.stdout
    assert lab.run_ssh(other, "systemctl is-active systemd-oomd.service", check=False).stdout.strip() != "active"
    again = run_deploy(LAB_INVENTORY, "--limit", other)
    assert again.returncode == 0 and again.changed() == {}, again.changed()


# The owner's known-bad entry: the lab's STAND-IN kernel package in version 2.0.
KNOWN_BAD = {
    "name": "lab-standin-kernel-2",
    "kind": "kernel",
    "reason": "STAND-IN: the lab's kernel package 2.0 plays a kernel known to break this box",
    "links": ["https://sparkrig.invalid/known-bad"],
    "packages": {KERNEL: "2.0"},
}
KNOWN_BAD_CONTROL = "test_updates.py::test_no_known_bad_version_runs_or_is_installed"


@pytest.fixture
def listing_known_bad(tmp_path) -> str:
    """The lab inventory, every host listing the stand-in kernel 2.0 as known-bad."""
    inventory = tmp_path / "known_bad.py"
    inventory.write_text(
        "from inventory.lab import lab as _lab\n"
        f"lab = [(n, {{**d, 'updates_known_bad': [{KNOWN_BAD!r}]}}) for n, d in _lab]\n"
    )
    return str(inventory)


def _control(inventory: str) -> subprocess.CompletedProcess:
    return run_check(inventory, [HOST], "-k", KNOWN_BAD_CONTROL.split("::")[1])


def test_a_known_bad_version_is_never_installed_and_a_host_running_one_fails_and_stops_a_rollout(
    lab_hosts, lab_locks, listing_known_bad, tmp_path
):
    """The lab's repository serves the stand-in kernel in 1.0 and 2.0; with 2.0 listed, the
    deploy's own upgrade (a released hold) and apt-get upgrade by hand keep 1.0; a host made to
    run 2.0 (dpkg -i, past apt) fails the control naming the entry, and a rollout stops at its
    canary, the next host not started."""
    assert HOST in {h.name for h in lab_hosts}
    deploy = "tests/converge/updates_deploy.py"
    lab.run_ssh(
        HOST,
        "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        f"--allow-downgrades {KERNEL}=1.0 >/dev/null",
    )
    held = run_deploy(
        listing_known_bad, "--limit", HOST, "--data", f"updates_hold={json.dumps([KERNEL])}", deploy=deploy
    )
    assert held.returncode == 0, held.log
    assert (
        "Updates | Known-bad versions never installed (/etc/apt/preferences.d/sparkrig-known-bad)"
        in (held.changed()[HOST])
    ), held.changed()
    # The hold released: the deploy upgrades what it kept back, and apt's candidate is 1.0.
    released = run_deploy(listing_known_bad, "--limit", HOST, deploy=deploy)
    assert released.returncode == 0, released.log
    assert "Updates | Upgrade what a released hold kept back" in released.changed()[HOST], released.changed()
    assert _installed(HOST, KERNEL) == "1.0"
    by_hand = lab.run_ssh(HOST, "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get -y upgrade")
    assert _installed(HOST, KERNEL) == "1.0", by_hand.stdout
    policy = lab.run_ssh(HOST, f"LC_ALL=C apt-cache policy {KERNEL}").stdout
    assert "Candidate: 1.0" in policy and "2.0 -1" in policy, policy
    again = run_deploy(listing_known_bad, "--limit", HOST, deploy=deploy)
    assert again.returncode == 0 and again.changed() == {}, again.changed()
    passed = _control(listing_known_bad)
    assert passed.returncode == 0, passed.stdout

    # Made to run 2.0, past apt's pin.
    lab.run_ssh(
        HOST,
        f"cd /tmp && sudo apt-get download -qq {KERNEL}=2.0 && sudo dpkg -i /tmp/{KERNEL}_2.0_*.deb >/dev/null "
        f"&& sudo rm -f /tmp/{KERNEL}_2.0_*.deb",
    )
    assert _installed(HOST, KERNEL) == "2.0"
    try:
        failed = _control(listing_known_bad)
        assert failed.returncode == 1, failed.stdout
        assert f"known-bad lab-standin-kernel-2: installed {KERNEL} 2.0: STAND-IN" in failed.stdout, failed.stdout
        assert "https://sparkrig.invalid/known-bad" in failed.stdout

        # The rollout takes hosts in the inventory's order: the second host comes after HOST, so
        # that HOST is the canary (hosts before it may run 2.0 from the report's test).
        names = [name for name in _hosts() if name in {h.name for h in lab_hosts}]
        others = names[names.index(HOST) + 1 :]
        assert others, "a rollout past the canary needs a lab host after it in the inventory"
        rollout = subprocess.run(
            [
                sys.executable,
                "-m",
                "sparkrig.tools",
                "rollout",
                listing_known_bad,
                "--limit",
                ",".join([HOST, others[0]]),
                "--canary",
                "1",
                "--max-fail",
                "1",
                "--state",
                str(tmp_path / "rollout" / "state.json"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert rollout.returncode == 1, rollout.stderr[-6000:]
        assert f"rollout: batch 1/2 (canary): {HOST}\n" in rollout.stderr, rollout.stderr[-6000:]
        # The suite's own finding, in the rollout's log (the table names the host's first failed control).
        finding = f"{HOST}: {KNOWN_BAD_CONTROL}[ssh://{HOST}]: known-bad lab-standin-kernel-2"
        assert finding in rollout.stderr, rollout.stderr[-6000:]
        assert f"not started: {others[0]}" in rollout.stderr
        assert "rollout: stopped after batch 1" in rollout.stderr
    finally:
        lab.run_ssh(
            HOST,
            f"sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades {KERNEL}=1.0 >/dev/null",
        )
        # Back to the default settings: no entry for the lab's hosts, no pins.
        restored = run_deploy(LAB_INVENTORY, "--limit", HOST, deploy=deploy)
        assert restored.returncode == 0, restored.log
        assert lab.run_ssh(HOST, "test -e /etc/apt/preferences.d/sparkrig-known-bad", check=False).returncode == 1


CMDLINE_CONTROL = "test_updates.py::test_the_kernel_command_line_is_as_set"


@pytest.fixture
def with_kho_off(tmp_path) -> str:
    """The lab inventory, lab-deb12-b adding kho=off to the kernel's command line and removing splash."""
    inventory = tmp_path / "kho.py"
    inventory.write_text(
        "from inventory.lab import lab as _lab\n"
        "lab = [(n, {**d, 'updates_kernel_cmdline': {'add': ['kho=off'], 'remove': ['splash']}}"
        f" if n == {HOST!r} else d) for n, d in _lab]\n"
    )
    return str(inventory)


def test_the_kernel_command_line_drop_in_is_written_validated_and_checked_where_no_boot_loader_runs(
    lab_hosts, lab_locks, with_kho_off
):
    """A lab container has no boot loader (no update-grub, no /boot/grub): the drop-in is written
    (its validator run for real on the host), a second run changes nothing, the deploy says
    nothing applies it, and the control checks GRUB's configuration as grub-mkconfig sources it,
    then skips saying /proc/cmdline was not compared; the setting emptied removes the drop-in."""
    assert HOST in {h.name for h in lab_hosts}
    assert lab.run_ssh(HOST, "command -v update-grub", check=False).returncode != 0, "a lab host with GRUB"
    deploy = "tests/converge/updates_deploy.py"
    drop_in = "/etc/default/grub.d/90-sparkrig-cmdline.cfg"
    first = run_deploy(with_kho_off, "--limit", HOST, deploy=deploy)
    assert first.returncode == 0, first.log
    assert list(first.changed()[HOST]) == [
        f"Updates | The kernel's command line as updates_kernel_cmdline says ({drop_in})"
    ], first.changed()
    assert "no boot loader here (update-grub absent)" in first.log
    again = run_deploy(with_kho_off, "--limit", HOST, deploy=deploy)
    assert again.returncode == 0 and again.changed() == {}, again.changed()
    sourced = lab.run_ssh(
        HOST,
        f"GRUB_CMDLINE_LINUX='ro kho=on' GRUB_CMDLINE_LINUX_DEFAULT='quiet splash' sh -c '. {drop_in}; "
        'echo "$GRUB_CMDLINE_LINUX|$GRUB_CMDLINE_LINUX_DEFAULT"\'',
    ).stdout.strip()
    assert sourced == "ro kho=off|quiet", sourced
    control = run_check(with_kho_off, [HOST], "-rs", "-k", CMDLINE_CONTROL.split("::")[1])
    assert control.returncode == 0, control.stdout
    assert "1 skipped" in control.stdout and "no boot loader here" in control.stdout, control.stdout
    removed = run_deploy(LAB_INVENTORY, "--limit", HOST, deploy=deploy)
    assert removed.returncode == 0, removed.log
    assert lab.run_ssh(HOST, f"test -e {drop_in}", check=False).returncode == 1
