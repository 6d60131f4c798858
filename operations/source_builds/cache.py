"""Source builds, once per fleet: the builder's product fetched into the controller's cache
(checked against its stamp's sha256) and uploaded from it to the other hosts of its key."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
from collections.abc import Mapping
from io import BytesIO
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import FileDownloadCommand, FunctionCommand, QuoteString, StringCommand, operation

from sparkrig import atomic, host_output, rendering, user_files
from sparkrig.prefix import ARCHIVE
from sparkrig.unpack_prefix import MAX_BYTES
from sparkrig.wheelhouse import WHEELHOUSE

from .catalogue import CACHED_STAMP, cached_file, product, stamp_problem, wheelhouse_dir
from .facts import SourceBuilds
from .operations import report

# Root-owned places where root stages a wheel on its way out of or into a host: root never
# writes, reads or chowns through a path in a directory the venv's owner can change.
OUTGOING = "/var/lib/sparkrig/outgoing"
INCOMING = "/var/lib/sparkrig/incoming"
# A build's product (a wheel, a prefix's archive) copied out of its owner's wheelhouse entry:
# at most the unpacker's limit (no product is larger; a sparse file claiming more is
# refused before a byte is copied), within 30 minutes (a 32 GiB copy at 20 MB/s).
PRODUCT_LIMIT = MAX_BYTES
PRODUCT_TIMEOUT_S = 1800
# Run by the wheelhouse entry's owner: the staged product into the entry, checked there.
RECEIVE_SCRIPT = rendering.script("source_builds/receive.sh")


def cache_root(value: str) -> Path:
    return Path(os.path.expanduser(value))


def cached(cache: Path, name: str, key: str) -> dict | None:
    """The stamp of the cached wheel of ``(name, key)`` on the controller, or None. The
    wheel is kept as ``wheel.whl``; the stamp names it, checked, and pins its sha256."""
    stamp_file = cache / name / key / CACHED_STAMP
    try:
        stamp = json.loads(stamp_file.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if stamp_problem(stamp) or not (stamp_file.parent / cached_file(stamp)).is_file():
        return None
    return stamp


def _keep_in_cache(staging: str, final: str, stamp: Mapping[str, Any]) -> None:
    """Check a fetched wheel against its stamp, then move it into the cache (atomically),
    with the stamp and the sha256 the controller computed: what peers receive is pinned."""
    staging_dir, final_dir = Path(staging), Path(final)
    problem = stamp_problem(stamp)
    actual = None if problem else atomic.file_sha256(staging_dir / cached_file(stamp))
    if problem or actual != stamp["sha256"]:
        shutil.rmtree(staging_dir, ignore_errors=True)
        raise ValueError(problem or f"fetched {product(stamp)} has sha256 {actual}, its stamp says {stamp['sha256']}")
    kept = {**stamp, "sha256": actual}
    (staging_dir / CACHED_STAMP).write_text(json.dumps(kept, sort_keys=True) + "\n")
    if final_dir.exists():
        shutil.rmtree(staging_dir)
        return
    staging_dir.rename(final_dir)


def _make_dir(path: str) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)


@operation()
def fetch(build_name: str, key: str, cache: str, owner: str = "root", active: bool = True):
    """
    Copy a built wheel and its stamp from the host into the controller's cache, checked
    against the stamp's sha256; nothing when the cache has it or the host has no wheel.

    + build_name: the build's name
    + key: its stamp key
    + cache: the controller's cache directory
    + owner: the venv's owner, who reads the wheel out of the wheelhouse
    + active: False: this host is not the one to fetch from (nothing happens)
    """
    name = build_name
    root = cache_root(cache)
    if not active or cached(root, name, key):
        return
    found = host_output.direct_fact(SourceBuilds, builds=((name, key, ""),), venv="")
    stamp = ((found or {}).get(name) or {}).get("stamp")
    if (found or {}).get(name, {}).get("state") != "built" or not stamp:
        return
    # The owner reads their wheel (never root, who would follow a planted link) into a
    # root-owned file of a name the controller chose; the controller keeps it as wheel.whl.
    outgoing = f"{OUTGOING}/{name}-{key}.{'whl' if 'wheel' in stamp else ARCHIVE}"
    staging = root / name / f".{key}.{host.name}.new"
    yield StringCommand(
        "install -d -m 755 -o root -g root",
        QuoteString(OUTGOING),
        "&& rm -f",
        QuoteString(outgoing),
        "&&",
        user_files.copy_out(
            f"{wheelhouse_dir(name, key)}/{product(stamp)}",
            outgoing,
            PRODUCT_LIMIT,
            owner,
            PRODUCT_TIMEOUT_S,
            f"source build {name}",
        ),
        "&& chmod 644",
        QuoteString(outgoing),
    )
    yield FunctionCommand(_make_dir, (str(staging),), {})
    yield FileDownloadCommand(outgoing, str(staging / cached_file(stamp)), _sudo=False)
    yield StringCommand("rm -f", QuoteString(outgoing))
    yield FunctionCommand(_keep_in_cache, (str(staging), str(root / name / key), stamp), {})


@operation()
def receive(build_name: str, key: str, cache: str, builder: str, owner: str, active: bool = True):
    """
    Put the controller's cached wheel of a build into the host's wheelhouse (checked
    against its sha256 on the host); when the cache has none (the builder failed, or
    runs detached), report that the host waits for the build on ``builder``.

    + build_name: the build's name
    + key: its stamp key
    + cache: the controller's cache directory
    + builder: the host that builds it, for the message
    + owner: the venv's owner, who owns the wheelhouse entry
    + active: False: this host builds the wheel itself (nothing happens)
    """
    name = build_name
    if not active:
        return
    stamp = cached(cache_root(cache), name, key)
    if not stamp:
        if host.state.is_executing:
            report(f"source build {name}: waiting for the build on {builder}; its wheel comes with a later deploy")
        return
    w = wheelhouse_dir(name, key)
    incoming = f"{INCOMING}/{name}-{key}"
    local = cache_root(cache) / name / key
    wheel = product(stamp)  # checked by cached(): a wheel file name or the archive's, no path
    yield StringCommand(
        "install -d -m 755 -o root -g root",
        QuoteString(INCOMING),
        QuoteString(WHEELHOUSE),
        "&& rm -rf",
        QuoteString(incoming),
        "&& install -d -m 755 -o root -g root",
        QuoteString(incoming),
        "&& install -d -m 755 -o",
        QuoteString(owner),
        "-g",
        f'"$(id -gn {rendering.quote_literal(owner)})"',
        QuoteString(posixpath.dirname(w)),
    )
    yield atomic.Upload(str(local / cached_file(stamp)), f"{incoming}/{wheel}")
    yield atomic.Upload(BytesIO((json.dumps(stamp, sort_keys=True) + "\n").encode()), f"{incoming}/stamp.json")
    # Into the wheelhouse as its owner (the entry's directory is theirs), checked there.
    yield StringCommand(
        "chmod 644",
        QuoteString(f"{incoming}/{wheel}"),
        QuoteString(f"{incoming}/stamp.json"),
        "&& runuser -u",
        QuoteString(owner),
        "-- sh -c",
        QuoteString(RECEIVE_SCRIPT),
        "receive",
        QuoteString(incoming),
        QuoteString(w),
        QuoteString(wheel),
        QuoteString(stamp["sha256"]),
        "&& rm -rf",
        QuoteString(incoming),
    )
