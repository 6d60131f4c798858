"""
The Python stack's locks, made on the controller; and the wheels of a lock, for hosts
that cannot reach the index.

    uv run python -m operations.python_lock [--manifest FILE] [--locks DIR] [--check]

resolves the manifest (default ``group_data/python_stack.yml``) once for each
architecture and set of profiles its ``locks`` lists, with
``uv pip compile --python-platform ARCH-manylinux_2_35 --python-version PY
--generate-hashes``, into ``DIR/<arch>-py<python>[-<profile>...].txt`` (default
``group_data/python_stack.locks``). A lock whose recorded input digest still matches
is left as it is; ``--check`` only reports stale locks (exit status 1). Each index the
manifest names (``torch.index_url``, ``vllm.index_url``) is an explicit uv index: the
packages named for it come from there, and nothing else is looked up there.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from . import atomic
from . import python_stack as ps

DEFAULT_INDEX = "https://pypi.org/simple"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_ANCHOR = re.compile(r'<a\s[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', re.IGNORECASE)


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def compile_input(manifest: Mapping[str, Any], profiles: Sequence[str], arch: str) -> str:
    """The pyproject.toml uv resolves: the pins as dependencies, each named index explicit
    (used only by the packages whose source names it)."""
    lines = [
        "[project]",
        'name = "sparkrig-python-stack"',
        'version = "0"',
        "dependencies = [",
        *[f"    {_toml(r)}," for r in ps.lock_requirements(manifest, profiles, arch)],
        "]",
    ]
    routes, named = ps.routes(manifest), ps.indexes(manifest)
    if routes:
        lines += ["", "[tool.uv.sources]"]
        lines += [f"{name} = {{ index = {_toml(role)} }}" for name, role in sorted(routes.items())]
        for role, url in sorted(named.items()):
            lines += ["", "[[tool.uv.index]]", f"name = {_toml(role)}", f"url = {_toml(url)}", "explicit = true"]
    return "\n".join(lines) + "\n"


def header(manifest_name: str, manifest: Mapping[str, Any], profiles: Sequence[str], arch: str) -> str:
    chosen = ", ".join(sorted(profiles)) or "none"
    return (
        f"# sparkrig lock of {manifest_name}: {arch}, Python {manifest['python']}, profiles: {chosen}.\n"
        f"# Made on the controller by `{ps.REFRESH}`; hosts install it as it is\n"
        "# (uv pip sync --require-hashes) and never resolve. Do not edit by hand.\n"
        f"{ps.LOCK_STAMP}{ps.lock_input(manifest, profiles, arch)}\n"
    )


def compile_lock(
    manifest: Mapping[str, Any], profiles: Sequence[str], arch: str, index_url: str = DEFAULT_INDEX,
    manifest_name: str = "group_data/python_stack.yml", uv: str = "uv",
) -> str:
    """The lock's text, resolved by uv for ``arch`` and the manifest's Python. Raises
    RuntimeError with uv's message when it does not resolve, or when vLLM's wheel at its
    URL has another sha256 than the manifest says."""
    with tempfile.TemporaryDirectory(prefix="sparkrig-lock-") as work:
        Path(work, "pyproject.toml").write_text(compile_input(manifest, profiles, arch))
        result = subprocess.run(
            [
                uv, "pip", "compile", "--no-config", "--quiet", "--generate-hashes", "--no-header",
                "--no-emit-index-url", "--emit-index-annotation", "--index-url", index_url,
                "--python-platform", f"{arch}-{ps.LOCK_PLATFORM}", "--python-version", manifest["python"],
                "pyproject.toml",
            ],
            cwd=work, capture_output=True, text=True, env={**os.environ, "UV_NO_PROGRESS": "1"},
        )
    if result.returncode != 0:
        raise RuntimeError(f"{arch}, profiles {sorted(profiles)}: uv could not resolve:\n{result.stderr}")
    vllm = manifest.get("vllm")
    wheel = (vllm.get("wheels") or {}).get(arch) if vllm else None
    if wheel:
        entry = dict(ps.lock_entries(result.stdout)).get(ps.normalise(vllm["name"]), [])
        if f"--hash=sha256:{wheel['sha256']}" not in "\n".join(entry):
            raise RuntimeError(f"vllm.wheels.{arch}: the wheel at its URL does not have the sha256 the manifest names")
    return header(manifest_name, manifest, profiles, arch) + result.stdout


def refresh(manifest_path: Path, locks: Path, index_url: str, check: bool) -> list[str]:
    """Make every lock the manifest lists fresh (``check``: only report); the stale ones' names."""
    manifest = ps.load_manifest(manifest_path)
    problem = ps.manifest_problem(manifest, None)
    if problem:
        raise SystemExit(f"python_lock: {manifest_path}: {problem}")
    try:
        name = str(manifest_path.resolve().relative_to(ps.REPO))
    except ValueError:
        name = manifest_path.name
    stale = []
    for arch in manifest["locks"]["architectures"]:
        for profiles in manifest["locks"]["profiles"]:
            path = locks / ps.lock_name(manifest, profiles, arch)
            text = ps.read_lock(path)
            if text is not None and ps.lock_stamp(text) == ps.lock_input(manifest, profiles, arch):
                continue
            stale.append(path.name)
            if check:
                continue
            print(f"python_lock: resolving {path.name}", file=sys.stderr)
            new = compile_lock(manifest, profiles, arch, index_url, name)
            locks.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.new")
            temp.write_text(new)
            temp.replace(path)
    return stale


# Offline: the locked wheels, downloaded once on the controller -------------------------


