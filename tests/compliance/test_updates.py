"""
Updates controls: the kernel and driver a box must run, holds that hold, unattended upgrades
as the owner set them, and no systemd-oomd beside earlyoom.

What the host must show is worked out here from the settings, independently of the code
that converges (operations/updates/).
"""

from __future__ import annotations

import fnmatch
import re

import pytest

PIN_FILE = "/etc/apt/preferences.d/sparkrig-holds"
APT_CONF = "/etc/apt/apt.conf.d/99sparkrig-updates"
RECORD = "/var/lib/sparkrig/updates-held"
TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")


def _holds(settings) -> tuple[list[str], dict[str, str]]:
    """updates_hold as (names or globs held with apt-mark, {name: pinned version})."""
    marks, pins = [], {}
    for entry in settings["updates_hold"]:
        name, _, version = entry.partition("=")
        if version:
            pins[name] = version
        else:
            marks.append(name)
    return marks, pins


def _loaded_driver(host) -> str | None:
    proc = host.run("cat /proc/driver/nvidia/version")
    if proc.rc == 0:
        match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+){1,2})\s", proc.stdout)
        assert match, f"/proc/driver/nvidia/version says {proc.stdout[:200]!r}"
        return match[1]
    smi = host.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    return smi.stdout.split()[0] if smi.rc == 0 and smi.stdout.strip() else None


def test_the_running_kernel_is_the_expected_one(host, settings):
    """Protects against a box that an update moved to another kernel (DGX OS 7.4.0's
    6.17.0-1008 is reported to have broken boots and the driver): every box of a group runs
    the kernel its owner chose."""
    expected = settings["updates_expected_kernel"]
    if not expected:
        pytest.skip("updates_expected_kernel is not set for this host")
    running = host.check_output("uname -r").strip()
    assert running == expected, f"kernel {running} is running, updates_expected_kernel is {expected}"


def test_the_loaded_driver_is_the_expected_one(host, settings):
    """Protects against a box whose NVIDIA driver differs from its fleet's (or is not loaded
    after a kernel update): CUDA and the containers were chosen for one driver."""
    expected = settings["updates_expected_driver"]
    if not expected:
        pytest.skip("updates_expected_driver is not set for this host")
    loaded = _loaded_driver(host)
    assert loaded == expected, (
        f"NVIDIA driver {loaded or '(none loaded)'} is loaded, updates_expected_driver is {expected}"
    )


def test_held_packages_are_held(host, settings):
    """Protects against an upgrade the owner did not decide: every installed package that
    updates_hold names (or matches) is held in dpkg, which apt and unattended-upgrades honour."""
    marks, _pins = _holds(settings)
    if not marks:
        pytest.skip("updates_hold holds nothing with apt-mark on this host")
    held = set(host.check_output("apt-mark showhold").split())
    installed = host.check_output("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'").splitlines()
    names = [line.split()[-1] for line in installed if line[1:2] == "i"]
    wanted = {name for name in names if any(fnmatch.fnmatchcase(name, glob) for glob in marks)}
    assert wanted <= held, f"installed but not held: {sorted(wanted - held)}"


def test_pinned_packages_are_pinned_by_a_root_owned_file(host, settings):
    """Protects against a pin that is missing or that someone else can rewrite: apt installs
    whatever a preferences file says, as root."""
    _marks, pins = _holds(settings)
    pin_file = host.file(PIN_FILE)
    if not pins:
        assert not pin_file.exists, f"{PIN_FILE} exists, but updates_hold pins nothing"
        return
    assert (pin_file.user, pin_file.group) == ("root", "root") and pin_file.mode & 0o022 == 0
    records = [dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith("#"))
               for block in pin_file.content_string.split("\n\n") if block.strip("\n# ")]
    found = {r["Package"]: r["Pin"].removeprefix("version ") for r in records if r}
    assert found == pins
    assert all(r["Pin-Priority"] == "1000" for r in records if r)


def test_unattended_upgrades_are_as_the_owner_set_them(host, settings):
    """Protects against upgrades nobody decided (the default on GPU boxes is off) and against
    timers that disagree with apt's settings."""
    mode = settings["updates_unattended"]
    dump = host.check_output("apt-config dump")
    value = re.findall(r'^APT::Periodic::Unattended-Upgrade "([^"]*)";$', dump, re.MULTILINE)
    assert value and value[-1] == ("0" if mode == "off" else "1"), f"updates_unattended is {mode!r}: {value}"
    if mode != "off":
        assert host.package("unattended-upgrades").is_installed
    for timer in TIMERS:
        enabled = host.run("systemctl is-enabled %s", timer).stdout.strip()
        if enabled in ("", "not-found", "masked"):
            continue
        assert (host.service(timer).is_running, enabled == "enabled") == (mode != "off",) * 2, (
            f"{timer}: {enabled}, updates_unattended is {mode!r}"
        )


def test_updates_files_are_root_owned_and_not_writable_by_others(host):
    """Protects against privilege escalation: apt runs as root whatever these files say."""
    for path in (APT_CONF, RECORD):
        f = host.file(path)
        if path == RECORD and not f.exists:
            continue
        assert f.is_file, f"{path} is missing"
        assert (f.user, f.group) == ("root", "root") and f.mode & 0o022 == 0, f"{path}: {f.user} {f.mode:o}"


def test_systemd_oomd_does_not_run_beside_earlyoom(host, settings):
    """Protects against a second OOM killer that kills a user's whole session (every job and
    shell in it) under memory pressure, racing earlyoom, which kills the one preferred process."""
    choice = settings["updates_systemd_oomd"]
    if choice == "keep" or (choice == "auto" and not settings["watchdog_enabled"]):
        pytest.skip(f"updates_systemd_oomd is {choice!r} here: systemd-oomd is the owner's")
    state = host.run("systemctl is-enabled systemd-oomd.service").stdout.strip()
    assert state in ("", "not-found", "masked"), f"systemd-oomd.service is {state}"
    assert not host.service("systemd-oomd").is_running


# What the read-only controls above ask, read once per host before they run (reads.py).
def reads(plan, settings) -> None:
    plan.run("uname -r")
    plan.run("cat /proc/driver/nvidia/version")
    plan.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    plan.run("apt-mark showhold")
    plan.run("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'")
    plan.file(PIN_FILE)
    plan.run("apt-config dump")
    plan.package("unattended-upgrades")
    for timer in TIMERS:
        plan.run("systemctl is-enabled %s", timer)
        plan.service(timer)
    for path in (APT_CONF, RECORD):
        plan.path(path)
    plan.run("systemctl is-enabled systemd-oomd.service")
    plan.service("systemd-oomd")
