"""
Swap off, and it stays off.

On GB10 the CPU and the GPU share one pool of memory and GPU allocations cannot be
swapped out: under pressure swap only delays and deepens the freeze that takes the
whole box down, instead of letting the OOM killer end the job (see
shared/notes/spark-facts.md). Off means:

- every swap entry of ``/etc/fstab`` commented out, the rest of the file kept byte for
  byte; a backup of the old file is kept and findmnt validates the new one first;
- the swap units systemd knows (fstab-generated, gpt-auto, zram-generator, hand-written)
  and the zram services (zram-tools, zram-config, systemd-zram-generator) masked and
  stopped, so neither a reboot nor a dependency brings swap back;
- ``swapoff -a`` while ``/proc/swaps`` lists any swap;
- optionally (``swap_remove_files``) the swap files of the disabled entries deleted.

``swap.target`` itself is left alone: ``sysinit.target`` wants it and other units order
against it, and masking it would not stop swap that a service turns on with swapon(8).

A converged host costs one remote command: :class:`SwapSources` reads everything at once,
and the one operation, :func:`disabled`, decides every change from it.
"""

from __future__ import annotations

import base64
import json
import re
import string
from collections.abc import Iterator, Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.api.command import PyinfraCommand

from sparkrig import atomic, reading
from sparkrig.settings import ALL_DEFAULTS

from .settings import SETTINGS  # noqa: F401 (re-exported)

FSTAB = "/etc/fstab"
FSTAB_BACKUP = "/etc/fstab.sparkrig.bak"
# What a disabled swap entry starts with; the entry follows exactly as it was.
DISABLED = b"# sparkrig swap off: "
UNIT_DIR = "/etc/systemd/system"
# A unit file an administrator wrote in UNIT_DIR is renamed to this suffix: a mask
# (a link to /dev/null of the same name) cannot take its place otherwise.
SET_ASIDE = ".sparkrig-disabled"
ZRAM_SERVICES = ("zramswap.service", "zram-config.service", "zram-swap.service")
ZRAM_SETUP = "systemd-zram-setup@.service"  # systemd-zram-generator's template
UNIT_PATTERNS = ("*.swap", *ZRAM_SERVICES, "systemd-zram-setup@*.service")
ZRAM_GENERATOR_CONFIGS = tuple(
    f"{directory}/zram-generator.conf{suffix}"
    for directory in ("/etc/systemd", "/run/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd")
    for suffix in ("", ".d/*.conf")
)
RUNNING = ("active", "activating", "reloading")

_FIELD_SEPARATOR = re.compile(rb"[ \t]+")
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")
_LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")
_TAGS = {"LABEL": "label", "UUID": "uuid", "PARTUUID": "partuuid", "PARTLABEL": "partlabel"}
_DEVNODE_CHARS = frozenset(string.ascii_letters + string.digits + "#+-.:=@_")  # udev keeps these
_UNIT_CHARS = frozenset((string.ascii_letters + string.digits + ":_.").encode())  # systemd keeps these




# fstab, read the way libmount reads it ----------------------------------------


def fstab_lines(content: bytes) -> list[bytes]:
    """The file's lines, each with its own end (``\\n``, ``\\r\\n``, or none on a last line)."""
    return _LINE.findall(content)


def unmangle(field: bytes) -> bytes:
    """A field as libmount reads it: ``\\NNN`` (three octal digits) is that byte."""
    return _OCTAL_ESCAPE.sub(lambda match: bytes([int(match[1], 8) & 0xFF]), field)


def entry_fields(line: bytes) -> list[bytes] | None:
    """An fstab line's fields, unmangled and split on blanks as libmount does; None for a
    comment or blank line. One ``\\r`` before the line end is dropped, as libmount does."""
    body = line.removesuffix(b"\n").removesuffix(b"\r").strip(b" \t")
    if not body or body.startswith(b"#"):
        return None
    return [unmangle(field) for field in _FIELD_SEPARATOR.split(body)]


def is_swap_entry(line: bytes) -> bool:
    """Whether a line is an active swap entry: its third field (the type) is ``swap``.

    Stricter parsers (libmount) ignore a line whose dump or pass field is not a number;
    systemd < 254 reads fstab with glibc, which takes it. Such a line counts as swap here.
    """
    fields = entry_fields(line)
    return fields is not None and len(fields) >= 3 and fields[2] == b"swap"


def disable_swap_entries(content: bytes) -> bytes:
    """The fstab with each active swap entry prefixed by :data:`DISABLED`; every other
    byte (line ends, blanks, a missing last newline) as it was."""
    return b"".join(DISABLED + line if is_swap_entry(line) else line for line in fstab_lines(content))


