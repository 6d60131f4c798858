"""Python stack: the controller's locks of the manifest, one per architecture and set of
profiles: what each resolves, its name and header, whether it is fresh, and what a host
installs of it. Shared by the settings checks, the deploy and ``tools/python_lock.py``."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkrig.python_wheels import LOCK_PLATFORM, lock_entries, normalise
from sparkrig.resources import GROUP_DATA

# What relative locks paths start from: the checkout (sparkrig/group_data links into its
# group_data/), or the installed package.
REPO = (GROUP_DATA / "python_stack.yml").resolve().parents[1]
LOCKS = "group_data/python_stack.locks"  # beside the manifest, relative to the repository
REFRESH = "uv run sparkrig lock"
# 2: resolved wheels only (--only-binary :all:, --prerelease explicit), with from_source.
LOCK_FORMAT = 2
LOCK_STAMP = "# sparkrig-input: "
# The packages a lock leaves to a source build (the manifest's from_source, where needed).
LOCK_FROM_SOURCE = "# sparkrig-from-source: "


def pins(manifest: Mapping[str, Any], profiles: Sequence[str]) -> dict[str, str]:
    """Every name: version pinned from an index (torch, vLLM without wheels, extras,
    the chosen profiles), by normalised name; a name pinned twice differently is an error."""
    found: dict[str, str] = {}
    sources = []
    if manifest.get("torch"):
        sources.append(("torch.packages", manifest["torch"]["packages"]))
    vllm = manifest.get("vllm")
    if vllm:
        sources.append(("vllm", {vllm["name"]: vllm["version"]}))
    sources.append(("packages", manifest.get("packages") or {}))
    for profile in profiles:
        sources.append((f"profiles.{profile}", (manifest.get("profiles") or {}).get(profile) or {}))
    where: dict[str, str] = {}
    for source, entries in sources:
        for name, version in entries.items():
            key = normalise(name)
            if key in found and found[key] != version:
                raise ValueError(
                    f"{name} is pinned to {found[key]} in {where[key]} and to {version} in {source}"
                )
            found[key], where[key] = version, source
    return found


def indexes(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The indexes the manifest names for some packages alone, by role: ``torch``, ``vllm``."""
    found = {}
    if manifest.get("torch") and manifest["torch"].get("index_url"):
        found["torch"] = manifest["torch"]["index_url"]
    if manifest.get("vllm") and manifest["vllm"].get("index_url"):
        found["vllm"] = manifest["vllm"]["index_url"]
    return found


def routes(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Each package that comes from a named index, by normalised name: the index's role."""
    found = {}
    if "torch" in indexes(manifest):
        found.update({normalise(n): "torch" for n in manifest["torch"]["packages"]})
    if "vllm" in indexes(manifest):
        found[normalise(manifest["vllm"]["name"])] = "vllm"
    return found


def lock_requirements(manifest: Mapping[str, Any], profiles: Sequence[str], arch: str) -> list[str]:
    """The requirements a lock resolves: one exact pin per package, vLLM's wheel by URL."""
    vllm = manifest.get("vllm")
    wheel = (vllm.get("wheels") or {}).get(arch) if vllm else None
    lines = []
    for name, version in sorted(pins(manifest, profiles).items()):
        if wheel and name == normalise(vllm["name"]):
            lines.append(f"{name} @ {wheel['url']}")
        else:
            lines.append(f"{name}=={version}")
    return lines


def from_source(manifest: Mapping[str, Any], arch: str) -> list[str]:
    """The packages the manifest leaves to a source build on ``arch`` (no wheel there), by
    normalised name: its locks for ``arch`` never hold them."""
    return sorted(normalise(n) for n, arches in (manifest.get("from_source") or {}).items() if arch in arches)


def lock_input(manifest: Mapping[str, Any], profiles: Sequence[str], arch: str) -> str:
    """The digest a lock records of what it was resolved from. Index URLs are left out (a
    mirror serves the same files, whose sha256 the lock pins); which packages come from
    a named index, and vLLM's wheel sha256, are in."""
    vllm = manifest.get("vllm")
    wheel = (vllm.get("wheels") or {}).get(arch) if vllm else None
    return digest(json.dumps({
        "format": LOCK_FORMAT, "python": manifest["python"], "arch": arch,
        "platform": LOCK_PLATFORM, "profiles": sorted(profiles),
        "requirements": lock_requirements(manifest, profiles, arch),
        "routes": routes(manifest), "wheel_sha256": wheel["sha256"] if wheel else None,
        "from_source": from_source(manifest, arch),
    }, sort_keys=True))


def lock_name(manifest: Mapping[str, Any], profiles: Sequence[str], arch: str) -> str:
    """The lock's file name: ``aarch64-py3.12.txt``, ``aarch64-py3.12-unsloth.txt``."""
    suffix = "".join(f"-{p}" for p in sorted(profiles))
    return f"{arch}-py{manifest['python']}{suffix}.txt"


def locks_dir(value: str) -> Path:
    """The locks directory of setting ``python_stack_locks`` (relative: to the repository)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else REPO / path


def refresh_command(locks: str) -> str:
    extra = "" if locks == LOCKS else f" --locks {locks} --manifest MANIFEST"
    return REFRESH + extra


@functools.lru_cache(maxsize=64)
def _read(path: Path, _mtime_ns: int) -> str:
    return path.read_text()


def read_lock(path: Path) -> str | None:
    """The lock file's text (read once per change of the file), or None when missing."""
    try:
        return _read(path, path.stat().st_mtime_ns)
    except FileNotFoundError:
        return None


def _header_value(text: str, prefix: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].strip()
        if not line.startswith("#"):
            break
    return None


def lock_stamp(text: str) -> str | None:
    """The input digest in a lock's header."""
    return _header_value(text, LOCK_STAMP)


def lock_from_source(text: str) -> list[str]:
    """The packages a lock needs and leaves to a source build (its header says which)."""
    return (_header_value(text, LOCK_FROM_SOURCE) or "").split()


def lock_problem(manifest: Mapping[str, Any], arch: str, profiles: Sequence[str], locks: str) -> str | None:
    """Why the host with this manifest, architecture and profiles has no usable lock, or None."""
    chosen = sorted(profiles)
    listed = [sorted(p) for p in manifest["locks"]["profiles"]]
    if arch not in manifest["locks"]["architectures"] or chosen not in listed:
        return (
            f"the manifest's locks list no lock for {arch} with profiles {chosen}: "
            f"add it to locks and run `{refresh_command(locks)}`"
        )
    name = lock_name(manifest, profiles, arch)
    text = read_lock(locks_dir(locks) / name)
    if text is None:
        return f"{locks}/{name} is missing: run `{refresh_command(locks)}`"
    if lock_stamp(text) != lock_input(manifest, profiles, arch):
        return f"{locks}/{name} is stale for its manifest: run `{refresh_command(locks)}`"
    return None


def host_lock(text: str, built: Mapping[str, str] | None = None) -> str:
    """What a host installs: the controller's lock, each built wheel (operations/source_builds/,
    by normalised name: its requirement line) replacing its package's entry or added."""
    built = built or {}
    if not built:
        return text
    lines = text.splitlines()
    header = lines[: next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))]
    body = [line for name, lines in lock_entries(text) if name not in built for line in lines]
    extra = [f"{built[name]}\n    # built from source by sparkrig (source_builds)" for name in sorted(built)]
    return "\n".join(header + body + extra) + "\n"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
