"""
Updates: kernel and NVIDIA driver held alike, upgrades on the owner's terms, versions read.

- ``updates_hold`` holds packages as data: ``NAME`` (a name or glob) is held with
  ``apt-mark hold`` (every installed package it matches); ``NAME=VERSION`` is pinned to
  that version in ``/etc/apt/preferences.d/sparkrig-holds`` (written atomically,
  checked by apt before it takes effect). What sparkrig held is recorded in
  ``/var/lib/sparkrig/updates-held``: a hold dropped from the setting is released
  (``apt-mark unhold``, or the pin removed) and the package upgraded in the same run.
  Holds made by hand are never released.
- ``updates_unattended``: ``off`` (the default: sparkrig's boxes are GPU boxes, where a
  kernel or driver upgrade must be the owner's decision), ``security`` or ``on``, in
  ``/etc/apt/apt.conf.d/99sparkrig-updates`` (read after the distribution's files, so
  it wins), with the apt-daily timers stopped or running to match. Held packages are
  never upgraded unattended.
- ``updates_expected_kernel`` / ``updates_expected_driver``: the running kernel and the
  loaded driver a box must have; with ``updates_stop_on_unexpected`` a box that runs
  another is refused before anything changes on it (other hosts go on).
- systemd-oomd is masked where earlyoom is the watchdog (see docs/updates.md).

:class:`Versions` reads, in the host's one reading, what the report
(``python -m tools.report``) shows: OS and DGX OS release, running and installed
kernel, installed and loaded NVIDIA driver, CUDA, Docker, the container toolkit, and
the venv's torch and vLLM (from their ``.dist-info/METADATA``, read as the venv's
owner: root runs nothing the venv holds).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.operations import files, systemd

from sparkrig import atomic, reading
from sparkrig.packages import installed as install_packages
from sparkrig.packages import locked
from sparkrig.settings import ALL_DEFAULTS, defaults, resolved

from .settings import (  # noqa: F401 (re-exported)
    _DRIVER_VERSION,
    _KERNEL_RELEASE,
    _PACKAGE,
    _VERSION,
    DEFAULT_PACKAGES,
    MODES,
    OOMD_CHOICES,
    PACKAGE_COLUMNS,
    PIN_FILE,
    SETTINGS,
    hold_check,
    optional,
    packages_check,
    parse_hold,
)

APT_CONF = "/etc/apt/apt.conf.d/99sparkrig-updates"
RECORD = "/var/lib/sparkrig/updates-held"
TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")
OOMD_UNITS = ("systemd-oomd.service", "systemd-oomd.socket")
UNATTENDED_PACKAGE = "unattended-upgrades"
CUDA_LINK = "/usr/local/cuda"
NVIDIA_PROC = "/proc/driver/nvidia/version"
REBOOT_REQUIRED = "/run/reboot-required"

# Security pockets of Debian and Ubuntu, as unattended-upgrades matches origins.
SECURITY_ORIGINS = (
    "origin=Debian,codename=${distro_codename}-security,label=Debian-Security",
    "origin=Debian,codename=${distro_codename},label=Debian-Security",
    "origin=Ubuntu,archive=${distro_codename}-security",
)
ALL_ORIGINS = ("origin=*",)














# The facts ---------------------------------------------------------------------------


def _sh_glob_words(names: Iterable[str]) -> list:
    return [QuoteString(name) for name in names]


# Reads each .dist-info's METADATA as the venv's owner (root runs only runuser and sed,
# which root owns; a link in the venv leads only where its owner could read anyway), as
# every read of a user's file is made (atomic.USER_READ: never blocks, at most
# METADATA_LIMIT bytes; torch's is about 30 KB).
METADATA_LIMIT = 1 << 20
# Arguments: the venv, then the normalised distribution names.
_PYTHON_VERSIONS = r"""
venv=$1; shift
[ -d "$venv/lib" ] || exit 0
owner=$(stat -c %U "$venv") || exit
as_owner() { if [ "$(id -u)" = 0 ] && [ "$owner" != root ]; then runuser -u "$owner" -- "$@"; else "$@"; fi; }
for name in "$@"; do
  find "$venv/lib" -mindepth 3 -maxdepth 3 -type d -path "*/site-packages/$name-*.dist-info" |
  while IFS= read -r dir; do
    version=$(as_owner """ + atomic.user_read('"$dir/METADATA"', METADATA_LIMIT) + r""" | sed -n 's/^Version: //p;/^$/q') || exit
    echo "python $name ${version:-?}"
  done || exit
