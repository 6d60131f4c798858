"""
The Python stack's locks, made on the controller; and the wheels of a lock, for hosts
that cannot reach the index.

    sparkrig lock [--manifest FILE] [--locks DIR] [--check]

resolves the manifest (default ``group_data/python_stack.yml``) once for each
architecture and set of profiles its ``locks`` lists, as hosts install it: wheels
only, for that architecture and the manifest's Python, on the glibc floor of
:data:`~sparkrig.python_wheels.LOCK_PLATFORM` (``uv pip compile --only-binary :all:
--python-platform ARCH-manylinux_2_35 --python-version PY --generate-hashes``; a
development release the manifest does not pin is refused: uv takes one only when no
release has a wheel), into ``DIR/<arch>-py<python>[-<profile>...].txt`` (default
``group_data/python_stack.locks``). A package with no wheel for the architecture is
refused, named with the architecture and uv's reason, unless the manifest's
``from_source`` leaves it to a source build there: the lock then leaves it out and
its header names it (settings validation then wants that build enabled). A lock
whose recorded input digest still matches is left as it is; ``--check`` only
reports stale locks and locks a host could not install (exit status 1). Each index
the manifest names (``torch.index_url``, ``vllm.index_url``) is an explicit uv
index: the packages named for it come from there, and nothing else is looked up there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from sparkrig import stack_locks as ps_locks
from sparkrig.python_wheels import DEFAULT_INDEX, LOCK_PLATFORM, lock_entries, normalise
from sparkrig.tools import cli


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
        *[f"    {_toml(r)}," for r in ps_locks.lock_requirements(manifest, profiles, arch)],
        "]",
    ]
    routes, named = ps_locks.routes(manifest), ps_locks.indexes(manifest)
    if routes:
        lines += ["", "[tool.uv.sources]"]
        lines += [f"{name} = {{ index = {_toml(role)} }}" for name, role in sorted(routes.items())]
        for role, url in sorted(named.items()):
            lines += ["", "[[tool.uv.index]]", f"name = {_toml(role)}", f"url = {_toml(url)}", "explicit = true"]
    return "\n".join(lines) + "\n"


def header(
    manifest_name: str,
    manifest: Mapping[str, Any],
    profiles: Sequence[str],
    arch: str,
    from_source: Sequence[str] = (),
) -> str:
    chosen = ", ".join(sorted(profiles)) or "none"
    left = (
        (
            f"# Needs, from a source build (no {arch} wheel; source_builds_enabled):\n"
            f"{ps_locks.LOCK_FROM_SOURCE}{' '.join(from_source)}\n"
        )
        if from_source
        else ""
    )
    return (
        f"# sparkrig lock of {manifest_name}: {arch}, Python {manifest['python']}, profiles: {chosen}.\n"
        f"# Made on the controller by `{ps_locks.REFRESH}`, wheels only; hosts install it as it is\n"
        "# (uv pip sync --require-hashes) and never resolve. Do not edit by hand.\n"
        f"{ps_locks.LOCK_STAMP}{ps_locks.lock_input(manifest, profiles, arch)}\n"
        f"{left}"
    )


# Hosts install wheels only (they never build a source distribution).
WHEELS_ONLY = ("--only-binary", ":all:")
# A lock is resolved for a Python version (--python-version), not with that interpreter: uv
# would otherwise try to download a CPython of that version first, and behind a registry-only
# network it retries for about 90 s per call before it goes on with the one it has.
NO_DOWNLOADS = ("--no-python-downloads",)
_NO_WHEEL = (
    re.compile(r"Wheels are required for `([^`]+)`"),
    re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:[=<>!~][^\s]*)? has no usable wheels"),
)


def no_wheel(uv_said: str) -> list[str]:
    """The packages uv found no usable wheel of, by normalised name."""
    return sorted({normalise(m) for pattern in _NO_WHEEL for m in pattern.findall(uv_said)})


def dev_snapshots(text: str, pinned: Mapping[str, str]) -> list[str]:
    """The locked development releases (``.devN``) the manifest does not pin, ``name==version``:
    uv takes one when no release has a wheel for the platform (xformers 0.0.35.dev1147 is a
    py3-none-any wheel without its compiled ops, the only xformers an aarch64 host could install)."""
    found = []
    for name, lines in lock_entries(text):
        pin = lines[0].split(" \\")[0].strip()
        version = pin.split("==", 1)[1] if "==" in pin else None
        try:
            dev = version is not None and Version(version).is_devrelease
        except InvalidVersion:
            dev = False
        if dev and name not in pinned:
            found.append(f"{name}=={version}")
    return found


def _refusal(arch: str, python: str, what: str, uv_said: str) -> str:
    names = no_wheel(uv_said)
    if not names:
        return f"{what}: uv could not resolve:\n{uv_said}"
    return (
        f"{what}: a host could not install it: {', '.join(names)} "
        f"{'has' if len(names) == 1 else 'have'} no wheel for {arch} (CPython {python}, "
        f"{LOCK_PLATFORM}), and hosts install wheels only, never building a source distribution. "
        f"Pin versions that have such wheels, or list the package under from_source for {arch} "
        f"and enable its source build. uv said:\n{uv_said}"
    )


def uv_compile(
    uv: str, work: str, source: str, arch: str, python: str, index_url: str, *options: str
) -> subprocess.CompletedProcess:
    """``uv pip compile SOURCE`` in ``work`` as every lock is made and checked: nothing
    downloaded but the index's pages, no uv configuration of the caller's, quiet, wheels for
    ``arch``'s platform at the glibc floor and ``python``, from ``index_url``; ``options`` the
    caller's own."""
    return subprocess.run(
        [
            uv,
            "pip",
            "compile",
            *NO_DOWNLOADS,
            "--no-config",
            "--quiet",
            "--no-header",
            "--index-url",
            index_url,
            *options,
            "--python-platform",
            f"{arch}-{LOCK_PLATFORM}",
            "--python-version",
            python,
            source,
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, "UV_NO_PROGRESS": "1"},
    )