def _source(line: bytes) -> str:
    return entry_fields(line)[0].decode("utf-8", "surrogateescape")


def active_swap_sources(content: bytes) -> list[str]:
    """Sources (``/swap.img``, ``UUID=…``) of the active swap entries."""
    return [_source(line) for line in fstab_lines(content) if is_swap_entry(line)]


def disabled_swap_sources(content: bytes) -> list[str]:
    """Sources of the swap entries sparkrig disabled (the lines starting with DISABLED)."""
    return [
        _source(line[len(DISABLED):])
        for line in fstab_lines(content)
        if line.startswith(DISABLED) and is_swap_entry(line[len(DISABLED):])
    ]


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


# facts ---------------------------------------------------------------------------


def _shell_words(words: tuple[str, ...]) -> str:
    return " ".join(f"'{word}'" for word in words)


class SwapSources(FactBase):
    """
    Returns what turns swap on now or at the next boot, read in one command: the active
    swap areas (``/proc/swaps``), the fstab's exact bytes and its owner and mode, the
    fstab's swap sources as libmount reads them (``findmnt --fstab``), the container the
    host runs in (``None`` on real hardware), whether systemd runs, the swap and zram
    unit files and units systemd knows, the unit files an administrator wrote in
    /etc/systemd/system that a mask cannot replace, and the zram-generator configs.
    ``fstab`` is ``None`` without /etc/fstab; ``unit_files`` and ``units`` are empty
    without systemd; ``units`` maps each loaded unit to its active state.

    .. code:: python

        {
            "active": [{"filename": "/swap.img", "type": "file", "size_kib": 16777212,
                        "used_kib": 0, "priority": -2}],
            "fstab": {"content": b"UUID=… / ext4 …\\n/swap.img none swap sw 0 0\\n",
                      "mode": 0o644, "user": "root", "group": "root"},
            "fstab_link": None,
            "libmount_swap_sources": ["/swap.img"],
            "container": None,
            "systemd": True,
            "unit_files": {"swap.img.swap": "generated", "zramswap.service": "enabled"},
            "units": {"swap.img.swap": "active", "zramswap.service": "active"},
            "admin_unit_files": ["hand.swap"],
            "zram_generator_configs": ["/usr/lib/systemd/zram-generator.conf"],
        }
    """

    def command(self) -> StringCommand:
        patterns = _shell_words(UNIT_PATTERNS)
        names = " -o ".join(f"-name '{pattern}'" for pattern in UNIT_PATTERNS)
        return atomic.encoded(
            "echo '## swaps'; cat /proc/swaps; "
            f"echo '## fstab'; if [ -f {FSTAB} ]; then stat -L -c '%a %U %G' {FSTAB} && "
            f"base64 -w0 {FSTAB} && echo; fi; "
            f"echo '## fstab-link'; [ -L {FSTAB} ] && readlink {FSTAB}; "
            "echo '## libmount'; findmnt --fstab --types swap --json --output SOURCE,FSTYPE 2>/dev/null; "
            "echo '## container'; systemd-detect-virt --container 2>/dev/null || "
            "{ [ -e /.dockerenv ] && echo docker; } || { [ -e /run/.containerenv ] && echo podman; }; "
            "if [ -d /run/systemd/system ]; then echo '## systemd'; "
            f"echo '## unit-files'; systemctl list-unit-files --no-legend --no-pager --full {patterns}; "
            "echo '## units'; systemctl list-units --all --no-legend --no-pager --plain --full "
            f"{patterns}; fi; "
            f"echo '## admin-unit-files'; find {UNIT_DIR} -maxdepth 1 \\( {names} \\) "
            "! -lname /dev/null -printf '%f\\n' 2>/dev/null; "
            f"echo '## zram-generator'; for f in {' '.join(ZRAM_GENERATOR_CONFIGS)}; do "
            '[ -e "$f" ] && echo "$f"; done; true'
        )

    @atomic.parses
    def process(self, output: list[str]) -> dict:
        return self.parse(atomic.decoded(output))

    def parse(self, output: list[str]) -> dict:
        """The reading from the command's decoded lines."""
        sections: dict[str, list[str]] = {}
        lines: list[str] = []
        for line in output:
            if line.startswith("## "):
                lines = sections.setdefault(line[3:], [])
            else:
                lines.append(line)
        container = [line for line in sections.get("container", []) if line not in ("", "none")]
        return {
            "active": [_swap_area(line) for line in sections.get("swaps", [])[1:]],  # [0]: the header
            "fstab": _fstab(sections.get("fstab", [])),
            "fstab_link": next((line for line in sections.get("fstab-link", []) if line), None),
            "libmount_swap_sources": _libmount_swap_sources(sections.get("libmount", [])),
            "container": container[0] if container else None,
            "systemd": "systemd" in sections,
            "unit_files": dict(line.split()[:2] for line in sections.get("unit-files", []) if line.strip()),
            "units": {fields[0]: fields[2] for fields in map(str.split, sections.get("units", [])) if fields},
            "admin_unit_files": [line for line in sections.get("admin-unit-files", []) if line],
            "zram_generator_configs": [line for line in sections.get("zram-generator", []) if line],
        }

    def default(self) -> dict:
        """The shape with nothing found (pyinfra fails the host when the command fails)."""
        return self.parse([])