done
"""

# The loaded driver: the kernel module's own line, else a root-owned nvidia-smi's answer
# (no line: no driver loaded).
_DRIVER = r"""
if [ -r /proc/driver/nvidia/version ]; then sed -n '1s/^/nvproc /p' /proc/driver/nvidia/version
elif smi=$(command -v nvidia-smi) && [ -n "$(find "$smi" -maxdepth 0 -user root ! -perm /022)" ]; then
  "$smi" --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sed 's/^/nvsmi /'
fi
true
"""

_CUDA = r"""
c=$(readlink -f /usr/local/cuda) && [ -d "$c" ] && {
  echo "cudadir $c"
  [ -f "$c/version.json" ] && sed 's/^/cudajson /' "$c/version.json"
}
true
"""


def dist_name(name: str) -> str:
    """A distribution's name as its ``.dist-info`` directory spells it (PEP 427)."""
    return re.sub(r"[-_.]+", "_", name).lower()


class Versions(FactBase):
    """
    Returns the versions a fleet wants alike, and the host's holds.

    + packages: column -> package names or globs (``updates_packages``)
    + holds: the names or globs of ``updates_hold`` held with apt-mark (installed matches listed)
    + venv: the Python venv whose torch and vLLM are read
    + python: the distributions read in it (normalised names)

    .. code:: python

        {"os": {"ID": "ubuntu", "VERSION_ID": "24.04", "PRETTY_NAME": "Ubuntu 24.04.3 LTS"},
         "dgx": {"DGX_SWBUILD_VERSION": "7.2.3", "DGX_OTA_VERSION": "7.4.0"},
         "kernel": "6.17.0-1008-nvidia", "boot_kernels": ["6.17.0-1008-nvidia"],
         "reboot_required": False,
         "packages": {"kernel": {"linux-image-6.17.0-1008-nvidia": "6.17.0-1008.8"}, ...},
         "hold_matches": {"nvidia-driver-580-open": "580.95.05-0ubuntu1"},
         "held": ["nvidia-driver-580-open"], "record": [...],
         "driver": "580.95.05", "cuda": "13.0.2", "python": {"torch": "2.11.0", "vllm": "0.20.2"}}
    """

    def command(
        self,
        packages: Sequence = (),
        holds: Sequence[str] = (),
        venv: str = "",
        python: Sequence[str] = (),
    ) -> StringCommand:
        bits: list = [
            "sed -n 's/^\\(ID\\|VERSION_ID\\|PRETTY_NAME\\)=/os \\1=/p' /etc/os-release;",
            "if [ -f /etc/dgx-release ]; then sed -n 's/^\\(DGX_[A-Z_]*VERSION\\)=/dgx \\1=/p'",
            "/etc/dgx-release; fi;",
            "echo kernel $(uname -r);",
            "for f in /boot/vmlinuz-*; do [ -f \"$f\" ] && echo boot \"${f#/boot/vmlinuz-}\"; done;",
            f"if [ -e {REBOOT_REQUIRED} ]; then echo reboot; fi;",
        ]
        for column, names in dict(packages).items():
            if names:
                bits += [
                    f"dpkg-query -W -f='pkg {column} ${{db:Status-Abbrev}} ${{Package}} ${{Version}}\\n'",
                    *_sh_glob_words(names), "2>/dev/null;",
                ]
        if holds:
            bits += [
                "dpkg-query -W -f='pkg hold ${db:Status-Abbrev} ${Package} ${Version}\\n'",
                *_sh_glob_words(holds), "2>/dev/null;",
            ]
        bits += [
            "dpkg --get-selections | awk '$2 == \"hold\" { sub(/:.*/, \"\", $1); print \"held\", $1 }';",
            f"if [ -f {RECORD} ]; then sed 's/^/record /' {RECORD}; fi;",
            "sh -c", QuoteString(_DRIVER), ";",
            "sh -c", QuoteString(_CUDA), ";",
        ]
        if venv and python:
            bits += ["sh -c", QuoteString(_PYTHON_VERSIONS), "sparkrig-python-versions", QuoteString(venv),
                     *[QuoteString(name) for name in python], ";"]
        return StringCommand(*bits, "true")

    @atomic.parses
    def process(self, output: list[str]) -> dict:
        found = self.default()
        cuda_json: list[str] = []
        cuda_dir = None
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "os" or kind == "dgx":
                key, _, value = rest.partition("=")
                words = shlex.split(value)
                found[kind][key] = words[0] if words else ""
            elif kind == "kernel":
                if not _KERNEL_RELEASE.fullmatch(rest):
                    raise ValueError(f"uname -r printed {rest!r}")
                found["kernel"] = rest
            elif kind == "boot":
                found["boot_kernels"].append(rest)
            elif kind == "reboot":
                found["reboot_required"] = True
            elif kind == "pkg":
                # "kernel ii  NAME VERSION" ("hi": held; no version: known, not installed)
                words = rest.split()
                if len(words) not in (3, 4):
                    raise ValueError(f"dpkg-query printed {rest[:120]!r}")
                column, status, name, version = (words + [""])[:4]
                if status[1:2] == "i" and version:
                    target = found["hold_matches"] if column == "hold" else found["packages"][column]
                    target[name] = version
            elif kind == "held":
                found["held"].append(rest)
            elif kind == "record":
                if not _PACKAGE.fullmatch(rest):
                    raise ValueError(f"{RECORD} holds {rest!r}")
                found["record"].append(rest)
            elif kind == "nvproc":
                match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+){1,2})\s", rest + " ")
                if not match:
                    raise ValueError(f"{NVIDIA_PROC} says {rest[:120]!r}")
                found["driver"] = match[1]
            elif kind == "nvsmi":
                versions = set(rest.split())
                if len(versions) != 1 or not _DRIVER_VERSION.fullmatch(next(iter(versions))):
                    raise ValueError(f"nvidia-smi said {rest[:120]!r}")
                found["driver"] = versions.pop()
            elif kind == "cudadir":
                cuda_dir = rest
            elif kind == "cudajson":
                cuda_json.append(rest)
            elif kind == "python":
                name, version = rest.split(" ")
                found["python"][name] = version
            else:
                raise ValueError(f"unexpected line {line[:120]!r}")
        if cuda_json:
            found["cuda"] = str(json.loads("\n".join(cuda_json))["cuda"]["version"])
        elif cuda_dir:
            match = re.fullmatch(r".*/cuda-([0-9]+\.[0-9]+)", cuda_dir)
            found["cuda"] = match[1] if match else None
        return found

    @staticmethod
    def default() -> dict:
        return {
            "os": {}, "dgx": {}, "kernel": None, "boot_kernels": [], "reboot_required": False,
            "packages": {column: {} for column in PACKAGE_COLUMNS}, "hold_matches": {}, "held": [],
            "record": [], "driver": None, "cuda": None, "python": {},
        }


