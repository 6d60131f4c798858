"""
The Python stack's manifest, locks and venv, which the source builds read too.

What the Python stack (which installs a lock into the venv) and the source builds (which build
what a lock leaves to them, into that venv, as its owner) both read, so that neither concern
imports the other (tests/repo/test_architecture.py): the settings naming the manifest, the
locks, the venv's path and owner and the index, declared here in the shared layer (documented
after the Python stack's own), with their checks; and each lock, one per architecture and set
of profiles: what it resolves, its name and header, whether it is fresh, what it leaves to
source builds and what a host installs of it (``sparkrig lock`` makes them,
sparkrig/tools/python_lock.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkrig.profile import ARCHES
from sparkrig.profile import profiles_check as hardware_profiles_check
from sparkrig.python_wheels import LOCK_PLATFORM, REFUSED, lock_entries, normalise
from sparkrig.resources import GROUP_DATA
from sparkrig.settings import USER_NAME, Setting, absolute_path, declare, yaml_file
from sparkrig.venv import package_name

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

MANIFEST = GROUP_DATA / "python_stack.yml"
VENV_PATH = "/opt/sparkrig/venv"  # python_venv_path's default
# What PyTorch's indexes may serve when the manifest names one for torch: nothing else.
TORCH_INDEX_PACKAGES = frozenset({"torch", "torchvision", "torchaudio", "triton", "pytorch-triton"})

_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*([a-z0-9.+!-]*)")
_PYTHON = re.compile(r"3\.[0-9]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(r"https?://[^\s'\"\\`$;#?]+")


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
                raise ValueError(f"{name} is pinned to {found[key]} in {where[key]} and to {version} in {source}")
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
    return digest(
        json.dumps(
            {
                "format": LOCK_FORMAT,
                "python": manifest["python"],
                "arch": arch,
                "platform": LOCK_PLATFORM,
                "profiles": sorted(profiles),
                "requirements": lock_requirements(manifest, profiles, arch),
                "routes": routes(manifest),
                "wheel_sha256": wheel["sha256"] if wheel else None,
                "from_source": from_source(manifest, arch),
            },
            sort_keys=True,
        )
    )


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
            return line[len(prefix) :].strip()
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


def load_manifest(path: Path | str = MANIFEST) -> dict:
    """The versions manifest at ``path`` (YAML)."""
    return yaml_file(path)


def _pins_problem(pins: Any, where: str) -> str | None:
    if not isinstance(pins, Mapping):
        return f"{where} must map package names to exact versions"
    for name, version in pins.items():
        if not (isinstance(name, str) and package_name(name)):
            return f"{where}: {name!r} is not a package name"
        if normalise(name) in REFUSED:
            return f"{where}: {name} is never installed ({REFUSED[normalise(name)]})"
        if not (isinstance(version, str) and _VERSION.fullmatch(version)):
            return f"{where}: {name} needs an exact version as a quoted string, not {version!r}"
    return None


def manifest_problem(manifest: Any, arch: str | None) -> str | None:
    """Why ``manifest`` cannot be installed on an ``arch`` host, or None (``arch`` None:
    the host's profile is itself invalid, reported on its own; wheels are not matched)."""
    if not isinstance(manifest, Mapping):
        return "the manifest must be a mapping (group_data/python_stack.yml)"
    unknown = set(manifest) - {"python", "torch", "vllm", "packages", "profiles", "locks", "from_source"}
    if unknown:
        return f"unknown manifest keys: {', '.join(sorted(map(str, unknown)))}"
    if not (isinstance(manifest.get("python"), str) and _PYTHON.fullmatch(manifest["python"])):
        return "python must be a quoted major.minor version such as '3.12'"
    torch = manifest.get("torch")
    if torch is not None:
        if not isinstance(torch, Mapping) or set(torch) != {"index_url", "packages"}:
            return "torch must hold index_url and packages (or be null)"
        if torch["index_url"] is not None and not (
            isinstance(torch["index_url"], str) and _URL.fullmatch(torch["index_url"])
        ):
            return "torch.index_url must be null (PyPI) or an http(s) URL; never uv's 'auto' backend"
        problem = _pins_problem(torch["packages"], "torch.packages")
        if problem:
            return problem
        others = sorted(n for n in torch["packages"] if normalise(n) not in TORCH_INDEX_PACKAGES)
        if torch["index_url"] is not None and others:
            return (
                f"torch.index_url would send {', '.join(others)} to the torch index, which serves "
                f"only {', '.join(sorted(TORCH_INDEX_PACKAGES))}: pin it under packages"
            )
    vllm = manifest.get("vllm")
    if vllm is not None:
        if not isinstance(vllm, Mapping) or not {"name", "version"} <= set(vllm) <= {
            "name",
            "version",
            "wheels",
            "index_url",
        }:
            return "vllm must hold name, version and optionally wheels or index_url (or be null)"
        problem = _pins_problem({vllm["name"]: vllm["version"]}, "vllm")
        if problem:
            return problem
        if vllm.get("index_url") is not None:
            if vllm.get("wheels") is not None:
                return "vllm takes wheels or index_url, not both"
            if not (isinstance(vllm["index_url"], str) and _URL.fullmatch(vllm["index_url"])):
                return "vllm.index_url must be an http(s) URL (an index used for vLLM alone)"
        wheels = vllm.get("wheels")
        if wheels is not None and not isinstance(wheels, Mapping):
            return "vllm.wheels must map CPU architectures to {url, sha256}"
        if wheels is not None and arch is not None and not isinstance(wheels.get(arch), Mapping):
            return f"vllm.wheels has no {{url, sha256}} entry for this host's architecture {arch}"
        for wheel_arch, wheel in (wheels or {}).items():
            if wheel_arch not in ARCHES:
                return f"vllm.wheels: {wheel_arch!r} is not one of {', '.join(ARCHES)}"
            if not isinstance(wheel, Mapping) or set(wheel) != {"url", "sha256"}:
                return f"vllm.wheels.{wheel_arch} must hold url and sha256"
            if not (isinstance(wheel["url"], str) and _URL.fullmatch(wheel["url"])):
                return f"vllm.wheels.{wheel_arch}.url must be an http(s) URL without query or fragment"
            if not (isinstance(wheel["sha256"], str) and _SHA256.fullmatch(wheel["sha256"])):
                return f"vllm.wheels.{wheel_arch}.sha256 must be 64 lower-case hex digits"
    problem = _pins_problem(manifest.get("packages") or {}, "packages")
    if problem:
        return problem
    profiles = manifest.get("profiles") or {}
    if not isinstance(profiles, Mapping):
        return "profiles must map profile names to pins"
    for name, pinned in profiles.items():
        problem = _pins_problem(pinned, f"profiles.{name}")
        if problem:
            return problem
    from_source = manifest.get("from_source") or {}
    if not isinstance(from_source, Mapping) or not all(
        isinstance(name, str)
        and package_name(name)
        and isinstance(arches, list)
        and arches
        and all(a in ARCHES for a in arches)
        for name, arches in from_source.items()
    ):
        return f"from_source must map package names to lists of architectures ({', '.join(ARCHES)})"
    return _locks_problem(manifest.get("locks"), profiles)


def _locks_problem(locks: Any, profiles: Mapping[str, Any]) -> str | None:
    if not isinstance(locks, Mapping) or set(locks) != {"architectures", "profiles"}:
        return "locks must hold architectures and profiles (the sets of profiles hosts enable)"
    arches = locks["architectures"]
    if not (isinstance(arches, list) and arches and all(a in ARCHES for a in arches)):
        return f"locks.architectures must list some of {', '.join(sorted(ARCHES))}"
    sets = locks["profiles"]
    if not (isinstance(sets, list) and sets and all(isinstance(p, list) for p in sets)):
        return "locks.profiles must list sets of profiles, e.g. [[], [unsloth]]"
    for chosen in sets:
        unknown = [p for p in chosen if not isinstance(p, str) or p not in profiles]
        if unknown:
            return f"locks.profiles names {unknown[0]!r}, which is no profile of the manifest"
    return None


def host_arch(data: Mapping[str, Any]) -> str | None:
    """The host's CPU architecture from its profile; None when the profile is invalid."""
    if hardware_profiles_check(data.get("hardware_profiles"), data):
        return None
    profile = data["hardware_profiles"].get(data.get("hardware_profile"))
    return profile["arch"] if isinstance(profile, Mapping) else None


def manifest_check(value: Any, data: Mapping[str, Any]) -> str | None:
    problem = manifest_problem(value, host_arch(data))
    if problem:
        return f"a versions manifest as documented in group_data/python_stack.yml ({problem})"
    profiles = data.get("python_stack_profiles") or []
    try:
        pins(value, profiles if isinstance(profiles, list) else [])
    except ValueError as error:
        return f"a versions manifest without contradicting pins ({error})"
    return None


def profiles_check(value: Any, data: Mapping[str, Any]) -> str | None:
    manifest = data.get("python_stack")
    known = sorted((manifest.get("profiles") or {}) if isinstance(manifest, Mapping) else {})
    ok = isinstance(value, list) and all(isinstance(p, str) and p in known for p in value)
    return None if ok else f"a list of profiles of python_stack: {', '.join(known) or '(none defined)'}"


def user_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and USER_NAME.fullmatch(value)
    return None if ok else "a user name ([a-z_][a-z0-9_-]*, at most 32 characters) that exists on the host"


def index_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and _URL.fullmatch(value)
    return None if ok else "an http(s) URL of a package index (PEP 503), e.g. https://pypi.org/simple"


def locks_check(value: Any, data: Mapping[str, Any]) -> str | None:
    if not (isinstance(value, str) and value):
        return f"a directory of locks on the controller, relative to the repository (default {LOCKS})"
    manifest, arch = data.get("python_stack"), host_arch(data)
    profiles = data.get("python_stack_profiles")
    # A bad manifest or profile list is reported by its own key; "auto" is checked at deploy.
    if arch is None or manifest_check(manifest, data) or profiles_check(profiles, data):
        return None
    problem = lock_problem(manifest, arch, profiles, value)
    return f"a directory holding a fresh lock for this host ({problem})" if problem else None


def packages_from_source(data: Mapping[str, Any], arch: str) -> tuple[str, list[str]] | None:
    """The host's lock (its file name) and the packages it leaves to a source build (the
    manifest's ``from_source``), or None while the lock is missing or stale (python_stack_locks
    reports that itself). source_builds checks that an enabled build makes each of them."""
    manifest, profiles = data["python_stack"], data["python_stack_profiles"]
    name = lock_name(manifest, profiles, arch)
    text = read_lock(locks_dir(data["python_stack_locks"]) / name)
    if text is None or lock_stamp(text) != lock_input(manifest, profiles, arch):
        return None
    return name, lock_from_source(text)


SETTINGS = (
    Setting(
        "python_stack",
        load_manifest(),
        "The versions manifest: Python, torch's versions (from PyPI unless an index is named for "
        "it alone), vLLM's wheel per architecture with its sha256, extra packages, profiles, and "
        "which locks exist. It lives in group_data/python_stack.yml (documented there); bump the "
        "stack by editing it, then run `uv run sparkrig lock`.",
        manifest_check,
    ),
    Setting(
        "python_stack_profiles",
        [],
        'Profiles of the manifest a host installs too, e.g. ["unsloth"]. The manifest\'s locks must'
        " list this set for the host's architecture.",
        profiles_check,
    ),
    Setting(
        "python_stack_locks",
        LOCKS,
        "Where the controller keeps the manifest's locks (relative: to the repository), one per "
        "architecture and set of profiles, made by `uv run sparkrig lock`. A "
        "host whose lock is missing or stale for the manifest stops the deploy before any host is "
        "contacted.",
        locks_check,
    ),
    Setting(
        "python_venv_path",
        VENV_PATH,
        "The virtualenv's directory. It is made anew"
        " (uv venv --clear) when its Python is not "
        "the manifest's; an existing non-venv "
        "directory is refused, never wiped.",
        absolute_path,
    ),
    Setting(
        "python_venv_owner",
        "root",
        "The user who owns the venv (and uv's cache); uv runs as "
        "this user. A Spark's owner usually sets their own login,"
        ' e.g. "spark". The user must exist.',
        user_check,
    ),
    Setting(
        "python_index_url",
        "https://pypi.org/simple",
        "The package index for uv itself and every package the manifest does not pin to another "
        "index: PyPI, or your mirror of it.",
        index_check,
    ),
)
declare(__name__, SETTINGS)