def _swap_area(line: str) -> dict:
    filename, kind, size, used, priority = line.rsplit(None, 4)
    return {
        "filename": unmangle(filename.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape"),
        "type": kind,
        "size_kib": int(size),
        "used_kib": int(used),
        "priority": int(priority),
    }


def _libmount_swap_sources(lines: list[str]) -> list[str]:
    # findmnt --types matches case-insensitively; libmount's swap areas are type "swap" exactly.
    entries = json.loads("\n".join(lines) or "{}").get("filesystems", [])
    return [entry["source"] for entry in entries if entry["fstype"] == "swap"]


def _fstab(lines: list[str]) -> dict | None:
    if len(lines) < 2:
        return None
    mode, user, group = lines[0].split()
    return {"content": base64.b64decode(lines[1]), "mode": int(mode, 8), "user": user, "group": group}


class SwapFiles(FactBase):
    """
    Returns those of ``paths`` that are regular files (not links) holding a swap
    signature (``blkid -p`` reads their type as ``swap``).

    .. code:: python

        ["/swap.img"]
    """

    def command(self, paths: list[str]) -> StringCommand:
        parts: list[Any] = []
        for path in paths:
            quoted = QuoteString(path)
            parts += [
                "if [ -f", quoted, "] && [ ! -L", quoted, "] &&",
                '[ "$(blkid -p -o value -s TYPE', quoted, '2>/dev/null)" = swap ];',
                "then printf '%s\\n'", quoted, "; fi;",
            ]
        return atomic.encoded(*parts, "true")

    @atomic.parses
    def process(self, output: list[str]) -> list[str]:
        return atomic.decoded(output)

    @staticmethod
    def default() -> list[str]:
        return []


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
    return f"{prefix}@{rest[rest.rindex('.'):]}" if at and "." in rest else unit


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
    return atomic.script("swap/fstab-check.sh")


def _fstab_commands(found: Mapping[str, Any], backup: str) -> Iterator[PyinfraCommand]:
    fstab = found["fstab"]
    if fstab is None:
        host.noop(f"{FSTAB} does not exist")
        return
    missed = sorted(set(found["libmount_swap_sources"]) - set(active_swap_sources(fstab["content"])))
    if missed:
        yield atomic.refuse(
            f"libmount (findmnt --fstab) reads swap entries in {FSTAB} that sparkrig's parser "
            f"does not: {', '.join(missed)}; nothing was changed"
        )
        return
    content = disable_swap_entries(fstab["content"])
    if content == fstab["content"]:
        host.noop(f"{FSTAB} has no active swap entry")
        return
    if found["fstab_link"] is not None:
        # Renaming a new file over the link would leave its target (and whatever manages
        # it) behind; writing through it would have root write wherever the link points.
        yield atomic.refuse(
            f"{FSTAB} is a symbolic link to {found['fstab_link']}: sparkrig neither replaces the link "
            "nor writes through it. Comment out its swap entries there yourself, or make "
            f"{FSTAB} a regular file; nothing was changed"
        )
        return
    yield from atomic.file._inner(
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
        unit for unit, state in found["units"].items()
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
    areas = ", ".join(area["filename"] for area in found["active"])
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
    present = atomic.fact(SwapFiles, paths=paths) if paths else []
    if present is None:
        return
    if not present:
        host.noop("no swap file to delete")
    for path in present:
        yield StringCommand("rm", "-f", "--", QuoteString(path))


@reading.planner
def reads(settings):
    # disabled() reads SwapSources: from the host's one reading.
    return [reading.part(SwapSources)] if settings["swap_disable"] else []


@deploy("Swap off", data_defaults=ALL_DEFAULTS)
def swap():
    """
    Turn swap off now and keep it off across reboots (see :func:`disabled`).

    Settings: ``swap_disable``, ``swap_remove_files``; see docs/settings.md.
    """
    if not host.data.swap_disable:
        host.noop("swap_disable is False: swap is left as it is")
        return
    disabled(
        name="Swap off now and at every boot (fstab entries, swap and zram units)",
        remove_files=host.data.swap_remove_files,
    )
