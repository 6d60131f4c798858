"""
The wheels of a lock, on the controller: the lock's entries, the wheel tags a host of its
platform accepts, and, for hosts that cannot reach the index (``python_offline``), every
locked wheel downloaded once into the controller's cache, its sha256 checked against the
lock. Both python_stack (hosts) and python_lock (the controller's command) build on it.
"""

from __future__ import annotations

import html
import json
import os
import re
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from . import atomic

LOCK_PLATFORM = "manylinux_2_35"
DEFAULT_INDEX = "https://pypi.org/simple"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# PEP 600's names of the older manylinux tags, by glibc minor version.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
_ANCHOR = re.compile(r'<a\s[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', re.IGNORECASE)


# flash-attn has no sm_121 kernels and builds for CUDA 12 only: never installed.
REFUSED = {"flash-attn": "no sm_121 kernels and CUDA 12 only; PyTorch SDPA replaces it"}


def normalise(name: str) -> str:
    """A package name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(text: str) -> list[tuple[str, list[str]]]:
    """A lock's entries in order: (normalised name, its lines), the header left out."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            name = re.split(r"[ =@\[;]", line, maxsplit=1)[0]
            entries.append((normalise(name), [line]))
        elif entries and line.strip():
            entries[-1][1].append(line)
    return entries


def target_tags(arch: str, python: str) -> set[str]:
    """The wheel tags a host of the lock's platform and Python accepts."""
    return set(tag_order(arch, python))


def tag_order(arch: str, python: str) -> list[str]:
    """:func:`target_tags`, the one an installer prefers first (packaging's order)."""
    major, minor = (int(x) for x in python.split("."))
    glibc = int(LOCK_PLATFORM.rsplit("_", 1)[1])
    platforms = []
    for glibc_minor in range(glibc, 4, -1):  # down to manylinux1's glibc 2.5, with the legacy aliases
        platforms.append(f"manylinux_2_{glibc_minor}_{arch}")
        legacy = _LEGACY_MANYLINUX.get(glibc_minor)
        if legacy and (glibc_minor == 17 or arch == "x86_64"):  # 2010 and 1 were x86 only
            platforms.append(f"{legacy}_{arch}")
    platforms.append(f"linux_{arch}")
    tags = list(cpython_tags((major, minor), platforms=platforms))
    tags += list(compatible_tags((major, minor), f"cp{major}{minor}", platforms))
    return list(dict.fromkeys(str(t) for t in tags))


def _registry_entries(text: str) -> list[tuple[str, str | None, list[str], str | None]]:
    """(name, URL of a direct wheel or None, sha256s, index) of each locked package; built
    wheels (file://) are left out: they are on the host already."""
    found = []
    for name, lines in lock_entries(text):
        first = lines[0].split(" \\")[0].strip()
        hashes = [part.split("sha256:", 1)[1].split()[0] for line in lines for part in line.split("--hash=")[1:]]
        index = next((line.split("# from ", 1)[1].strip() for line in lines if "# from " in line), None)
        if " @ file://" in first:
            continue
        url = first.split(" @ ", 1)[1].strip() if " @ " in first else None
        found.append((name, url, hashes, index))
    return found


# What the controller takes from an index at most: no locked wheel comes near it (torch's
# CUDA wheels are under 2 GiB), and an endless answer would fill the controller's disk.
WHEEL_MAX_BYTES = 4 << 30
INDEX_MAX_BYTES = 64 << 20  # one project's page (PyPI's torch, every file of every release: 0.4 MB, 2026-11)


def _schemes(index: str | None) -> set[str]:
    """The URL schemes a package's files may come by: https, or the scheme of the index
    the lock names for it (a lab's or a mirror's http). Never file:// or ftp:// from an
    index's answer: the controller would copy its own files, or whatever endless source."""
    return {"https", urllib.parse.urlsplit(index or DEFAULT_INDEX).scheme}


def _open(request: str | urllib.request.Request, schemes: set[str], timeout: float):
    """urlopen of ``request`` if its URL has one of ``schemes`` (urllib itself follows a
    redirect to http, https or ftp only; the size cap and the sha256 hold whatever answers)."""
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    if urllib.parse.urlsplit(url).scheme not in schemes:
        raise RuntimeError(f"{url}: refused, only {' or '.join(sorted(schemes))} URLs are fetched")
    return urllib.request.urlopen(request, timeout=timeout)