def python_names(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """torch and the manifest's vLLM (its name may be a stand-in's), as .dist-info names."""
    manifest = settings.get("python_stack")
    vllm = (manifest.get("vllm") or {}) if isinstance(manifest, Mapping) else {}
    return (dist_name("torch"), dist_name(vllm.get("name") or "vllm"))


def versions_part(settings: Mapping[str, Any]) -> reading.Part:
    """The host's :class:`Versions`, as the deploy and the report read it."""
    settings = {**defaults(SETTINGS), **settings}
    holds = sorted({name for name, version in map(parse_hold, settings["updates_hold"]) if version is None})
    return reading.part(
        Versions,
        packages=dict(settings["updates_packages"]),
        holds=holds,
        venv=settings.get("python_venv_path", ""),
        python=python_names(settings),
    )


STATE = reading.part(
    atomic.HostState,
    paths=(PIN_FILE, APT_CONF, RECORD),
    units=(*TIMERS, *OOMD_UNITS),
    packages=(UNATTENDED_PACKAGE,),
)


@reading.planner
def reads(settings):
    return [versions_part(settings), STATE]


# What the facts mean ---------------------------------------------------------------------


def _version_key(text: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


def pending_reboot(facts: Mapping[str, Any]) -> str | None:
    """Why a reboot is pending (a newer kernel installed than the one running), or None."""
    boot = sorted(facts["boot_kernels"], key=_version_key)
    if boot and facts["kernel"] and boot[-1] != facts["kernel"]:
        return f"kernel {boot[-1]} is installed, {facts['kernel']} is running"
    if facts["reboot_required"]:
        return f"{REBOOT_REQUIRED} exists"
    return None


def unexpected(settings: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    """Each expected version the host does not run, naming both."""
    found = []
    kernel, driver = settings["updates_expected_kernel"], settings["updates_expected_driver"]
    if kernel and facts["kernel"] != kernel:
        found.append(f"kernel {facts['kernel']} is running, updates_expected_kernel is {kernel}")
    if driver and facts["driver"] != driver:
        found.append(f"NVIDIA driver {facts['driver'] or '(none loaded)'} is loaded, updates_expected_driver is {driver}")
    return found


def oomd_off(settings: Mapping[str, Any]) -> bool:
    """Whether systemd-oomd is to be masked (``auto``: where earlyoom is the watchdog)."""
    choice = settings["updates_systemd_oomd"]
    return choice == "off" or (choice == "auto" and bool(settings.get("watchdog_enabled", True)))


_GLOB_REGEX = {"*": ".*", "?": ".", ".": "[.]", "+": "[+]"}


def glob_regex(name: str) -> str:
    """A package name or glob as unattended-upgrades' Package-Blacklist reads it (a Python
    regex; no backslash, which apt.conf's strings do not take)."""
    return "^" + "".join(_GLOB_REGEX.get(c, c) for c in name) + "$"


def render_apt_conf(mode: str, holds: Sequence[str]) -> str:
    origins = SECURITY_ORIGINS if mode == "security" else ALL_ORIGINS
    names = [parse_hold(entry)[0] for entry in holds]
    return atomic.render("updates/apt.conf.j2", mode=mode, origins=origins, blacklist=[glob_regex(n) for n in names])


def render_pins(holds: Sequence[str]) -> str | None:
    pins = [(name, version) for name, version in map(parse_hold, holds) if version]
    return atomic.render("updates/holds.pref.j2", pins=pins) if pins else None


def render_record(names: Iterable[str]) -> str:
    return "".join(f"{name}\n" for name in sorted(names))


# Each record exactly Package, Pin (a version), Pin-Priority 1000, as render_pins writes
# them; then apt itself must read the file without a word (preferences alone: an empty
# directory for the parts).
_PIN_CHECK = r"""
awk '/^#/ { next }
  /^$/ { if (s != 0 && s != 3) { bad = 1; exit } s = 0; next }
  s == 0 && /^Package: [a-z0-9*?][a-z0-9+.*?-]*$/ { s = 1; next }
  s == 1 && /^Pin: version [A-Za-z0-9*][A-Za-z0-9.+~:*-]*$/ { s = 2; next }
  s == 2 && /^Pin-Priority: 1000$/ { s = 3; next }
  { bad = 1; exit }
  END { if (bad || (s != 0 && s != 3)) exit 1 }' "$1" || exit
parts=$(mktemp -d) || exit
said=$(apt-cache -o Dir::Etc::Preferences="$1" -o Dir::Etc::PreferencesParts="$parts" policy 2>&1 >/dev/null)
status=$?
rmdir "$parts"
[ "$status" -eq 0 ] && [ -z "$said" ] || { echo "$said" >&2; exit 1; }
"""
PIN_VALIDATOR = ("sh", "-c", _PIN_CHECK, "sh")
# apt-config parses the file as apt will (a syntax error fails it).
APT_CONF_VALIDATOR = ("sh", "-c", 'apt-config -c "$1" dump >/dev/null && ! apt-config -c "$1" dump 2>&1 >/dev/null | grep .', "sh")


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


@deploy("Updates", data_defaults=ALL_DEFAULTS)
def updates():
    """
    Check the expected kernel and driver, hold packages, set unattended upgrades and
    systemd-oomd as the settings say.

    Settings: ``updates_hold``, ``updates_unattended``, ``updates_expected_kernel``,
    ``updates_expected_driver``, ``updates_stop_on_unexpected``, ``updates_systemd_oomd``,
    ``updates_packages``; see docs/settings.md.
    """
    # Every setting resolved as the reading's planner saw them (the venv's path, the
    # manifest's vLLM, watchdog_enabled): the same parts, so no command of their own.
    settings = resolved(host.data.dict())
    facts = reading.value(versions_part(settings))
    state = reading.value(STATE)
    if atomic.fact_failed():
        return
    wrong = unexpected(settings, facts)
    if wrong and settings["updates_stop_on_unexpected"]:
        atomic.refused(
            name="The box runs the expected kernel and driver (updates_stop_on_unexpected)",
            message="; ".join(wrong) + ": nothing changed on this host (updates_stop_on_unexpected)",
        )
        return
    for line in wrong:
        atomic.detail(f"updates: {line}")
    reboot = pending_reboot(facts)
    if reboot:
        atomic.detail(f"updates: a reboot is pending ({reboot})")

    # Holds: pins, then apt-mark, then what was released is upgraded.
    holds = settings["updates_hold"]
    pins = render_pins(holds)
    pin_state = state["files"].get(PIN_FILE)
    if pins is None:
        if pin_state is not None:
            files.file(name=f"No version pins ({PIN_FILE})", path=PIN_FILE, present=False)
    elif not atomic.up_to_date(pin_state, pins):
        atomic.file(
            name=f"Version pins ({PIN_FILE})", dest=PIN_FILE, current=pin_state, content=pins, validate=PIN_VALIDATOR
        )
    versions = dict(map(parse_hold, holds))
    marks = [name for name, version in versions.items() if version is None]
    wanted = {name for name in facts["hold_matches"] if any(fnmatch.fnmatchcase(name, g) for g in marks)}
    pinned = {name for name, version in versions.items() if version and not set(name) & set("*?")}
    held, record = set(facts["held"]), set(facts["record"])
    to_hold = sorted(wanted - held)
    # Released: what sparkrig held or pinned and the setting no longer names. It stays in
    # the record until its upgrade went through, so a failed upgrade is tried again.
    released = sorted(record - wanted - pinned)
    unhold = sorted(set(released) & held)
    if to_hold or unhold:
        marked(name="Packages held as updates_hold says (apt-mark)", hold=to_hold, unhold=unhold)
    if released:
        atomic.detail(f"updates: released, upgrading: {' '.join(released)}")
        install_packages(name="Upgrade what a released hold kept back", packages=released, only_upgrade=True)
    new_record = (wanted & (record | set(to_hold))) | pinned
    record_text = render_record(new_record) if new_record else None
    record_state = state["files"].get(RECORD)
    if record_text is None:
        if record_state is not None:
            files.file(name=f"What sparkrig holds ({RECORD})", path=RECORD, present=False)
    elif not atomic.up_to_date(record_state, record_text):
        atomic.file(name=f"What sparkrig holds ({RECORD})", dest=RECORD, current=record_state, content=record_text)

    # Unattended upgrades and the timers that run them.
    mode = settings["updates_unattended"]
    conf = render_apt_conf(mode, holds)
    if mode != "off" and state["packages"].get(UNATTENDED_PACKAGE) is None:
        install_packages(name="Install unattended-upgrades", packages=[UNATTENDED_PACKAGE])
    conf_state = state["files"].get(APT_CONF)
    if not atomic.up_to_date(conf_state, conf):
        atomic.file(
            name=f"Unattended upgrades as updates_unattended says ({APT_CONF})",
            dest=APT_CONF, current=conf_state, content=conf, validate=APT_CONF_VALIDATOR,
        )
    running = mode != "off"
    for timer in host.loop(TIMERS):
        unit = state["units"].get(timer, {})
        if unit.get("enabled") not in ("enabled", "disabled"):
            continue  # absent (or masked by the owner): nothing to keep consistent
        if (unit.get("active") == "active", unit.get("enabled") == "enabled") != (running, running):
            systemd.service(
                name=f"{timer} runs as updates_unattended says",
                service=timer, running=running, enabled=running,
            )

    # systemd-oomd.
    if oomd_off(settings):
        present = [
            u for u in OOMD_UNITS
            if state["units"].get(u, {}).get("enabled") not in (None, "unknown", "not-found", "masked")
            or state["units"].get(u, {}).get("active") == "active"
        ]
        if present:
            oomd_masked(name="systemd-oomd is masked (earlyoom is the watchdog)", units=present)


@operation()
def oomd_masked(units: Sequence[str]):
    """
    Stop and mask systemd units (a package upgrade cannot start them again).

    + units: the units
    """
    yield StringCommand("systemctl", "mask", "--now", *units)
