"""Updates: kernel, driver and firmware versions known to break a hardware profile. The list
shipped with sparkrig (known_bad.toml, package data) and the owner's (``updates_known_bad``),
checked alike; which apply to a host; the apt preferences that keep them from being
installed; and which of them a host runs."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

KINDS = ("kernel", "driver", "firmware")
FIELDS = {"name", "kind", "profiles", "running", "packages", "reason", "links", "device"}
REQUIRED = {"name", "kind", "reason", "links"}

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
# What runs (a kernel release, a driver or firmware version), as a glob.
_RUNNING = re.compile(r"[A-Za-z0-9*?][A-Za-z0-9._+~:*?-]{0,127}")
# apt preferences' Package (a name or glob) and Pin: version (a version or glob).
_PACKAGE = re.compile(r"[a-z0-9*?][a-z0-9+.*?-]{0,127}")
_VERSION = re.compile(r"[A-Za-z0-9*][A-Za-z0-9.+~:*-]{0,127}")
_LINK = re.compile(r"https://[A-Za-z0-9.-]+(/[A-Za-z0-9._~%/+-]*)?")
# Printable text, no control character (it is shown in failures and on the fleet page).
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,600}")
_DEVICE = re.compile(r"(?=\S)[^\x00-\x1f\x7f]{1,128}(?<=\S)")

ALLOWED = (
    "a list of entries, each a mapping with name (a-z 0-9 . _ -), kind (kernel, driver or firmware), "
    "reason (text), links (https URLs), and at least one of running (a glob of the running kernel "
    "release or driver or firmware version; firmware also names its fwupd device) and packages "
    "(apt package globs -> the version globs never to install), optionally profiles (hardware "
    "profile names; none: every host); names unique, with the shipped list's too"
)


def entry_problem(entry: Any) -> str | None:
    """What is wrong with one entry (None: nothing)."""
    if not isinstance(entry, Mapping) or not REQUIRED <= set(entry) or not set(entry) <= FIELDS:
        return f"bad entry: {str(entry)[:120]!r}"
    name = entry["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"bad name: {str(name)[:80]!r}"
    checks = [
        ("kind", entry["kind"] in KINDS),
        ("reason", isinstance(entry["reason"], str) and _TEXT.fullmatch(entry["reason"])),
        (
            "links",
            isinstance(entry["links"], list)
            and entry["links"]
            and all(isinstance(u, str) and _LINK.fullmatch(u) for u in entry["links"]),
        ),
        (
            "profiles",
            isinstance(entry.get("profiles", []), list)
            and all(isinstance(p, str) and _PROFILE.fullmatch(p) for p in entry.get("profiles", [])),
        ),
        ("running", isinstance(entry.get("running", "*"), str) and _RUNNING.fullmatch(entry.get("running", "*"))),
        (
            "packages",
            isinstance(entry.get("packages", {}), Mapping)
            and all(
                isinstance(p, str) and _PACKAGE.fullmatch(p) and isinstance(v, str) and _VERSION.fullmatch(v)
                for p, v in entry.get("packages", {}).items()
            ),
        ),
        (
            "device",
            (entry["kind"] == "firmware") == ("device" in entry)
            and ("device" not in entry or (isinstance(entry["device"], str) and _DEVICE.fullmatch(entry["device"]))),
        ),
        ("running or packages", "running" in entry or bool(entry.get("packages"))),
    ]
    for what, ok in checks:
        if not ok:
            return f"bad {what} of {name!r}"
    return None


def list_problem(entries: Any, taken: Sequence[str] = ()) -> str | None:
    """What is wrong with a list of entries (``taken``: names already used)."""
    if not isinstance(entries, (list, tuple)):
        return "not a list"
    names = list(taken)
    for entry in entries:
        problem = entry_problem(entry)
        if problem:
            return problem
        names.append(entry["name"])
    if len(set(names)) != len(names):
        return f"a name twice: {sorted({n for n in names if names.count(n) > 1})}"
    return None


def shipped() -> list[dict]:
    """The list shipped with sparkrig (checked by tests/unit/operations/test_known_bad.py)."""
    text = resources.files(__package__).joinpath("known_bad.toml").read_text()
    return list(tomllib.loads(text)["known_bad"])


def settings_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    problem = list_problem(value, [e["name"] for e in shipped()])
    return f"{ALLOWED} ({problem})" if problem else None


def applicable(settings: Mapping[str, Any]) -> list[dict]:
    """The entries (shipped, then the owner's) that apply to the host's hardware profile."""
    profile = settings.get("hardware_profile", "auto")
    return [
        entry
        for entry in [*shipped(), *settings.get("updates_known_bad", [])]
        if not entry.get("profiles") or profile in entry["profiles"]
    ]


def package_globs(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every package glob the entries name, once, sorted (the Versions fact reads what is installed)."""
    return sorted({glob for entry in entries for glob in entry.get("packages", {})})


def render_pins(entries: Sequence[Mapping[str, Any]]) -> str | None:
    """apt preferences pinning each entry's package versions below every other (Pin-Priority
    -1: never installed, not even as an upgrade), None where no entry names a package."""
    records = [
        f"Explanation: known-bad {entry['name']}\nPackage: {package}\nPin: version {version}\nPin-Priority: -1\n"
        for entry in entries
        for package, version in sorted(entry.get("packages", {}).items())
    ]
    if not records:
        return None
    head = "# sparkrig: versions known to break this box's hardware profile (updates_known_bad, docs/updates.md)\n"
    return head + "\n".join(records)


def _matches(text: str | None, glob: str) -> bool:
    return bool(text) and fnmatch.fnmatchcase(text, glob)


def running(
    entries: Sequence[Mapping[str, Any]],
    versions: Mapping[str, Any],
    firmware: Mapping[str, Any] | None = None,
) -> list[str]:
    """One line per entry the host runs or has installed: the entry, what matched, why, and
    where to read more. ``versions``: the Versions fact with the ``known_bad`` column of
    :func:`package_globs`; ``firmware``: the Firmware fact (None: not read)."""
    installed = versions.get("packages", {}).get("known_bad", {})
    devices = (firmware or {}).get("devices", [])
    found = []
    for entry in entries:
        seen = []
        glob = entry.get("running")
        if glob and entry["kind"] == "kernel" and _matches(versions.get("kernel"), glob):
            seen.append(f"running kernel {versions['kernel']}")
        if glob and entry["kind"] == "driver" and _matches(versions.get("driver"), glob):
            seen.append(f"running driver {versions['driver']}")
        if glob and entry["kind"] == "firmware":
            seen += [
                f"firmware {d['name']} {d['version']}"
                for d in devices
                if entry["device"] in (d["name"], *d.get("guids", [])) and _matches(d["version"], glob)
            ]
        for package, version in sorted(entry.get("packages", {}).items()):
            seen += [
                f"installed {name} {have}"
                for name, have in sorted(installed.items())
                if fnmatch.fnmatchcase(name, package) and _matches(have, version)
            ]
        if seen:
            found.append(
                f"known-bad {entry['name']} ({entry['kind']}): {', '.join(seen)}: {entry['reason']} "
                f"({' '.join(entry['links'])})"
            )
    return found


def names(lines: Sequence[str]) -> list[str]:
    """The entry names of :func:`running`'s lines."""
    return [line.split(" ", 2)[1] for line in lines]
