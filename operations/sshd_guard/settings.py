"""SSH guard: sshd keeps running under memory pressure, and SSH sessions stay killable:
the settings, declared once, and their checks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkrig.settings import SIZE_UNITS, Setting, declare, defaults

_SIZE = re.compile(r"(\d+)([KMGT]?)")


def size_bytes(value: str) -> int:
    """Bytes of a systemd size such as ``512M`` (base 1024, as systemd reads it)."""
    number, unit = _SIZE.fullmatch(value).groups()
    return int(number) * SIZE_UNITS[unit]


def _size_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    if isinstance(value, str) and _SIZE.fullmatch(value):
        return None
    return "a size in bytes with an optional K, M, G or T suffix (base 1024), e.g. '128M'"


def _slice_check(value: Any, data: Mapping[str, Any]) -> str | None:
    allowed = _size_check(value, data)
    if allowed:
        return allowed
    sshd = data.get("sshd_guard_memory_min")
    if isinstance(sshd, str) and _SIZE.fullmatch(sshd) and size_bytes(value) < size_bytes(sshd):
        return f"at least sshd_guard_memory_min ({sshd}): the slice's reservation caps its units'"
    return None


SETTINGS = (
    Setting(
        "sshd_guard_memory_min",
        "128M",
        "Memory reserved for the unit that runs sshd (MemoryMin=, base-1024 K/M/G/T). It covers "
        "the listener and pre-auth processes; sessions live in user slices. The unit's "
        "OOMScoreAdjust is always set to 0: sshd protects its own listener, and -1000 on the unit "
        "would make every SSH session unkillable.",
        _size_check,
    ),
    Setting(
        "sshd_guard_system_slice_memory_min",
        "512M",
        "Memory reserved for system.slice (MemoryMin=): a unit's reservation is capped by its "
        "parent slice's, so this must be at least sshd_guard_memory_min.",
        _slice_check,
    ),
)

DEFAULTS = defaults(SETTINGS)  # the settings this concern's deploy reads: its own

declare(__name__, SETTINGS)