def _compile(work: str, arch: str, python: str, index_url: str, uv: str, *extra: str) -> subprocess.CompletedProcess:
    return uv_compile(
        uv,
        work,
        "pyproject.toml",
        arch,
        python,
        index_url,
        "--generate-hashes",
        "--no-emit-index-url",
        "--emit-index-annotation",
        *WHEELS_ONLY,
        *extra,
    )


def compile_lock(
    manifest: Mapping[str, Any],
    profiles: Sequence[str],
    arch: str,
    index_url: str = DEFAULT_INDEX,
    manifest_name: str = "group_data/python_stack.yml",
    uv: str = "uv",
) -> str:
    """The lock's text, resolved by uv for ``arch`` and the manifest's Python, wheels only.
    Raises RuntimeError naming the package, the architecture and uv's reason when a host
    could not install it, or when vLLM's wheel at its URL has another sha256 than the
    manifest says. A package of ``from_source`` for ``arch`` that the resolution needs is
    left out (a uv override that drops it there) and named in the header."""
    what = f"{ps_locks.lock_name(manifest, profiles, arch)} ({arch}, profiles {sorted(profiles)})"
    left_to_builds = ps_locks.from_source(manifest, arch)
    pins = ps_locks.pins(manifest, profiles)
    with tempfile.TemporaryDirectory(prefix="sparkrig-lock-") as work:
        Path(work, "pyproject.toml").write_text(compile_input(manifest, profiles, arch))
        result = _compile(work, arch, manifest["python"], index_url, uv)
        said = (
            result.stderr
            if result.returncode
            else " ".join(
                f"{snapshot.split('==')[0]} has no usable wheels" for snapshot in dev_snapshots(result.stdout, pins)
            )
        )
        needed = sorted(set(no_wheel(said)) & set(left_to_builds))
        if needed:
            # Needed, and no wheel: resolved on without it, as the host installs it (the build's
            # wheel joins the host's lock). uv names one such package at a time.
            Path(work, "overrides.txt").write_text(
                "".join(f"{name} ; platform_machine != '{arch}'\n" for name in left_to_builds)
            )
            result = _compile(work, arch, manifest["python"], index_url, uv, "--overrides", "overrides.txt")
    if result.returncode != 0:
        raise RuntimeError(_refusal(arch, manifest["python"], what, result.stderr))
    snapshots = dev_snapshots(result.stdout, pins)
    if snapshots:
        raise RuntimeError(
            _refusal(
                arch,
                manifest["python"],
                what,
                "".join(
                    f"{s.split('==')[0]} has no usable wheels but the development snapshot {s} "
                    "(no release has a wheel here; pin it in the manifest if you mean it)\n"
                    for s in snapshots
                ),
            )
        )
    vllm = manifest.get("vllm")
    wheel = (vllm.get("wheels") or {}).get(arch) if vllm else None
    if wheel:
        entry = dict(lock_entries(result.stdout)).get(normalise(vllm["name"]), [])
        if f"--hash=sha256:{wheel['sha256']}" not in "\n".join(entry):
            raise RuntimeError(f"vllm.wheels.{arch}: the wheel at its URL does not have the sha256 the manifest names")
    return header(manifest_name, manifest, profiles, arch, needed) + result.stdout


