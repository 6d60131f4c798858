"""Python stack: uv, and a virtualenv holding exactly a lock made on the controller: its own
settings (uv's, the venv's Python, offline hosts), declared once, and their checks. The manifest,
its locks, the venv's path and owner and the index are the shared layer's (sparkrig/stack_locks.py):
the source builds read them too."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkrig import stack_locks
from sparkrig.operations.hardware import settings as hardware_settings
from sparkrig.settings import Setting, boolean, controller_path, declare, defaults, one_of

_SHA256 = re.compile(r"[0-9a-f]{64}")
_UV_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


def uv_version_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and _UV_VERSION.fullmatch(value)
    return None if ok else "a uv release as X.Y.Z, e.g. '0.13.9'"


def hashes_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(h, str) and _SHA256.fullmatch(h) for h in value)
    return None if ok else "a non-empty list of sha256 digests (64 lower-case hex digits)"


SETTINGS = (
    Setting(
        "python_venv_python_preference",
        "system",
        "How uv finds the venv's Python: \"system\" (a system interpreter of the manifest's version "
        'first, a uv-managed download only if none), "only-system" (never download), "managed" or '
        '"only-managed".',
        one_of("only-system", "system", "managed", "only-managed"),
    ),
    Setting(
        "python_uv_version",
        "0.13.9",
        "The uv release installed into /opt/sparkrig/uv (linked from /usr/local/bin/uv when that name is free).",
        uv_version_check,
    ),
    Setting(
        "python_offline",
        False,
        "Hosts that cannot reach python_index_url: the controller downloads every wheel of their "
        "lock once (sha256 checked against the lock) into python_offline_cache and uploads the "
        "ones a host lacks to /var/lib/sparkrig/python-wheels; the host installs with `uv pip sync"
        " --offline --no-index`. uv itself must already be on the host (it is installed from the "
        "index).",
        boolean,
    ),
    Setting(
        "python_offline_cache",
        "~/.cache/sparkrig/python-wheels",
        "Where the controller keeps those wheels, shared by every host and run (~ is the controller user's home).",
        controller_path,
    ),
    Setting(
        "python_uv_sha256",
        [
            # uv 0.13.9 wheels from PyPI: manylinux aarch64 (two builds) and x86_64.
            "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
            "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",
            "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
        ],
        "sha256 of the uv wheels pip may install for that release (manylinux aarch64 and x86_64, "
        "as PyPI lists them); change them with python_uv_version.",
        hashes_check,
    ),
)
declare(__name__, SETTINGS)

# Its own settings, the shared manifest, locks and venv, and the hardware profile's (the host's
# architecture).
DEFAULTS = defaults((*SETTINGS, *stack_locks.SETTINGS, *hardware_settings.SETTINGS))
