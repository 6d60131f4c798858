"""Source builds: what a host wants of the catalogue, from its settings alone (no host is
read): each enabled build's stamp and key, its target, and where its unit, build directory
and wheelhouse entry are."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from sparkrig.prefix import ARCHIVE
from sparkrig.wheelhouse import WHEELHOUSE

from .settings import COMMIT, TARGET

BUILD_ROOT = "/var/lib/sparkrig/source-builds"
# The controller names what it keeps itself; a host's names never become controller paths.
CACHED_WHEEL = "wheel.whl"
CACHED_ARCHIVE = ARCHIVE
CACHED_STAMP = "stamp.json"
UNIT_PREFIX = "sparkrig-build-"
KEY_LENGTH = 16
# A wheel's file name (PEP 427): name-version[-build]-python-abi-platform.whl, nothing else.
WHEEL_NAME = re.compile(
    r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_]*)?(-[A-Za-z0-9_.]+){3}\.whl"
)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _torch_version(manifest: Mapping[str, Any]) -> str | None:
    torch = manifest.get("torch") or {}
    return (torch.get("packages") or {}).get("torch")


def build_target(name: str, data: Mapping[str, Any]) -> str:
    """The TORCH_CUDA_ARCH_LIST build ``name`` compiles for on a host with ``data``: the
    entry's own for the host's hardware profile, else the profile's."""
    profile = data["hardware_profile"]
    override = data["source_builds"][name].get("torch_cuda_arch_list") or {}
    return override.get(profile) or data["hardware_profiles"][profile]["torch_cuda_arch_list"]


def build_env(name: str, data: Mapping[str, Any]) -> dict[str, str]:
    """The build's environment on top of the CUDA env file: the entry's, and its target."""
    return {**data["source_builds"][name]["env"], TARGET: build_target(name, data)}


def stamp_inputs(name: str, data: Mapping[str, Any]) -> dict:
    """Everything that makes the wheel of build ``name`` on a host with ``data``.

    The URL counts only with a tag: a commit id names the same sources wherever they
    are fetched from, so moving to a mirror does not rebuild."""
    spec = data["source_builds"][name]
    profile = data["hardware_profiles"][data["hardware_profile"]]
    manifest = data["python_stack"]
    common = {
        "name": name,
        "url": None if COMMIT.fullmatch(spec["ref"]) else spec["url"],
        "ref": spec["ref"],
        "env": dict(sorted(spec["env"].items())),
        "steps": list(spec["steps"]),
        "submodules": spec["submodules"],
        "subdirectory": spec["subdirectory"],
        "arch": profile["arch"],
        "profile": data["hardware_profile"],
        # What it is built for, in the clear: the record says it, peers of another target never share it.
        "target": build_target(name, data),
    }
    if spec["kind"] == "prefix":
        # Each needed build by its key, so a new library rebuilds what was compiled against
        # it. No venv, Python or torch.
        return {
            **common,
            "kind": "prefix",
            "needs": {need: stamp_key(stamp_inputs(need, data)) for need in spec["needs"]},
        }
    return {
        **common,
        "package": spec["package"],
        "build_requirements": list(spec["build_requirements"]),
        "python": None if spec["abi3"] else manifest["python"],
        "torch": _torch_version(manifest) if spec["uses_torch"] else None,
    }


def stamp_problem(stamp: Any) -> str | None:
    """Why a stamp read from a host (written by the build, as the venv's owner) cannot be
    trusted to name a file, or None."""
    if not isinstance(stamp, Mapping):
        return "it is not a JSON object"
    if "archive" in stamp or stamp.get("kind") == "prefix":
        if "wheel" in stamp or stamp.get("archive") != ARCHIVE:
            return f"its archive {str(stamp.get('archive'))[:100]!r} is not {ARCHIVE}"
    elif not (isinstance(stamp.get("wheel"), str) and WHEEL_NAME.fullmatch(stamp["wheel"])):
        return f"its wheel {str(stamp.get('wheel'))[:100]!r} is not a wheel file name"
    if not (isinstance(stamp.get("sha256"), str) and _SHA256.fullmatch(stamp["sha256"])):
        return "its sha256 is not 64 lower-case hex digits"
    return None


def product(stamp: Mapping[str, Any]) -> str:
    """The file a checked stamp names: its wheel, or a prefix build's archive."""
    return stamp.get("wheel") or stamp["archive"]


def cached_file(stamp: Mapping[str, Any]) -> str:
    """The name the controller keeps a build's product under."""
    return CACHED_WHEEL if "wheel" in stamp else CACHED_ARCHIVE


def stamp_key(inputs: Mapping[str, Any]) -> str:
    """The short hash that names a build's unit, build directory and wheelhouse entry."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def unit_name(name: str, key: str) -> str:
    return f"{UNIT_PREFIX}{name}-{key}.service"


def build_dir(name: str, key: str) -> str:
    """Root's: build.sh and the attempt mark."""
    return f"{BUILD_ROOT}/{name}/{key}"


def work_dir(name: str, key: str) -> str:
    """The owner's, where the build runs: sources, environment, result, launches."""
    return f"{build_dir(name, key)}/work"


def env_file(name: str, key: str) -> str:
    """The build's environment, root's, mode 0600 (systemd reads it before the unit drops
    to the owner): secret values stay out of build.sh, the stamp and the command line."""
    return f"{build_dir(name, key)}/env"


def wheelhouse_dir(name: str, key: str) -> str:
    return f"{WHEELHOUSE}/{name}/{key}"


def in_order(data: Mapping[str, Any]) -> list[str]:
    """The enabled builds in the order enabled, each after the builds it needs."""
    done: list[str] = []

    def add(name: str) -> None:
        if name not in done:
            for need in data["source_builds"][name].get("needs", []):
                add(need)
            done.append(name)

    for name in data["source_builds_enabled"]:
        add(name)
    return done


def wanted(data: Mapping[str, Any]) -> dict[str, str]:
    """Each enabled build's key, by name, each after the builds it needs."""
    return {name: stamp_key(stamp_inputs(name, data)) for name in in_order(data)}


def known_keys(data: Mapping[str, Any]) -> dict[str, str] | None:
    """:func:`wanted` for a host's resolved settings, or None when it cannot be known from
    settings alone: a host whose hardware_profile is "auto" and whose box hardware() has not
    read yet (pyinfra prepares hosts one after another, in inventory order, so the hosts
    before this one are resolved and the first of a key still builds)."""
    if data["hardware_profile"] not in data["hardware_profiles"]:
        return None
    return wanted(data)


def runtime_packages(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The apt packages the enabled prefix builds need on every host that installs them."""
    specs = data["source_builds"]
    return tuple(sorted({p for name in wanted(data) for p in specs[name].get("runtime_packages", [])}))


def public_inputs(inputs: Mapping[str, Any]) -> dict:
    """The stamp inputs as they may be shown (build.sh and stamp.json are 0644, and the stamp
    travels to other hosts): the environment's values only as their sha256."""
    env = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in inputs["env"].items()}
    return {**inputs, "env": env}