def _download(url: str, sha256: str, target: Path, schemes: set[str]) -> None:
    """``url`` into ``target`` if its sha256 is ``sha256``, through a temporary file of this
    download alone (two hosts may fetch the same wheel at once), at most WHEEL_MAX_BYTES."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out, _open(url, schemes, 120) as response:
            size = 0
            for block in iter(lambda: response.read(1 << 20), b""):
                size += len(block)
                if size > WHEEL_MAX_BYTES:
                    raise RuntimeError(f"{url}: larger than {WHEEL_MAX_BYTES} bytes, refused")
                out.write(block)
        if atomic.file_sha256(temp) != sha256:
            raise RuntimeError(f"{url}: sha256 differs from the lock's")
        temp.replace(target)
    finally:
        temp.unlink(missing_ok=True)


def _index_files(index: str, name: str) -> list[dict]:
    """The files of project ``name`` on a simple index, JSON (PEP 691) or HTML (PEP 503):
    ``{"filename", "url", "hashes"}`` each. An answer of another shape, or larger than
    INDEX_MAX_BYTES, raises RuntimeError (that host fails, the others go on)."""
    accept = f"{_SIMPLE_JSON}, text/html;q=0.1"
    request = urllib.request.Request(f"{index.rstrip('/')}/{name}/", headers={"Accept": accept})
    with _open(request, _schemes(index), 60) as response:
        base = response.geturl()
        kind = response.headers.get_content_type()
        body = response.read(INDEX_MAX_BYTES + 1)
    if len(body) > INDEX_MAX_BYTES:
        raise RuntimeError(f"{index}: its answer for {name} is larger than {INDEX_MAX_BYTES} bytes, refused")
    try:
        if kind == _SIMPLE_JSON:
            files = [
                {"filename": f["filename"], "url": f["url"], "hashes": dict(f.get("hashes") or {})}
                for f in json.loads(body)["files"]
            ]
        else:
            files = []
            for href, filename in _ANCHOR.findall(body.decode()):
                url, _, fragment = href.partition("#")
                algorithm, _, value = fragment.partition("=")
                files.append(
                    {
                        "filename": html.unescape(filename).strip(),
                        "url": html.unescape(url),
                        "hashes": {algorithm: value} if value else {},
                    }
                )
        if not all(isinstance(v, str) for f in files for v in (f["filename"], f["url"], *f["hashes"].values())):
            raise TypeError("a file's name, URL or hash is not a string")
        return [{**f, "url": urllib.parse.urljoin(base, f["url"])} for f in files]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise RuntimeError(f"{index}: its answer for {name} is not a simple index's ({error!r})") from None


def offline_wheels(text: str, arch: str, python: str, cache: Path) -> dict[str, str]:
    """Every wheel a host of ``arch`` and ``python`` installs from lock ``text``, file name:
    path in the controller's ``cache``; downloaded there once (sha256 checked against the
    lock), then reused by every host and run. Raises RuntimeError when a package has no
    wheel for the host (an sdist would have to be built there).

    Of a package's locked wheels that fit, the one the host's tags prefer is chosen, from
    every locked file the index lists (kept in ``files.json``, so a later run asks no index),
    never from what the cache happens to hold: an x86_64 host got torchao's abi3 wheel while
    only that was cached, then its py3-none-any one once an aarch64 host had cached it, and
    every such switch was a change at the next converge."""
    order = {tag: rank for rank, tag in enumerate(tag_order(arch, python))}
    cache.mkdir(parents=True, exist_ok=True)
    known_path, files_path = cache / "sha256.json", cache / "files.json"
    known: dict[str, str] = json.loads(known_path.read_text()) if known_path.is_file() else {}
    files: dict[str, dict] = json.loads(files_path.read_text()) if files_path.is_file() else {}
    wheels = {}
    for name, url, hashes, index in _registry_entries(text):
        if url:
            candidates = (
                [{"filename": urllib.parse.unquote(url.rsplit("/", 1)[1]), "url": url, "hashes": {"sha256": hashes[0]}}]
                if hashes
                else []
            )
        elif hashes and all(h in files for h in hashes):
            candidates = [{**files[h], "hashes": {"sha256": h}} for h in hashes]
        else:
            candidates = _index_files(index or DEFAULT_INDEX, name)
            files.update(
                {
                    f["hashes"]["sha256"]: {"filename": f["filename"], "url": f["url"]}
                    for f in candidates
                    if f["hashes"].get("sha256") in hashes
                }
            )
        fits = [
            f
            for f in candidates
            if f["hashes"].get("sha256") in hashes
            and f["filename"].endswith(".whl")
            and _rank(f["filename"], order) is not None
        ]
        if not fits:
            raise RuntimeError(f"python_offline: no wheel of {name} in the lock fits {arch}, Python {python}")
        chosen = min(fits, key=lambda f: (_rank(f["filename"], order), f["filename"]))
        target = cache / chosen["filename"]
        if not (known.get(chosen["filename"]) == chosen["hashes"]["sha256"] and target.is_file()) and not (
            target.is_file() and atomic.file_sha256(target) == chosen["hashes"]["sha256"]
        ):
            _download(chosen["url"], chosen["hashes"]["sha256"], target, _schemes(index))
        known[chosen["filename"]] = chosen["hashes"]["sha256"]
        wheels[chosen["filename"]] = str(target)
    for path, value in ((known_path, known), (files_path, files)):
        fd, temp = tempfile.mkstemp(dir=cache, prefix=f".{path.name}.", suffix=".new")  # this run's alone
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(value, indent=1, sort_keys=True) + "\n")
        os.replace(temp, path)
    return dict(sorted(wheels.items()))


def _rank(filename: str, order: dict[str, int]) -> int | None:
    """How early the host's tag order takes the wheel (None: it does not fit)."""
    try:
        _name, _version, _build, tags = parse_wheel_filename(filename)
    except ValueError:
        return None
    return min((order[str(tag)] for tag in tags if str(tag) in order), default=None)


def _fits(filename: str, accepted: set[str]) -> bool:
    try:
        _name, _version, _build, tags = parse_wheel_filename(filename)
    except ValueError:
        return False
    return any(str(tag) in accepted for tag in tags)
