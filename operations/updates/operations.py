"""Updates: the files it writes (validated by apt itself first) and the operations that hold
packages and mask systemd-oomd."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import rendering
from sparkrig.packages import locked

from .settings import parse_hold

APT_CONF = "/etc/apt/apt.conf.d/99sparkrig-updates"
TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")
OOMD_UNITS = ("systemd-oomd.service", "systemd-oomd.socket")
UNATTENDED_PACKAGE = "unattended-upgrades"
FWUPD_PACKAGE = "fwupd"
FIRMWARE_APPLY_TIMEOUT_S = 1800

# Security pockets of Debian and Ubuntu, as unattended-upgrades matches origins.
SECURITY_ORIGINS = (
    "origin=Debian,codename=${distro_codename}-security,label=Debian-Security",
    "origin=Debian,codename=${distro_codename},label=Debian-Security",
    "origin=Ubuntu,archive=${distro_codename}-security",
)
ALL_ORIGINS = ("origin=*",)

_GLOB_REGEX = {"*": ".*", "?": ".", ".": "[.]", "+": "[+]"}


def glob_regex(name: str) -> str:
    """A package name or glob as unattended-upgrades' Package-Blacklist reads it (a Python
    regex; no backslash, which apt.conf's strings do not take)."""
    return "^" + "".join(_GLOB_REGEX.get(c, c) for c in name) + "$"


def render_apt_conf(mode: str, holds: Sequence[str]) -> str:
    origins = SECURITY_ORIGINS if mode == "security" else ALL_ORIGINS
    names = [parse_hold(entry)[0] for entry in holds]
    return rendering.render("updates/apt.conf.j2", mode=mode, origins=origins, blacklist=[glob_regex(n) for n in names])


def render_pins(holds: Sequence[str]) -> str | None:
    pins = [(name, version) for name, version in map(parse_hold, holds) if version]
    return rendering.render("updates/holds.pref.j2", pins=pins) if pins else None


def render_record(names: Iterable[str]) -> str:
    return "".join(f"{name}\n" for name in sorted(names))


# Each record exactly Package, Pin (a version), Pin-Priority 1000, as render_pins writes
# them; then apt itself must read the file without a word (templates/updates/pin-check.sh).
PIN_VALIDATOR = ("sh", "-c", rendering.script("updates/pin-check.sh"), "sh")


def render_cmdline(setting: Mapping[str, Sequence[str]]) -> str | None:
    """The GRUB drop-in for ``updates_kernel_cmdline``, None when it adds and removes nothing."""
    add, remove = list(setting.get("add", [])), list(setting.get("remove", []))
    if not add and not remove:
        return None
    names = [word.partition("=")[0] for word in [*add, *remove]]
    keys = " | ".join(f"{name} | {name}=*" for name in names)
    return rendering.render("updates/grub-cmdline.cfg.j2", add=add, remove=remove, keys=keys)


# sh must read the drop-in, and sourced it must leave each added parameter once and no removed
# one (templates/updates/grub-cmdline-check.sh).
CMDLINE_VALIDATOR = ("sh", "-c", rendering.script("updates/grub-cmdline-check.sh"), "sh")


@operation()
def grub_updated():
    """
    Regenerate GRUB's configuration (update-grub, from /), so the next boot takes the kernel's
    command line the drop-in asks.
    """
    yield StringCommand("cd / && update-grub")


# Each record exactly Explanation, Package, Pin, Pin-Priority -1, as known_bad.render_pins
# writes them; then apt must read the file without a word (templates/updates/known-bad-check.sh).
KNOWN_BAD_VALIDATOR = ("sh", "-c", rendering.script("updates/known-bad-check.sh"), "sh")
# journald's drop-in: one [Journal] section of journald's keys (templates/updates/journald-check.sh).
JOURNALD_VALIDATOR = ("sh", "-c", rendering.script("updates/journald-check.sh"), "sh")
# apt-config parses the file as apt will (a syntax error fails it).
APT_CONF_VALIDATOR = ("sh", "-c", rendering.script("updates/apt-conf-check.sh"), "sh")


@operation()
def marked(hold: Sequence[str] = (), unhold: Sequence[str] = ()):
    """
    Hold and release packages with apt-mark, once the package manager's locks are free.

    + hold: package names to hold
    + unhold: package names to release
    """
    for verb, names in (("hold", hold), ("unhold", unhold)):
        if names:
            yield locked(["apt-mark", verb, *names])


@operation()
def oomd_masked(units: Sequence[str]):
    """
    Stop and mask systemd units (a package upgrade cannot start them again).

    + units: the units
    """
    yield StringCommand("systemctl", "mask", "--now", *units)


@operation()
def firmware_applied(devices: Sequence[str], timeout_s: int = FIRMWARE_APPLY_TIMEOUT_S):
    """
    Install the firmware updates fwupd offers (``fwupdmgr update``) and mark the box as
    needing a reboot (``/run/reboot-required``); the reboot is the rollout's.

    + devices: the devices with an update (what the deploy says it updates)
    + timeout_s: fwupdmgr is stopped after this long
    """
    if devices:
        yield StringCommand(
            "sh",
            "-c",
            QuoteString(rendering.script("updates/firmware-apply.sh")),
            "sparkrig-firmware-apply",
            str(int(timeout_s)),
        )
