"""Updates: kernel and NVIDIA driver held alike, upgrades on the owner's terms, versions read:
the settings, declared once, and their checks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkrig import stack_locks
from sparkrig.operations.hardware import settings as hardware_settings
from sparkrig.operations.watchdog import settings as watchdog_settings
from sparkrig.settings import Setting, boolean, declare, defaults, int_range, one_of

from . import known_bad

PIN_FILE = "/etc/apt/preferences.d/sparkrig-holds"
KNOWN_BAD_FILE = "/etc/apt/preferences.d/sparkrig-known-bad"
GRUB_DROP_IN = "/etc/default/grub.d/90-sparkrig-cmdline.cfg"

# A kernel parameter as updates_kernel_cmdline adds it (NAME or NAME=VALUE) or removes it (NAME):
# no quote, space, glob or shell character (the drop-in is shell that grub-mkconfig sources).
_CMDLINE_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
_CMDLINE_ADD = re.compile(_CMDLINE_NAME + r"(=[A-Za-z0-9_.,:/+@%-]{0,128})?")
_CMDLINE_REMOVE = re.compile(_CMDLINE_NAME)


MODES = ("off", "security", "on")


OOMD_CHOICES = ("auto", "off", "keep")


FIRMWARE_MODES = ("off", "report", "apply")


# A device as updates_expected_firmware names it: fwupd's name ("System Firmware") or one of
# its GUIDs; printable, no spaces at either end.
_FIRMWARE_DEVICE = re.compile(r"(?=\S)[^\x00-\x1f\x7f]{1,128}(?<=\S)")
_FIRMWARE_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~:-]{0,63}")
REBOOT_CHOICES = ("never", "when-required")


# The report's columns of packages, and which packages count as each.
PACKAGE_COLUMNS = ("kernel", "driver", "docker", "toolkit")


DEFAULT_PACKAGES = {
    "kernel": ["linux-image-*"],
    "driver": ["nvidia-driver-*", "libnvidia-compute-*"],
    "docker": ["docker-ce", "docker.io", "moby-engine"],
    "toolkit": ["nvidia-container-toolkit"],
}


# A dpkg package name, or a glob of one (apt-mark, dpkg-query and apt preferences take globs).
_PACKAGE = re.compile(r"[a-z0-9*?][a-z0-9+.*?-]*")


# A Debian version (epoch, upstream, revision), or a glob of one as apt's "Pin: version" takes.
_VERSION = re.compile(r"[A-Za-z0-9*][A-Za-z0-9.+~:*-]*")


_KERNEL_RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]*")


_DRIVER_VERSION = re.compile(r"[0-9]+(\.[0-9]+){1,2}")


def parse_hold(entry: str) -> tuple[str, str | None]:
    """``NAME`` or ``NAME=VERSION`` of ``updates_hold``, as (name, version or None)."""
    name, _, version = entry.partition("=")
    return name, (version or None)


def cmdline_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        'a mapping with "add" (kernel parameters, NAME or NAME=VALUE: A-Z a-z 0-9 _ . - and in a '
        'value also , : / + @ %%) and "remove" (parameter NAMEs), each name once in both together'
    ).replace("%%", "%")
    if not isinstance(value, Mapping) or not set(value) <= {"add", "remove"}:
        return allowed
    add, remove = value.get("add", []), value.get("remove", [])
    if not isinstance(add, (list, tuple)) or not isinstance(remove, (list, tuple)):
        return allowed
    for word in add:
        if not isinstance(word, str) or not _CMDLINE_ADD.fullmatch(word):
            return f"{allowed} (bad parameter to add: {str(word)[:80]!r})"
    for word in remove:
        if not isinstance(word, str) or not _CMDLINE_REMOVE.fullmatch(word):
            return f"{allowed} (bad parameter name to remove: {str(word)[:80]!r})"
    names = [w.partition("=")[0] for w in [*add, *remove]]
    if len(set(names)) != len(names):
        return f"{allowed} (a name twice: {sorted({n for n in names if names.count(n) > 1})})"
    return None


def hold_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        "a list of package names or globs (a-z 0-9 + . - * ?), each alone (held with apt-mark "
        "hold) or as NAME=VERSION (pinned to that version, a glob allowed: 580.95.*), each name once"
    )
    if not isinstance(value, (list, tuple)):
        return allowed
    names = []
    for entry in value:
        if not isinstance(entry, str):
            return f"{allowed} (not a string: {entry!r})"
        name, version = parse_hold(entry)
        if not _PACKAGE.fullmatch(name) or ("=" in entry and not (version and _VERSION.fullmatch(version))):
            return f"{allowed} (bad entry: {entry!r})"
        names.append(name)
    if len(set(names)) != len(names):
        return f"{allowed} (a name given twice)"
    return None


def packages_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        f"a mapping of each of {', '.join(PACKAGE_COLUMNS)} to a list of package names or globs (a-z 0-9 + . - * ?)"
    )
    if not isinstance(value, Mapping) or set(value) != set(PACKAGE_COLUMNS):
        return allowed
    for column, names in value.items():
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and _PACKAGE.fullmatch(n) for n in names):
            return f"{allowed} (bad {column}: {names!r})"
    return None


def expected_firmware_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        'a mapping of a device (its name as fwupdmgr get-devices shows it, e.g. "System Firmware", '
        "or one of its GUIDs) to the firmware version it must have (A-Z a-z 0-9 . _ + ~ : -)"
    )
    if not isinstance(value, Mapping):
        return allowed
    for device, version in value.items():
        if not isinstance(device, str) or not _FIRMWARE_DEVICE.fullmatch(device):
            return f"{allowed} (bad device: {device!r})"
        if not isinstance(version, str) or not _FIRMWARE_VERSION.fullmatch(version):
            return f"{allowed} (bad version of {device!r}: {version!r})"
    return None


def optional(pattern: re.Pattern, what: str):
    def check(value: Any, _data: Mapping[str, Any]) -> str | None:
        ok = isinstance(value, str) and (value == "" or pattern.fullmatch(value))
        return None if ok else f'"" (no expectation) or {what}'

    return check


SETTINGS = (
    Setting(
        "updates_hold",
        [],
        'Packages held, as data: a name or glob (e.g. "linux-image-*") is held with apt-mark hold '
        "(every installed package it matches); NAME=VERSION pins it to that version in "
        f"{PIN_FILE} (Pin-Priority 1000). Held packages are never upgraded, unattended or by "
        "`apt-get upgrade`. Removing an entry releases the hold and upgrades the package in the "
        "same run; holds made by hand stay as they are.",
        hold_check,
    ),
    Setting(
        "updates_unattended",
        "off",
        'Unattended upgrades: "off" (sparkrig\'s boxes are GPU boxes, where a kernel or driver '
        "upgrade must be the owner's decision; DGX OS's own recipe and NVIDIA DeepOps turn them "
        'off), "security" (the distribution\'s security pocket only) or "on" (every source). '
        "The apt-daily timers stop or run to match; held packages are never upgraded.",
        one_of(*MODES),
    ),
    Setting(
        "updates_expected_kernel",
        "",
        "The running kernel (uname -r) every box of this group must have, e.g. "
        '"6.17.0-1007-nvidia"; a box that runs another fails the compliance control, naming both. '
        '"": no expectation.',
        optional(_KERNEL_RELEASE, "a kernel release as uname -r prints it"),
    ),
    Setting(
        "updates_expected_driver",
        "",
        'The loaded NVIDIA driver version every box of this group must have, e.g. "580.95.05"; '
        'a box with another (or none loaded) fails the compliance control, naming both. "": no '
        "expectation.",
        optional(_DRIVER_VERSION, "a driver version such as 580.95.05"),
    ),
    Setting(
        "updates_stop_on_unexpected",
        False,
        "Refuse a box whose kernel or driver is not the expected one before anything changes on "
        "it (other hosts go on). False: the deploy only says so.",
        boolean,
    ),
    Setting(
        "updates_systemd_oomd",
        "auto",
        'systemd-oomd: "auto" masks it where earlyoom is the watchdog (watchdog_enabled) and '
        'leaves it alone elsewhere, "off" masks it, "keep" leaves it alone. It kills whole '
        "cgroups under memory pressure (a user's session with every job started from it), racing "
        "earlyoom, which kills one process, the preferred one (docs/updates.md).",
        one_of(*OOMD_CHOICES),
    ),
    Setting(
        "updates_firmware",
        "report",
        'Firmware through fwupd: "report" (the default: reading firmware changes nothing, and '
        "DGX OS updates Spark firmware through fwupd) installs fwupd where it is missing, and the "
        'report, the fleet page and the compliance suite read its devices and versions; "apply" '
        "also installs the updates fwupd's metadata offers (fwupdmgr update) and marks the box as "
        'needing a reboot (/run/reboot-required), which sparkrig never does by itself; "off": '
        "no fwupd, no firmware read.",
        one_of(*FIRMWARE_MODES),
    ),
    Setting(
        "updates_expected_firmware",
        {},
        "The firmware versions every box of this group must have: a device's name as fwupd shows "
        "it (every device of that name) or one of its GUIDs, mapped to a version, e.g. "
        '{"System Firmware": "2.91"}. A box with another version, or without the device, '
        "fails the compliance control, naming the device and both versions.",
        expected_firmware_check,
    ),
    Setting(
        "updates_reboot",
        "never",
        "Whether `sparkrig rollout` reboots a box that needs it (a newer kernel installed than the one "
        "running, /run/reboot-required, a pending firmware update) after its batch converged: "
        '"never" (it is only reported) or "when-required" (drained first: no new spark-run job, '
        "running detached jobs and containers waited for up to updates_drain_timeout; then "
        "rebooted, its kernel and driver checked, proven, undrained; docs/fleets.md).",
        one_of(*REBOOT_CHOICES),
    ),
    Setting(
        "updates_drain_timeout",
        3600,
        "How long, in seconds of wall-clock time, a rollout waits for a draining box's running "
        "detached jobs and containers to end before it leaves the box out, not rebooted (or, with "
        "`sparkrig rollout --force`, stops them). 60 to 604800 (a week).",
        int_range(60, 604800, "seconds"),
    ),
    Setting(
        "updates_kernel_cmdline",
        {"add": [], "remove": []},
        'Kernel parameters to add (NAME or NAME=VALUE, e.g. "kho=off") and to remove (NAME) on the '
        "kernel's command line, applied as DGX OS boots: a GRUB drop-in "
        "(/etc/default/grub.d/90-sparkrig-cmdline.cfg, validated, written atomically) and "
        "update-grub; the next boot takes it (a pending change is a reboot reason for `sparkrig "
        "rollout`), and a control compares /proc/cmdline with it. Empty: no drop-in.",
        cmdline_check,
    ),
    Setting(
        "updates_known_bad",
        [],
        "Kernel, driver and firmware versions known to break this group's boxes, added to the list "
        "shipped with sparkrig (operations/updates/known_bad.toml): each entry a mapping with name, "
        "kind (kernel, driver, firmware), reason, links, running (a glob of the running kernel "
        "release or driver or firmware version; firmware names its fwupd device) and/or packages "
        "(apt package globs -> version globs), optionally profiles. The deploy pins each listed "
        "package version below every other (never installed), the compliance control fails a box "
        "that runs or has installed one, naming the entry, a rollout stops at that batch, and the "
        "report marks it (docs/updates.md).",
        known_bad.settings_check,
    ),
    Setting(
        "updates_boot_history",
        True,
        "Keep the journal across boots (a journald drop-in, "
        "/etc/systemd/journald.conf.d/90-sparkrig-persistent.conf: Storage=persistent) and collect "
        "the kernel's crash dumps (systemd-pstore.service enabled where the host has it), so "
        "`sparkrig report`, the fleet page and the metrics tell how each of the last boots ended: "
        "clean shutdown, reboot by sparkrig's rollout, reboot by someone else, kernel panic, OOM "
        "storm, power lost (docs/updates.md). False: no drop-in (sparkrig's is removed), nothing read.",
        boolean,
    ),
    Setting(
        "updates_boot_count",
        5,
        "How many of the last ended boots the report classifies (updates_boot_history), 1 to 50.",
        int_range(1, 50, "boots"),
    ),
    Setting(
        "updates_packages",
        DEFAULT_PACKAGES,
        "Which installed packages the version report shows as kernel, driver, Docker and toolkit "
        "packages (names or globs).",
        packages_check,
    ),
)

# Its own settings, hardware's (the known-bad entries of the host's profile), watchdog's
# (systemd-oomd is masked where earlyoom is the watchdog, watchdog_enabled) and
# python_stack's (the venv whose torch and vLLM versions are read, and the manifest's vLLM name).
DEFAULTS = defaults((*SETTINGS, *watchdog_settings.SETTINGS, *stack_locks.SETTINGS, *hardware_settings.SETTINGS))

declare(__name__, SETTINGS)
