"""Swap: what turns swap on now or at the next boot, read in one command, and the fstab as
libmount reads it."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output

FSTAB = "/etc/fstab"
# What a disabled swap entry starts with; the entry follows exactly as it was.
DISABLED = b"# sparkrig swap off: "
UNIT_DIR = "/etc/systemd/system"
ZRAM_SERVICES = ("zramswap.service", "zram-config.service", "zram-swap.service")
UNIT_PATTERNS = ("*.swap", *ZRAM_SERVICES, "systemd-zram-setup@*.service")
ZRAM_GENERATOR_CONFIGS = tuple(
    f"{directory}/zram-generator.conf{suffix}"
    for directory in ("/etc/systemd", "/run/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd")
    for suffix in ("", ".d/*.conf")
)

_FIELD_SEPARATOR = re.compile(rb"[ \t]+")
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")
_LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")


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


def _source(line: bytes) -> str:
    return entry_fields(line)[0].decode("utf-8", "surrogateescape")


def active_swap_sources(content: bytes) -> list[str]:
    """Sources (``/swap.img``, ``UUID=…``) of the active swap entries."""
    return [_source(line) for line in fstab_lines(content) if is_swap_entry(line)]


def disabled_swap_sources(content: bytes) -> list[str]:
    """Sources of the swap entries sparkrig disabled (the lines starting with DISABLED)."""
    return [
        _source(line[len(DISABLED) :])
        for line in fstab_lines(content)
        if line.startswith(DISABLED) and is_swap_entry(line[len(DISABLED) :])
    ]


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
        return host_output.encoded(
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

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        return self.parse(host_output.decoded(output))

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
        "filename": host_output.Content(
            unmangle(filename.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")
        ),
        "type": kind,
        "size_kib": int(size),
        "used_kib": int(used),
        "priority": int(priority),
    }


def _libmount_swap_sources(lines: list[str]) -> list[str]:
    # findmnt --types matches case-insensitively; libmount's swap areas are type "swap" exactly.
    entries = json.loads("\n".join(lines) or "{}").get("filesystems", [])
    return [host_output.Content(entry["source"]) for entry in entries if entry["fstype"] == "swap"]


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
                "if [ -f",
                quoted,
                "] && [ ! -L",
                quoted,
                "] &&",
                '[ "$(blkid -p -o value -s TYPE',
                quoted,
                '2>/dev/null)" = swap ];',
                "then printf '%s\\n'",
                quoted,
                "; fi;",
            ]
        return host_output.encoded(*parts, "true")

    @host_output.parses
    def process(self, output: list[str]) -> list[str]:
        return host_output.decoded(output)

    @staticmethod
    def default() -> list[str]:
        return []
