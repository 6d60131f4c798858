"""
Installed prefixes of source builds (``kind: prefix``): where they live, for every concern.

A prefix build (a C/C++/CUDA project such as NCCL) is unpacked by root into
``/opt/sparkrig/builds/<name>/<key>/`` (root's, read-only to others), recorded by
``<key>.json`` beside it, and reached through the stable link
``/opt/sparkrig/builds/<name>/current``. The archive comes from the build's unprivileged
owner, so root checks every member first (:mod:`sparkrig.unpack_prefix`, sent to the
host as its source and run with ``python3 -I``).
"""

from __future__ import annotations

from pathlib import Path

PREFIX_ROOT = "/opt/sparkrig/builds"
ARCHIVE = "prefix.tar.gz"
UNPACKER = Path(__file__).resolve().parent / "unpack_prefix.py"


def installed_dir(name: str, key: str) -> str:
    return f"{PREFIX_ROOT}/{name}/{key}"


def installed_stamp(name: str, key: str) -> str:
    """Written by root last, after the prefix is in place: its presence means installed."""
    return f"{PREFIX_ROOT}/{name}/{key}.json"


def current(name: str) -> str:
    """The stable link to the installed prefix of build ``name`` the host uses now."""
    return f"{PREFIX_ROOT}/{name}/current"


def need_variable(name: str) -> str:
    """The build environment's variable naming the installed prefix of a needed build."""
    return "SPARKRIG_NEED_" + name.upper().replace("-", "_")


def unpacker_source() -> str:
    return UNPACKER.read_text()
