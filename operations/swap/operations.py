"""Swap: the operation that turns it off and keeps it off, and the unit names it masks."""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.command import PyinfraCommand

from sparkrig import atomic, host_output, messages, reading, rendering

from .facts import (
    DISABLED,
    FSTAB,
    UNIT_DIR,
    SwapFiles,
    SwapSources,
    active_swap_sources,
    disabled_swap_sources,
    fstab_lines,
    is_swap_entry,
)

FSTAB_BACKUP = "/etc/fstab.sparkrig.bak"
# A unit file an administrator wrote in UNIT_DIR is renamed to this suffix: a mask
# (a link to /dev/null of the same name) cannot take its place otherwise.
SET_ASIDE = ".sparkrig-disabled"
ZRAM_SETUP = "systemd-zram-setup@.service"  # systemd-zram-generator's template
RUNNING = ("active", "activating", "reloading")

_TAGS = {"LABEL": "label", "UUID": "uuid", "PARTUUID": "partuuid", "PARTLABEL": "partlabel"}
_DEVNODE_CHARS = frozenset(string.ascii_letters + string.digits + "#+-.:=@_")  # udev keeps these
_UNIT_CHARS = frozenset((string.ascii_letters + string.digits + ":_.").encode())  # systemd keeps these


def disable_swap_entries(content: bytes) -> bytes:
    """The fstab with each active swap entry prefixed by :data:`DISABLED`; every other
    byte (line ends, blanks, a missing last newline) as it was."""
    return b"".join(DISABLED + line if is_swap_entry(line) else line for line in fstab_lines(content))


# unit names, as systemd's fstab-generator makes them ----------------------------


def _devnode_escape(value: str) -> str:
    """udev's encode_devnode_name: multibyte UTF-8 kept, other bytes outside
    ``[0-9A-Za-z#+-.:=@_]`` as ``\\xNN``."""
    out = []
    for char in value:
        if char in _DEVNODE_CHARS or (ord(char) > 0x7F and not 0xDC80 <= ord(char) <= 0xDCFF):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))
    return "".join(out)


def udev_node(source: str) -> str:
    """The device path systemd uses for an fstab source: ``LABEL=``, ``UUID=``,
    ``PARTUUID=`` and ``PARTLABEL=`` become ``/dev/disk/by-*/…``; paths stay as they are."""
    tag, _, value = source.partition("=")
    if tag not in _TAGS:
        return source
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        value = value[1:-1]
    return f"/dev/disk/by-{_TAGS[tag]}/{_devnode_escape(value)}"


def unit_name_from_path(path: str, suffix: str) -> str:
    """``systemd-escape --path --suffix=SUFFIX PATH``."""
    name = "/".join(part for part in path.split("/") if part not in ("", "."))
    out = []
    for index, byte in enumerate(name.encode("utf-8", "surrogateescape")):
        if byte == ord("/"):
            out.append("-")
        elif byte in _UNIT_CHARS and not (index == 0 and byte == ord(".")):
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    return ("".join(out) or "-") + "." + suffix


def swap_unit_name(source: str) -> str:
    """The swap unit systemd's fstab-generator makes of an fstab source."""
    return unit_name_from_path(udev_node(source), "swap")


# plan ----------------------------------------------------------------------------


def _fstab_swap_sources(found: Mapping[str, Any]) -> list[str]:
    """Sources of the fstab's swap entries, active or disabled by sparkrig."""
    content = found["fstab"]["content"] if found["fstab"] else b""
    return active_swap_sources(content) + disabled_swap_sources(content)


def units_to_mask(found: Mapping[str, Any]) -> list[str]:
    """Every swap and zram unit that could turn swap on: the ones systemd's
    fstab-generator makes (or made) of the fstab's swap entries, every swap and zram
    unit file systemd lists, and zram-generator's template where a config asks for it."""
    names = {swap_unit_name(source) for source in _fstab_swap_sources(found)}
    names |= set(found["unit_files"])
    if found["zram_generator_configs"]:
        names.add(ZRAM_SETUP)
    return sorted(names)


def swap_file_candidates(found: Mapping[str, Any]) -> list[str]:
    """Paths of the fstab's swap entries (active, or disabled by sparkrig) that name a
    file: absolute, printable (no newline), not a ``TAG=value``."""
    return sorted({s for s in _fstab_swap_sources(found) if s.startswith("/") and s.isprintable()})


def _template(unit: str) -> str:
    """``foo@bar.service`` → ``foo@.service``; other names unchanged."""
    prefix, at, rest = unit.partition("@")
    return f"{prefix}@{rest[rest.rindex('.') :]}" if at and "." in rest else unit


# operation -----------------------------------------------------------------------


