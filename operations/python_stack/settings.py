"""Python stack: uv, and a virtualenv holding exactly a lock made on the controller: the settings,
declared once, and their checks (source_builds' settings call host_arch, manifest_check,
profiles_check, locks_check and missing_builds_message)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkrig.operations.hardware import settings as hardware_settings
from sparkrig.profile import ARCHES
from sparkrig.profile import profiles_check as hardware_profiles_check
from sparkrig.python_wheels import REFUSED, normalise
from sparkrig.resources import GROUP_DATA
from sparkrig.settings import (
    USER_NAME,
    Setting,
    absolute_path,
    boolean,
    controller_path,
    declare,
    defaults,
    one_of,
    yaml_file,
)
from sparkrig.venv import package_name

from .locks import (
    LOCKS,
    lock_from_source,
    lock_input,
    lock_name,
    lock_problem,
    lock_stamp,
    locks_dir,
    pins,
    read_lock,
)

MANIFEST = GROUP_DATA / "python_stack.yml"
VENV_PATH = "/opt/sparkrig/venv"  # python_venv_path's default
# What PyTorch's indexes may serve when the manifest names one for torch: nothing else.
TORCH_INDEX_PACKAGES = frozenset({"torch", "torchvision", "torchaudio", "triton", "pytorch-triton"})

_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*([a-z0-9.+!-]*)")
_PYTHON = re.compile(r"3\.[0-9]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(r"https?://[^\s'\"\\`$;#?]+")
_UV_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


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
            "name", "version", "wheels", "index_url"
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
        isinstance(name, str) and package_name(name) and isinstance(arches, list) and arches
        and all(a in ARCHES for a in arches) for name, arches in from_source.items()
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


def uv_version_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and _UV_VERSION.fullmatch(value)
    return None if ok else "a uv release as X.Y.Z, e.g. '0.13.9'"


def hashes_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(h, str) and _SHA256.fullmatch(h) for h in value)
    return None if ok else "a non-empty list of sha256 digests (64 lower-case hex digits)"


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
    Setting("python_venv_path", VENV_PATH, "The virtualenv's directory. It is made anew"
                                                      " (uv venv --clear) when its Python is not "
                                                      "the manifest's; an existing non-venv "
                                                      "directory is refused, never wiped.", absolute_path),
    Setting("python_venv_owner", "root", "The user who owns the venv (and uv's cache); uv runs as "
                                         "this user. A Spark's owner usually sets their own login,"
                                         ' e.g. "spark". The user must exist.', user_check),
    Setting(
        "python_venv_python_preference",
        "system",
        'How uv finds the venv\'s Python: "system" (a system interpreter of the manifest\'s version '
        'first, a uv-managed download only if none), "only-system" (never download), "managed" or '
        '"only-managed".',
        one_of("only-system", "system", "managed", "only-managed"),
    ),
    Setting(
        "python_index_url",
        "https://pypi.org/simple",
        "The package index for uv itself and every package the manifest does not pin to another "
        "index: PyPI, or your mirror of it.",
        index_check,
    ),
    Setting("python_uv_version", "0.13.9", "The uv release installed into /opt/sparkrig/uv (linked"
                                           " from /usr/local/bin/uv when that name is free).", uv_version_check),
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
        "Where the controller keeps those wheels, shared by every host and run (~ is the "
        "controller user's home).",
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

# Its own settings and the hardware profile's (the host's architecture); the deploy adds
# source_builds' (deploy.py: which builds make what the lock leaves to them).
DEFAULTS = defaults((*SETTINGS, *hardware_settings.SETTINGS))
