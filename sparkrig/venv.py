"""
What the Python stack and the source builds share about the venv and uv, so that neither
concern imports the other: where uv lives and the environment it runs with, the venv's own
state directory, and which package names are accepted. The venv has one owner,
operations/python_stack/: source builds hand it their wheels (sparkrig/wheelhouse.py), they
never write into it; its settings are sparkrig/stack_locks.py's.
"""

from __future__ import annotations

import re

UV_TOOL = "/opt/sparkrig/uv"
UV = f"{UV_TOOL}/bin/uv"
UV_CACHE = "/var/cache/sparkrig/uv"
UV_ENV = ("UV_SYSTEM_CERTS=1", "UV_NATIVE_TLS=1", f"UV_CACHE_DIR={UV_CACHE}", "UV_NO_PROGRESS=1")
STATE_DIR = "sparkrig"  # inside the venv: requirements.lock
# The most of the venv's requirements.lock a deploy reads (its owner can replace it): a lock
# of the default stack is about 0.4 MB.
LOCK_LIMIT = 16 << 20

_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def package_name(name: str) -> bool:
    """Whether ``name`` is a package name sparkrig accepts."""
    return bool(_NAME.fullmatch(name))