def target_tags(arch: str, python: str) -> set[str]:
    """The wheel tags a host of the lock's platform and Python accepts."""
    major, minor = (int(x) for x in python.split("."))
    glibc = int(ps.LOCK_PLATFORM.rsplit("_", 1)[1])
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(glibc, 16, -1)]
    platforms += [f"manylinux2014_{arch}", f"linux_{arch}"]
    tags = list(cpython_tags((major, minor), platforms=platforms))
    tags += list(compatible_tags((major, minor), f"cp{major}{minor}", platforms))
    return {str(t) for t in tags}


def _registry_entries(text: str) -> list[tuple[str, str | None, list[str], str | None]]:
    """(name, URL of a direct wheel or None, sha256s, index) of each locked package; built
    wheels (file://) are left out: they are on the host already."""
    found = []
    for name, lines in ps.lock_entries(text):
        first = lines[0].split(" \\")[0].strip()
        hashes = [part.split("sha256:", 1)[1].split()[0] for line in lines for part in line.split("--hash=")[1:]]
        index = next((line.split("# from ", 1)[1].strip() for line in lines if "# from " in line), None)
        if " @ file://" in first:
            continue
        url = first.split(" @ ", 1)[1].strip() if " @ " in first else None
        found.append((name, url, hashes, index))
    return found


def _download(url: str, sha256: str, target: Path) -> None:
    temp = target.with_name(f".{target.name}.part")
    with urllib.request.urlopen(url, timeout=120) as response, open(temp, "wb") as out:
        for block in iter(lambda: response.read(1 << 20), b""):
            out.write(block)
    if atomic.file_sha256(temp) != sha256:
        temp.unlink()
        raise RuntimeError(f"{url}: sha256 differs from the lock's")
    temp.replace(target)


def _index_files(index: str, name: str) -> list[dict]:
    """The files of project ``name`` on a simple index, JSON (PEP 691) or HTML (PEP 503)."""
    accept = f"{_SIMPLE_JSON}, text/html;q=0.1"
    request = urllib.request.Request(f"{index.rstrip('/')}/{name}/", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=60) as response:
        base = response.geturl()
        kind = response.headers.get_content_type()
        body = response.read()
    if kind == _SIMPLE_JSON:
        files = json.loads(body)["files"]
    else:
        files = []
        for href, filename in _ANCHOR.findall(body.decode()):
            url, _, fragment = href.partition("#")
            algorithm, _, value = fragment.partition("=")
            files.append({"filename": html.unescape(filename).strip(), "url": html.unescape(url),
                          "hashes": {algorithm: value} if value else {}})
    return [{**f, "url": urllib.parse.urljoin(base, f["url"])} for f in files]


def offline_wheels(text: str, arch: str, python: str, cache: Path) -> dict[str, str]:
    """Every wheel a host of ``arch`` and ``python`` installs from lock ``text``, file name:
    path in the controller's ``cache``; downloaded there once (sha256 checked against the
    lock), then reused by every host and run. Raises RuntimeError when a package has no
    wheel for the host (an sdist would have to be built there)."""
    accepted = target_tags(arch, python)
    cache.mkdir(parents=True, exist_ok=True)
    known_path = cache / "sha256.json"
    known: dict[str, str] = json.loads(known_path.read_text()) if known_path.is_file() else {}
    by_sha = {sha: name for name, sha in known.items() if (cache / name).is_file()}
    wheels = {}
    for name, url, hashes, index in _registry_entries(text):
        have = next((by_sha[h] for h in hashes if h in by_sha), None)
        if have and _fits(have, accepted):
            wheels[have] = str(cache / have)
            continue
        if url:
            candidates = [{"filename": urllib.parse.unquote(url.rsplit("/", 1)[1]), "url": url,
                           "hashes": {"sha256": hashes[0]}}] if hashes else []
        else:
            candidates = _index_files(index or DEFAULT_INDEX, name)
        fits = [f for f in candidates
                if f["hashes"].get("sha256") in hashes and f["filename"].endswith(".whl") and _fits(f["filename"], accepted)]
        if not fits:
            raise RuntimeError(f"python_offline: no wheel of {name} in the lock fits {arch}, Python {python}")
        chosen = fits[0]
        target = cache / chosen["filename"]
        if not (target.is_file() and atomic.file_sha256(target) == chosen["hashes"]["sha256"]):
            _download(chosen["url"], chosen["hashes"]["sha256"], target)
        known[chosen["filename"]] = chosen["hashes"]["sha256"]
        wheels[chosen["filename"]] = str(target)
    temp = known_path.with_name(".sha256.json.new")
    temp.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    temp.replace(known_path)
    return dict(sorted(wheels.items()))


def _fits(filename: str, accepted: set[str]) -> bool:
    try:
        _name, _version, _build, tags = parse_wheel_filename(filename)
    except ValueError:
        return False
    return any(str(tag) in accepted for tag in tags)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operations.python_lock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", default=str(ps.MANIFEST), help="the versions manifest (YAML)")
    parser.add_argument("--locks", default=ps.LOCKS, help="where its locks live (relative: to the repository)")
    parser.add_argument("--index-url", default=DEFAULT_INDEX, help="the index packages are resolved from")
    parser.add_argument("--check", action="store_true", help="only report stale locks (exit status 1)")
    args = parser.parse_args(argv)
    try:
        stale = refresh(Path(args.manifest), ps.locks_dir(args.locks), args.index_url, args.check)
    except RuntimeError as error:
        print(f"python_lock: {error}", file=sys.stderr)
        return 2
    if args.check and stale:
        print(f"python_lock: stale: {', '.join(stale)}; run `{ps.REFRESH}`", file=sys.stderr)
        return 1
    print(f"python_lock: {'refreshed ' + ', '.join(stale) if stale else 'every lock is fresh'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
