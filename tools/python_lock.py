"""
The Python stack's locks, made on the controller; and the wheels of a lock, for hosts
that cannot reach the index.

    uv run python -m tools.python_lock [--manifest FILE] [--locks DIR] [--check]

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
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkrig.operations import python_stack as ps
from sparkrig.python_wheels import DEFAULT_INDEX


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



def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.python_lock", description=__doc__.split("\n\n")[0])
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