@operation()
def disabled(backup: str = FSTAB_BACKUP, remove_files: bool = False):
    """
    Turn swap off now and keep it off across reboots.

    + backup: where the old /etc/fstab is copied when the file changes (only then)
    + remove_files: also delete the swap files of the fstab's swap entries (regular
      files holding a swap signature), once swap is off

    In order: the swap entries of /etc/fstab are commented out (validated by
    templates/swap/fstab-check.sh, written atomically); the swap and zram units are
    masked and stopped (an administrator's unit file in /etc/systemd/system is first
    renamed ``NAME.sparkrig-disabled``); ``swapoff -a`` runs while /proc/swaps lists
    swap, except in a container, whose /proc/swaps is its host's.

    **Example:**

    .. code:: python

        swap.disabled(name="No swap", backup="/root/fstab.bak", remove_files=True)
    """
    found = reading.fact(SwapSources)
    if found is None:
        return
    yield from _fstab_commands(found, backup)
    yield from _unit_commands(found, units_to_mask(found))
    yield from _swapoff_commands(found)
    if remove_files:
        yield from _file_commands(swap_file_candidates(found))


def fstab_check_script() -> str:
    """templates/swap/fstab-check.sh, for ``sh -c SCRIPT NAME OLD NEW``."""
    return rendering.script("swap/fstab-check.sh")


def _fstab_commands(found: Mapping[str, Any], backup: str) -> Iterator[PyinfraCommand]:
    fstab = found["fstab"]
    if fstab is None:
        host.noop(f"{FSTAB} does not exist")
        return
    missed = sorted(set(found["libmount_swap_sources"]) - set(active_swap_sources(fstab["content"])))
    if missed:
        yield messages.refuse(
            f"libmount (findmnt --fstab) reads swap entries in {FSTAB} that sparkrig's parser "
            f"does not: {host_output.printable(', '.join(missed))}; nothing was changed"
        )
        return
    content = disable_swap_entries(fstab["content"])
    if content == fstab["content"]:
        host.noop(f"{FSTAB} has no active swap entry")
        return
    if found["fstab_link"] is not None:
        # Renaming a new file over the link would leave its target (and whatever manages
        # it) behind; writing through it would have root write wherever the link points.
        yield messages.refuse(
            f"{FSTAB} is a symbolic link to {found['fstab_link']}: sparkrig neither replaces the link "
            "nor writes through it. Comment out its swap entries there yourself, or make "
            f"{FSTAB} a regular file; nothing was changed"
        )
        return
    yield from atomic.file_commands(
        dest=FSTAB,
        content=content,
        mode=fstab["mode"],
        user=fstab["user"],
        group=fstab["group"],
        validate=("sh", "-c", fstab_check_script(), "fstab-check", FSTAB),
        backup=backup,
    )
    if found["systemd"]:
        yield StringCommand("systemctl", "daemon-reload")


def _unit_commands(found: Mapping[str, Any], units: list[str]) -> Iterator[PyinfraCommand]:
    if not found["systemd"]:
        host.noop("systemd is not running on this host (no /run/systemd/system): no unit to mask")
        return
    set_aside = [unit for unit in units if unit in found["admin_unit_files"]]
    to_mask = [unit for unit in units if found["unit_files"].get(unit) != "masked"]
    to_stop = sorted(
        unit
        for unit, state in found["units"].items()
        if state in RUNNING and (unit in units or _template(unit) in units)
    )
    if not (to_mask or to_stop):
        host.noop(f"the {len(units)} swap and zram units found are masked, none runs")
        return
    steps: list[list[Any]] = [
        ["mv", "-f", QuoteString(f"{UNIT_DIR}/{unit}"), QuoteString(f"{UNIT_DIR}/{unit}{SET_ASIDE}")]
        for unit in set_aside
    ]
    if to_mask:
        steps.append(["systemctl", "mask", "--", *map(QuoteString, to_mask)])
    if to_stop:
        steps.append(["systemctl", "stop", "--", *map(QuoteString, to_stop)])
    yield StringCommand(*[part for step in steps for part in ("&&", *step)][1:])


def _swapoff_commands(found: Mapping[str, Any]) -> Iterator[PyinfraCommand]:
    areas = host_output.printable(", ".join(area["filename"] for area in found["active"]))
    if not areas:
        host.noop("/proc/swaps lists no swap")
    elif found["container"]:
        host.noop(
            f"this host is a container ({found['container']}): the swap in /proc/swaps "
            f"({areas}) belongs to the machine running it, which alone can turn it off"
        )
    else:
        yield StringCommand("swapoff", "-a")


def _file_commands(paths: list[str]) -> Iterator[PyinfraCommand]:
    present = host_output.direct_fact(SwapFiles, paths=paths) if paths else []
    if present is None:
        return
    if not present:
        host.noop("no swap file to delete")
    for path in present:
        yield StringCommand("rm", "-f", "--", QuoteString(path))