def installable_problem(
    text: str,
    arch: str,
    python: str,
    index_url: str = DEFAULT_INDEX,
    extra_index_urls: Sequence[str] = (),
    uv: str = "uv",
    what: str = "the lock",
) -> str | None:
    """Why a host of ``arch`` and ``python`` could not install lock ``text`` as it is (a
    pinned package without a wheel for it), or None: each pin resolved on its own
    (``--no-deps``), wheels only, for that platform, from the indexes the host uses."""
    pins = [lines[0].split(" \\")[0].strip() for _name, lines in lock_entries(text)]
    indexes = [arg for url in extra_index_urls for arg in ("--extra-index-url", url)]
    if indexes:
        indexes.append("--index-strategy=unsafe-best-match")  # as hosts do: every file is pinned
    with tempfile.TemporaryDirectory(prefix="sparkrig-lock-check-") as work:
        Path(work, "pins.txt").write_text("\n".join(pins) + "\n")
        result = uv_compile(uv, work, "pins.txt", arch, python, index_url, "--no-deps", *indexes, *WHEELS_ONLY[:2])
    return None if result.returncode == 0 else _refusal(arch, python, what, result.stderr)


def refresh(manifest_path: Path, locks: Path, index_url: str, check: bool) -> list[str]:
    """Make every lock the manifest lists fresh (``check``: only report); the names of the
    stale ones and (``check``) of fresh ones a host could not install, each said on stderr."""
    manifest = ps_locks.load_manifest(manifest_path)
    problem = ps_locks.manifest_problem(manifest, None)
    if problem:
        raise SystemExit(f"python_lock: {manifest_path}: {problem}")
    try:
        name = str(manifest_path.resolve().relative_to(ps_locks.REPO))
    except ValueError:
        name = manifest_path.name
    stale = []
    for arch in manifest["locks"]["architectures"]:
        for profiles in manifest["locks"]["profiles"]:
            path = locks / ps_locks.lock_name(manifest, profiles, arch)
            text = ps_locks.read_lock(path)
            if text is not None and ps_locks.lock_stamp(text) == ps_locks.lock_input(manifest, profiles, arch):
                refused = check and installable_problem(
                    text,
                    arch,
                    manifest["python"],
                    index_url,
                    sorted(ps_locks.indexes(manifest).values()),
                    what=path.name,
                )
                if refused:
                    print(f"python_lock: {refused}", file=sys.stderr)
                    stale.append(path.name)
                continue
            stale.append(path.name)
            if check:
                print(f"python_lock: {path.name} is stale for its manifest", file=sys.stderr)
                continue
            print(f"python_lock: resolving {path.name}", file=sys.stderr)
            new = compile_lock(manifest, profiles, arch, index_url, name)
            locks.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.new")
            temp.write_text(new)
            temp.replace(path)
    return stale


@cli.command("lock", "the Python stack's locks, made or checked (--check) against the index")
def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("lock", __doc__, [(2, "the command line is wrong, or uv could not resolve the manifest")])
    parser.add_argument("--manifest", default=str(ps_locks.MANIFEST), help="the versions manifest (YAML)")
    parser.add_argument("--locks", default=ps_locks.LOCKS, help="where its locks live (relative: to the repository)")
    parser.add_argument("--index-url", default=DEFAULT_INDEX, help="the index packages are resolved from")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only report stale locks and locks a host could not install (exit status 1)",
    )
    args = parser.parse_args(argv)
    try:
        stale = refresh(Path(args.manifest), ps_locks.locks_dir(args.locks), args.index_url, args.check)
    except RuntimeError as error:
        print(f"python_lock: {error}", file=sys.stderr)
        return 2
    if args.check and stale:
        print(f"python_lock: stale or not installable: {', '.join(stale)}; run `{ps_locks.REFRESH}`", file=sys.stderr)
        return 1
    print(f"python_lock: {'refreshed ' + ', '.join(stale) if stale else 'every lock is fresh'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
