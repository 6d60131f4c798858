"""
Source builds: packages compiled on the hosts from a git repository at a pinned ref
(Triton, xformers, vLLM for sm_121), built once per fleet, installed from a wheelhouse;
and prefixes (C/C++/CUDA projects such as NCCL), installed by root into /opt/sparkrig/builds.

Each build is data (``source_builds``, loaded from ``group_data/source_builds.yml``):
repository URL, ref (a commit or a tag), build environment, build steps, build
requirements and the apt packages it needs. All are off; a host or group turns
builds on by name with ``source_builds_enabled``.

- **Stamp.** A build's key hashes everything that makes its wheel: ref (and the URL
  for a tag; a commit id names the same sources on any mirror), environment, steps,
  requirements, the host's architecture and hardware profile,
  the venv's Python (unless the wheel is abi3) and torch version (if it compiles
  against torch). Hosts of one key share one wheel.
- **Detached.** The build runs on the host as a transient systemd service,
  ``sparkrig-build-<name>-<key>.service``, under ``training.slice``, as the venv's
  owner, its log in the journal. It survives a dropped SSH connection; a deploy
  that finds it running never starts it again. With ``source_builds_wait`` the
  deploy waits for it (printing progress), else it returns at once and the next
  run picks up the result.
- **Wheelhouse.** The build ends in ``/var/lib/sparkrig/wheelhouse/<name>/<key>/``:
  the wheel and ``stamp.json`` (URL, ref, commit, environment, wheel, version,
  sha256). The venv installs it through python_stack's lock, where its line
  (``package @ file:///…whl --hash=sha256:…``) replaces the package's locked entry, so
  ``uv pip sync`` keeps it. Its dependencies are not resolved on the host: they must be
  in the lock (Triton, xformers and vLLM depend on what the stack already holds). While a
  new ref builds, the venv keeps the wheel it has.
- **Once per fleet.** Among the hosts of this run that share a key, the first in
  inventory order builds; its wheel is fetched into the controller's cache
  (``source_builds_controller_cache``) and uploaded to the others, which never
  build. A wheel already in the cache is uploaded, not built.
- **Failure.** A failed build leaves the venv as it was; the deploy fails that
  host with the journal's last lines, and the next deploy tries again.
- **Prefix builds** (``kind: prefix``, entries of the owner's: the catalogue ships none) run their steps into
  ``$SPARKRIG_PREFIX``; the product is ``prefix.tar.gz`` of it with ``stamp.json``,
  shared like a wheel. Root copies the archive out as its owner into a root-owned file,
  checks its sha256 and every member (:mod:`sparkrig.unpack_prefix`: files, directories
  and links that stay inside only; no setuid bit) and unpacks it into
  ``/opt/sparkrig/builds/<name>/<key>/``, then points ``current`` at it. ``needs`` names
  prefixes a build compiles against (built first; their keys enter its stamp);
  ``runtime_packages`` are installed on every host that installs it. The venv is not touched.

A converged host costs one remote command (:class:`SourceBuilds`, read once while
pyinfra prepares, by python_stack, which installs the wheels, and by this concern).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import (
    FactBase,
    FileDownloadCommand,
    FunctionCommand,
    QuoteString,
    StringCommand,
    deploy,
    operation,
)

from sparkrig import atomic, host_output, messages, reading, rendering, user_files
from sparkrig.operations import python_stack
from sparkrig.packages import DEFAULT_TIMEOUT_S, TIMEOUT_KEY, install_command
from sparkrig.packages import installed as install_packages
from sparkrig.prefix import (
    ARCHIVE,
    PREFIX_ROOT,
    current,
    installed_dir,
    installed_stamp,
    need_variable,
    unpacker_source,
)
from sparkrig.python_wheels import normalise
from sparkrig.resources import GROUP_DATA
from sparkrig.settings import (
    ALL_DEFAULTS,
    ENV_NAME,
    Setting,
    controller_path,
    declare,
    env_value_problem,
    mapping_of,
    memory_max_check,
    resolved,
    yaml_file,
)
from sparkrig.units import TRAINING_SLICE
from sparkrig.venv import LOCK_LIMIT, STATE_DIR, UV, UV_ENV, package_name

CATALOGUE = GROUP_DATA / "source_builds.yml"
BUILD_ROOT = "/var/lib/sparkrig/source-builds"
WHEELHOUSE = "/var/lib/sparkrig/wheelhouse"
# Root-owned places where root stages a wheel on its way out of or into a host: root never
# writes, reads or chowns through a path in a directory the venv's owner can change.
OUTGOING = "/var/lib/sparkrig/outgoing"
INCOMING = "/var/lib/sparkrig/incoming"
# The controller names what it keeps itself; a host's names never become controller paths.
CACHED_WHEEL = "wheel.whl"
CACHED_ARCHIVE = ARCHIVE
CACHED_STAMP = "stamp.json"
# The most a deploy reads of a host's stamp (its owner can replace it; a stamp is about 1 KB)
# and of a build's result (its exit status).
STAMP_LIMIT = 1 << 20
RESULT_LIMIT = 64
UNIT_PREFIX = "sparkrig-build-"
KEY_LENGTH = 16
TAIL_LINES = 30
PROGRESS_EVERY_S = 60
# The build's unit: nice, first to die under memory pressure, never in swap, and stopped
# (a failed build) when it runs longer than any real build should, so no deploy waits forever.
UNIT_NICE = 10
UNIT_RUNTIME_MAX = "6h"

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
_URL = re.compile(r"(https?://|file:///|/)[^\s'\"\\`$;]+")
_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[A-Za-z0-9.*+!-]+(,[<>=!~]=?[A-Za-z0-9.*+!-]+)*)?")
# A wheel's file name (PEP 427): name-version[-build]-python-abi-platform.whl, nothing else.
WHEEL_NAME = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_]*)?(-[A-Za-z0-9_.]+){3}\.whl")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DEB = re.compile(r"[a-z0-9][a-z0-9.+-]+")
_SUBDIR = re.compile(r"(\.|[A-Za-z0-9_][A-Za-z0-9_./-]*)")
# Each kind's keys: a wheel is installed into the venv (so its package, build venv, torch
# and Python count); a prefix is unpacked by root into PREFIX_ROOT and touches no venv.
_COMMON_KEYS = {"kind", "url", "ref", "env", "steps", "build_packages", "submodules", "subdirectory", "memory_max"}
KIND_KEYS = {
    "wheel": _COMMON_KEYS | {"package", "build_requirements", "uses_torch", "abi3"},
    "prefix": _COMMON_KEYS | {"needs", "runtime_packages"},
}
# Optional in both kinds: the GPU target per hardware profile, where it is not the profile's own.
OPTIONAL_KEYS = {"torch_cuda_arch_list"}
TARGET = "TORCH_CUDA_ARCH_LIST"
_ARCH_LIST = re.compile(r"\d+\.\d+[af]?(\+PTX)?([ ;]\d+\.\d+[af]?(\+PTX)?)*")
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")  # as sparkrig/profile.py names them


def load_catalogue(path: Path | str = CATALOGUE) -> dict:
    """The source builds catalogue at ``path`` (YAML)."""
    return yaml_file(path)


# Checks --------------------------------------------------------------------


def spec_problem(name: Any, spec: Any) -> str | None:
    """What is wrong with one catalogue entry, or None."""
    if not (isinstance(name, str) and _NAME.fullmatch(name)):
        return f"{name!r} is not a build name ([a-z0-9-], at most 31 characters)"
    kind = spec.get("kind") if isinstance(spec, Mapping) else None
    if kind not in KIND_KEYS:
        return f"{name}.kind must be one of: {', '.join(sorted(KIND_KEYS))}"
    if not KIND_KEYS[kind] <= set(spec) <= KIND_KEYS[kind] | OPTIONAL_KEYS:
        return (f"{name} (kind {kind}) must hold exactly: {', '.join(sorted(KIND_KEYS[kind]))}"
                f" (and optionally {', '.join(sorted(OPTIONAL_KEYS))})")
    if not (isinstance(spec["url"], str) and _URL.fullmatch(spec["url"])):
        return f"{name}.url must be an http(s):// or file:/// URL or an absolute path, without quotes or spaces"
    ref = spec["ref"]
    if not (isinstance(ref, str) and (_COMMIT.fullmatch(ref) or _TAG.fullmatch(ref))) or ref in ("HEAD", "main", "master"):
        return f"{name}.ref must be a commit id (40 lower-case hex digits) or a tag, never a branch"
    if kind == "wheel" and not (isinstance(spec["package"], str) and package_name(spec["package"])):
        return f"{name}.package must be a distribution name"
    env = spec["env"]
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and ENV_NAME.fullmatch(k) and env_value_problem(v) is None for k, v in env.items()
    ):
        return f"{name}.env must map variable names to strings without quotes or newlines"
    if TARGET in env:
        return (f"{name}.env must not set {TARGET}: a build targets the host's hardware profile "
                f"(hardware_profiles); set torch_cuda_arch_list: {{PROFILE: LIST}} to override it per profile")
    targets = spec.get("torch_cuda_arch_list", {})
    if not isinstance(targets, Mapping) or not all(
        isinstance(k, str) and _PROFILE.fullmatch(k) and isinstance(v, str) and _ARCH_LIST.fullmatch(v)
        for k, v in targets.items()
    ):
        return f"{name}.torch_cuda_arch_list must map hardware profile names to lists such as '12.1' or '9.0;12.0+PTX'"
    steps = spec["steps"]
    if not isinstance(steps, list) or not all(
        isinstance(s, str) and s.strip() and not any(c in s for c in "\n\r\0") for s in steps
    ):
        return f"{name}.steps must be a list of one-line shell commands"
    if kind == "prefix" and not steps:
        return f"{name}.steps must install the build into $SPARKRIG_PREFIX (a prefix build without steps makes nothing)"
    reqs = spec.get("build_requirements", [])
    if not isinstance(reqs, list) or not all(isinstance(r, str) and _REQUIREMENT.fullmatch(r) for r in reqs):
        return f"{name}.build_requirements must be a list of pip requirements such as 'ninja' or 'setuptools>=64'"
    for key in ("build_packages", "runtime_packages"):
        debs = spec.get(key, [])
        if not isinstance(debs, list) or not all(isinstance(d, str) and _DEB.fullmatch(d) for d in debs):
            return f"{name}.{key} must be a list of apt package names"
    needs = spec.get("needs", [])
    if not isinstance(needs, list) or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in needs) \
            or len(set(needs)) != len(needs) or name in needs:
        return f"{name}.needs must be a list of other prefix builds of the catalogue, each once"
    for flag in ("submodules", "uses_torch", "abi3"):
        if flag in spec and not isinstance(spec[flag], bool):
            return f"{name}.{flag} must be true or false"
    subdirectory = spec["subdirectory"]
    if not (
        isinstance(subdirectory, str) and _SUBDIR.fullmatch(subdirectory)
        and ".." not in subdirectory.split("/") and posixpath.normpath(subdirectory) == subdirectory
    ):
        return f"{name}.subdirectory must be a relative path inside the repository ('.' for its top)"
    memory_max = spec["memory_max"]
    if memory_max is not None and memory_max_check(memory_max, {}):
        return f"{name}.memory_max must be null or {memory_max_check(memory_max, {})}"
    return None


_CATALOGUE_ALLOWED = "a catalogue of builds as documented in group_data/source_builds.yml"
_catalogue_entries = mapping_of(_CATALOGUE_ALLOWED, spec_problem)


def catalogue_check(value: Any, data: Mapping[str, Any]) -> str | None:
    problem = _catalogue_entries(value, data)
    if problem:
        return problem
    allowed = _CATALOGUE_ALLOWED
    for name, spec in value.items():
        for need in spec.get("needs", []):
            if (value.get(need) or {}).get("kind") != "prefix":
                return f"{allowed} ({name}.needs names {need}, which is no prefix build of the catalogue)"
    loop = _needs_loop(value)
    if loop:
        return f"{allowed} ({' needs '.join(loop)}: builds cannot need each other in a loop)"
    manifest = data.get("python_stack")
    enabled = data.get("source_builds_enabled")
    # A bad list is reported by its own check; here it only enables nothing.
    for name in enabled if isinstance(enabled, list) else []:
        spec = value.get(name) if isinstance(name, str) else None
        if isinstance(spec, Mapping) and spec.get("uses_torch") and not (
            isinstance(manifest, Mapping) and manifest.get("torch")
        ):
            return f"{allowed} ({name} compiles against torch, but python_stack installs no torch)"
    return None


def _needs_loop(catalogue: Mapping[str, Any]) -> list[str] | None:
    """A loop of ``needs`` in the catalogue (its builds in order), or None."""
    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return path[path.index(name):] + [name]
        for need in (catalogue.get(name) or {}).get("needs", []):
            loop = visit(need, path + [name])
            if loop:
                return loop
        return None

    for name in sorted(catalogue):
        loop = visit(name, [])
        if loop:
            return loop
    return None


def enabled_check(value: Any, data: Mapping[str, Any]) -> str | None:
    catalogue = data.get("source_builds")
    known = sorted(catalogue) if isinstance(catalogue, Mapping) else []
    allowed = f"a list of builds of source_builds: {', '.join(known) or '(none defined)'}"
    ok = isinstance(value, list) and len(set(value)) == len(value) and all(
        isinstance(name, str) and name in known for name in value
    )
    if not ok:
        return allowed
    for name in value:
        needs = catalogue[name].get("needs") if isinstance(catalogue[name], Mapping) else None
        missing = [n for n in needs if n not in value] if isinstance(needs, list) else []
        if missing:
            return f"{allowed}, with every build each one needs ({name} needs {', '.join(missing)}: enable it too)"
    arch = python_stack.host_arch(data)
    # A bad manifest, profile list or lock directory is reported by its own key; "auto" at deploy.
    if arch is None or python_stack.manifest_check(data.get("python_stack"), data) \
            or python_stack.profiles_check(data.get("python_stack_profiles"), data) \
            or python_stack.locks_check(data.get("python_stack_locks"), data) \
            or _catalogue_entries(catalogue, data):
        return None
    problem = python_stack.missing_builds_message(data, arch)
    return f"{allowed} that makes every package the host's lock leaves to one ({problem})" if problem else None


def wait_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    return None if isinstance(value, bool) else "True (wait for builds) or False (return at once)"


SETTINGS = (
    Setting(
        "source_builds",
        load_catalogue(),
        "The catalogue of builds a host may turn on: Triton, xformers and vLLM (kind wheel: into the "
        "venv) and any C/C++/CUDA project you add, such as NCCL (kind prefix: unpacked by root into "
        "/opt/sparkrig/builds/NAME), each "
        "with its repository URL, pinned ref (commit or tag), build environment, steps and the apt "
        "packages it needs. It lives in group_data/source_builds.yml (documented there); point `url` "
        "at a mirror or a local clone if you have one.",
        catalogue_check,
    ),
    Setting(
        "source_builds_enabled",
        [],
        'Which builds of the catalogue a host builds and installs, e.g. ["triton", "xformers"] (into '
        'its venv) or your prefix builds (into /opt/sparkrig/builds; a build needs what its '
        "`needs` names enabled too). Off by default. Each build takes minutes to an hour and many GB"
        " of memory (docs/source-builds.md); one host of each architecture and profile builds it, "
        "the others receive its wheel or prefix.",
        enabled_check,
    ),
    Setting(
        "source_builds_wait",
        True,
        "True: a deploy that starts a build (or finds one running) waits for it, printing a "
        "progress line every minute (pyinfra -v shows them). False: it returns at once; a later "
        "deploy reports the build's result and installs its wheel.",
        wait_check,
    ),
    Setting(
        "source_builds_controller_cache",
        "~/.cache/sparkrig/wheels",
        "Where the controller keeps built wheels and prefix archives (by build and stamp) to upload "
        "them to the other hosts of the fleet instead of building there too. `~` is the home of the "
        "user running pyinfra.",
        controller_path,
    ),
)
declare(__name__, SETTINGS)


# The wanted state --------------------------------------------------------------


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
        "url": None if _COMMIT.fullmatch(spec["ref"]) else spec["url"],
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
        return {**common, "kind": "prefix",
                "needs": {need: stamp_key(stamp_inputs(need, data)) for need in spec["needs"]}}
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


def line_prefix(name: str, package: str) -> str:
    """How python_stack's requirement line of any wheel of build ``name`` begins."""
    return f"{normalise(package)} @ file://{WHEELHOUSE}/{name}/"


def fact_arguments(data: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of :class:`SourceBuilds` for a host's enabled builds."""
    builds = wanted(data)
    specs = data["source_builds"]
    arguments: dict[str, Any] = {
        "builds": tuple(
            (name, key, line_prefix(name, specs[name]["package"]) if specs[name]["kind"] == "wheel" else "")
            for name, key in builds.items()
        ),
        "venv": data["python_venv_path"],
    }
    installs = tuple((name, key) for name, key in builds.items() if specs[name]["kind"] == "prefix")
    if installs:
        # Only where a prefix build is enabled: the wheel builds' reading stays as it was.
        arguments["installs"] = installs
    return arguments


def runtime_packages(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The apt packages the enabled prefix builds need on every host that installs them."""
    specs = data["source_builds"]
    return tuple(sorted({p for name in wanted(data) for p in specs[name].get("runtime_packages", [])}))


def requirement_lines(data: Mapping[str, Any], found: Mapping[str, Any]) -> dict[str, str]:
    """python_stack's requirement line of each enabled build, by the package's normalised
    name: its wheel when the wheelhouse has it, else the wheel the venv holds now (from an
    earlier ref: the venv keeps it until the new one is built), else none."""
    lines = {}
    for name, key in wanted(data).items():
        if data["source_builds"][name]["kind"] != "wheel":
            continue
        entry = found.get(name) or {}
        stamp = entry.get("stamp")
        package = normalise(data["source_builds"][name]["package"])
        if entry.get("state") == "built" and stamp:
            path = f"{wheelhouse_dir(name, key)}/{stamp['wheel']}"
            lines[package] = f"{package} @ file://{path} --hash=sha256:{stamp['sha256']}"
        elif entry.get("current"):
            lines[package] = entry["current"]
    return lines


def host_requirement_lines(data: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The requirement lines of the built wheels the current host installs now (its
    resolved settings ``data``, by default read from the host); reads
    :class:`SourceBuilds` only when a build is enabled."""
    data = resolved(host.data.dict()) if data is None else data
    builds = wanted(data)
    if not builds:
        return {}
    return requirement_lines(data, read_builds(data))


def read_builds(data: Mapping[str, Any]) -> dict:
    """:class:`SourceBuilds` of the current host's enabled builds. While pyinfra prepares,
    from the host's one reading (python_stack and this concern both need it; nothing on the
    host has changed yet). While operations execute, the host is read again each time."""
    arguments = fact_arguments(data)
    if host.state.is_executing:
        return host.get_fact(SourceBuilds, **arguments)
    return reading.get(SourceBuilds, **arguments)


@reading.planner
def reads(settings):
    # A build's key depends on the hardware profile; "auto" is chosen from the reading itself
    # (hardware()), so such a host reads its builds when they are asked for: one command more.
    if not settings["source_builds_enabled"] or settings["hardware_profile"] not in settings["hardware_profiles"]:
        return []
    parts = [reading.part(SourceBuilds, **fact_arguments(settings))]
    if runtime_packages(settings):
        parts.append(reading.part(atomic.HostState, packages=runtime_packages(settings)))
    return parts


def public_inputs(inputs: Mapping[str, Any]) -> dict:
    """The stamp inputs as they may be shown (build.sh and stamp.json are 0644, and the stamp
    travels to other hosts): the environment's values only as their sha256."""
    env = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in inputs["env"].items()}
    return {**inputs, "env": env}


def render_build_script(name: str, key: str, data: Mapping[str, Any]) -> str:
    spec = data["source_builds"][name]
    inputs = stamp_inputs(name, data)
    common = dict(
        name=name,
        key=key,
        unit=unit_name(name, key),
        url=spec["url"],
        ref=spec["ref"],
        commit_ref=bool(_COMMIT.fullmatch(spec["ref"])),
        submodules=spec["submodules"],
        subdirectory=spec["subdirectory"],
        steps=spec["steps"],
        build_dir=work_dir(name, key),
        wheelhouse_dir=wheelhouse_dir(name, key),
        stamp=json.dumps({**public_inputs(inputs), "url": spec["url"], "key": key}, sort_keys=True),
    )
    if spec["kind"] == "prefix":
        return rendering.render(
            "source_builds/build-prefix.sh.j2",
            **common,
            install_dir=installed_dir(name, key),
            archive=ARCHIVE,
            needs=[
                (need_variable(need), installed_dir(need, need_key), installed_stamp(need, need_key))
                for need, need_key in inputs["needs"].items()
            ],
        )
    venv = data["python_venv_path"]
    return rendering.render(
        "source_builds/build.sh.j2",
        **common,
        build_requirements=["pip", "setuptools", "wheel", *spec["build_requirements"]],
        venv=venv,
        venv_python=posixpath.join(venv, "bin", "python"),
        uv=UV,
        index_url=data["python_index_url"],
    )


# Facts ---------------------------------------------------------------------------


class SourceBuilds(FactBase):
    """
    Returns the state of each source build ``(name, key, prefix)`` on the host, in one command:
    ``built`` (its wheel and stamp are in the wheelhouse), ``running`` (its unit is
    active), ``failed`` (an attempt ended without a wheel: ``result`` holds the build's
    exit status, or None when it never wrote one, as when it was killed) or ``absent``;
    and ``current``: the line of the venv's requirements.lock that starts with ``prefix``
    (the build's wheel the venv holds now, maybe of an earlier ref) while its wheel exists.
    For each prefix build of ``installs`` also ``installed`` (its key, when root's record of
    it is there) and ``link`` (the key ``/opt/sparkrig/builds/NAME/current`` points to).

    .. code:: python

        {"lab-ext": {"state": "built", "unit": "active",
                     "stamp": {"ref": "v1.0", "wheel": "x-1.0-cp38-abi3-linux_x86_64.whl",
                               "sha256": "9f…", "version": "1.0", ...},
                     "result": "0",
                     "current": "x @ file:///var/lib/sparkrig/wheelhouse/lab-ext/af37…/x-1.0-….whl --hash=sha256:9f…"}}
    """

    def command(
        self,
        builds: Sequence[tuple[str, str, str]],
        venv: str,
        installs: Sequence[tuple[str, str]] = (),
    ) -> StringCommand:
        bits: list = ["r=", QuoteString(posixpath.join(venv, STATE_DIR, "requirements.lock")), ";"]
        for name, key in installs:
            # A prefix build: installed (root's record of it, written last) and the link in use.
            bits += [
                "[ -d ", QuoteString(installed_dir(name, key)), " ] && [ -f ", QuoteString(installed_stamp(name, key)),
                " ] && echo ", QuoteString(f"installed {name} {key}"), ";",
                "l=$(readlink ", QuoteString(current(name)), "); [ -n \"$l\" ] && echo \"link ", name, ' $l";',
            ]
        for name, key, prefix in builds:
            n, d, w = QuoteString(name), QuoteString(build_dir(name, key)), QuoteString(wheelhouse_dir(name, key))
            bits += [
                "n=", n, "; d=", d, "; w=", w, "; u=", QuoteString(unit_name(name, key)), ";",
                'echo "unit $n $(systemctl is-active "$u" 2>/dev/null)";',
                "s=$(", user_files.user_read('"$w/stamp.json"', STAMP_LIMIT), " | tr -d '\\n');",
                ' [ -n "$s" ] && echo "stamp $n $s";',
                'for f in "$w"/*.whl "$w"/', QuoteString(ARCHIVE), '; do [ -f "$f" ] && echo "wheel $n ${f##*/}"; done;',
                '[ -f "$d/attempt" ] && echo "attempt $n yes";',
                "x=$(", user_files.user_read(shlex.quote(f"{work_dir(name, key)}/result"), RESULT_LIMIT),
                ') && echo "result $n $x";',
            ]
            if venv and prefix:
                # The line of this build's wheel in the venv's requirements, if that wheel is there.
                bits += [
                    "c=$(", user_files.user_read('"$r"', LOCK_LIMIT), " | grep -F -- ", QuoteString(prefix),
                    ' | head -n 1); p=${c#* @ file://};',
                    ' [ -n "$c" ] && [ -f "${p%% *}" ] && echo "current $n $c";',
                ]
        return host_output.encoded(StringCommand(*bits, "true", _separator=""))

    @staticmethod
    def default() -> dict:
        return {}

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        return self.parse(host_output.decoded(output))

    def parse(self, output: list[str]) -> dict:
        """The reading from the command's decoded lines; ValueError for a stamp that names
        no wheel file (a host's stamp never names a path)."""
        raw: dict[str, dict] = {}
        for line in output:
            kind, _, rest = line.partition(" ")
            name, _, value = rest.partition(" ")
            entry = raw.setdefault(name, {"unit": None, "stamp": None, "wheels": [], "attempt": False, "result": None,
                                          "current": None, "installed": None, "link": None})
            if kind == "unit":
                entry["unit"] = value or None
            elif kind == "stamp":
                try:
                    entry["stamp"] = json.loads(value)
                except ValueError:
                    entry["stamp"] = None
                problem = entry["stamp"] is not None and stamp_problem(entry["stamp"])
                if problem:
                    raise ValueError(f"{wheelhouse_dir(name, '…')}/stamp.json of build {name}: {problem}")
            elif kind == "wheel":
                entry["wheels"].append(value)
            elif kind == "attempt":
                entry["attempt"] = True
            elif kind == "result":
                entry["result"] = value or None
            elif kind == "current":
                entry["current"] = value or None
            elif kind == "installed":
                entry["installed"] = value
            elif kind == "link":
                entry["link"] = value or None
        found = {}
        for name, entry in raw.items():
            stamp = entry["stamp"]
            if entry["unit"] in ("active", "activating", "deactivating", "reloading"):
                state = "running"
            elif isinstance(stamp, dict) and product(stamp) in entry["wheels"]:
                state = "built"
            elif entry["attempt"] or entry["result"] not in (None, "0"):
                state = "failed"
            else:
                state = "absent"
            found[name] = {"state": state, "unit": entry["unit"], "stamp": stamp if state == "built" else None,
                           "result": entry["result"], "current": entry["current"]}
            if entry["installed"] is not None or entry["link"] is not None:
                # A prefix build: the key root installed, and the one `current` links to.
                found[name].update(installed=entry["installed"], link=entry["link"])
        return found


# The controller's cache ------------------------------------------------------------


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


# Operations ----------------------------------------------------------------------


def _report(message: str) -> None:
    """A build's state, shown without -v (pyinfra shows a noop's message only with -v)."""
    logger.warning(f"{host.print_prefix}{message}")


def _wait_command(name: str, key: str) -> StringCommand:
    """Wait while the unit runs (a progress line every minute), then succeed if the wheel
    is there, else print the journal's tail, clear the attempt and fail."""
    unit, d, w = unit_name(name, key), build_dir(name, key), wheelhouse_dir(name, key)
    return StringCommand(
        "u=", QuoteString(unit), "; d=", QuoteString(d), "; w=", QuoteString(w), "; t=0;",
        'while case "$(systemctl is-active "$u" 2>/dev/null)" in active|activating|deactivating|reloading) true;; *) false;; esac; do',
        f" sleep 5; t=$((t + 5)); if [ $((t % {PROGRESS_EVERY_S})) -eq 0 ]; then",
        ' echo "sparkrig: $u running for ${t}s: $(journalctl -u "$u" -n 1 -o cat --no-pager 2>/dev/null)"; fi;',
        "done;",
        _failure_script(name, key),
        _separator="",
    )


def _failure_script(name: str, key: str) -> str:
    unit = unit_name(name, key)
    result = user_files.user_read('"$d/work/result"', RESULT_LIMIT)
    return (
        f'if [ "$({result} 2>/dev/null)" = 0 ] && [ -f "$w/stamp.json" ]; then'
        f' echo "sparkrig: source build {name} finished"; rm -f "$d/attempt"; exit 0; fi;'
        f' echo "sparkrig: source build {name} failed (exit status $({result} 2>/dev/null || echo none:'
        ' killed or interrupted)); the venv is unchanged; the next deploy tries again.'
        f' Last lines of journalctl -u {unit}:" >&2;'
        f' journalctl -u "$u" -n {TAIL_LINES} -o cat --no-pager >&2;'
        ' rm -f "$d/attempt" "$d/work/result"; exit 1'
    )


def _env_text(env: Mapping[str, str]) -> str:
    """A systemd EnvironmentFile of ``env`` (values hold no quotes or newlines: settings)."""
    return "".join(f"{k}='{v}'\n" for k, v in env.items())


@operation()
def build(
    build_name: str,
    key: str,
    script: str,
    owner: str,
    env: Mapping[str, str],
    packages: Sequence[str],
    memory_max: str | None,
    oom_score_adj: int,
    cuda_env_file: str,
    launch: bool = True,
    wait: bool = True,
):
    """
    Start source build ``name`` as a detached systemd unit, and wait for it.

    + build_name: the build's name
    + key: its stamp key (names the unit and its directories)
    + script: the build script, written to the build directory (validated with ``sh -n``)
    + owner: the user the build runs as (the venv's owner)
    + env: the build's environment (on top of ``cuda_env_file``)
    + packages: apt packages the build needs, installed before it starts
    + memory_max: the unit's MemoryMax, or None (training.slice caps it anyway)
    + oom_score_adj: the unit's OOMScoreAdjust (killed before the rest of the host)
    + cuda_env_file: the CUDA env file the unit reads (ignored where missing)
    + launch: start the unit (False: it runs already)
    + wait: wait until the unit ends; fail with the journal's tail if no wheel came of it

    The unit, ``sparkrig-build-NAME-KEY.service``, runs under ``training.slice`` and is
    started only when it is not active, so a second deploy never starts it twice.
    """
    name = build_name
    unit, d, w = unit_name(name, key), build_dir(name, key), wheelhouse_dir(name, key)
    q_d, q_work, q_env = QuoteString(d), QuoteString(work_dir(name, key)), QuoteString(env_file(name, key))
    if launch:
        messages.detail(f"source build {name}: starting {unit}")
        script_path = f"{d}/build.sh"
        temp = atomic.temp_path(script_path)
        if packages:
            # As every concern installs: a bounded wait for the dpkg lock, then the install.
            yield install_command(packages, host.data.get(TIMEOUT_KEY, DEFAULT_TIMEOUT_S))
        # The build directory is root's (an earlier layout gave it to the owner: taken back,
        # and the names root writes cleared first); the owner gets work/ and the wheelhouse
        # entry's parent, each made in a root-owned directory. Nothing of root's goes through
        # a path the owner can change.
        yield StringCommand(
            "install -d -m 755 -o root -g root", QuoteString(posixpath.dirname(d)), q_d,
            QuoteString(WHEELHOUSE),
            "&& rm -rf", QuoteString(temp), QuoteString(f"{d}/attempt"), q_env, QuoteString(f"{d}/env.new"),
            "&& install -d -m 755 -o", QuoteString(owner), "-g", f'"$(id -gn {rendering.quote_literal(owner)})"',
            q_work, QuoteString(posixpath.dirname(w)),
            "&& install -m 600 -o root -g root /dev/null", QuoteString(f"{d}/env.new"),
        )
        yield atomic.Upload(BytesIO(script.encode()), temp)
        yield atomic.Upload(BytesIO(_env_text(env).encode()), f"{d}/env.new")
        properties = [
            f"Nice={UNIT_NICE}", f"OOMScoreAdjust={oom_score_adj}", "MemorySwapMax=0",
            f"EnvironmentFile=-{cuda_env_file}", f"EnvironmentFile={env_file(name, key)}",
            f"WorkingDirectory={work_dir(name, key)}", f"RuntimeMaxSec={UNIT_RUNTIME_MAX}",
        ]
        if memory_max:
            properties.append(f"MemoryMax={memory_max}")
        setenv = dict(v.split("=", 1) for v in UV_ENV)
        yield StringCommand(
            "sh -n", QuoteString(temp), "&& chmod 644", QuoteString(temp),
            "&& mv -f", QuoteString(temp), QuoteString(script_path),
            "&& chmod 600", QuoteString(f"{d}/env.new"), "&& mv -f", QuoteString(f"{d}/env.new"), q_env,
            "&& if systemctl is-active --quiet", QuoteString(unit), "; then echo",
            QuoteString(f"sparkrig: {unit} runs already"), "; else",
            "touch", QuoteString(f"{d}/attempt"), "&& rm -f", QuoteString(f"{work_dir(name, key)}/result"),
            "&& { systemctl reset-failed", QuoteString(unit), "2>/dev/null; true; }",
            "&& systemd-run --quiet --collect --unit", QuoteString(unit),
            "--description", QuoteString(f"sparkrig source build {name}"),
            "--slice", QuoteString(TRAINING_SLICE), "--uid", QuoteString(owner),
            *[arg for p in properties for arg in ("--property", QuoteString(p))],
            *[arg for k, v in setenv.items() for arg in ("--setenv", QuoteString(f"{k}={v}"))],
            "/bin/sh", QuoteString(script_path), "; fi",
        )
    if wait:
        yield _wait_command(name, key)


@operation()
def report_failure(build_name: str, key: str):
    """
    Fail the host with the journal's tail of a failed source build, and clear the
    attempt so that the next deploy tries again.

    + build_name: the build's name
    + key: its stamp key
    """
    name = build_name
    yield StringCommand(
        "u=", QuoteString(unit_name(name, key)), "; d=", QuoteString(build_dir(name, key)),
        "; w=", QuoteString(wheelhouse_dir(name, key)), ";", _failure_script(name, key),
        _separator="",
    )


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
        "install -d -m 755 -o root -g root", QuoteString(OUTGOING), "&& rm -f", QuoteString(outgoing),
        "&& runuser -u", QuoteString(owner), "-- cat --", QuoteString(f"{wheelhouse_dir(name, key)}/{product(stamp)}"),
        ">", QuoteString(outgoing), "&& chmod 644", QuoteString(outgoing),
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
            _report(f"source build {name}: waiting for the build on {builder}; its wheel comes with a later deploy")
        return
    w = wheelhouse_dir(name, key)
    incoming = f"{INCOMING}/{name}-{key}"
    local = cache_root(cache) / name / key
    wheel = product(stamp)  # checked by cached(): a wheel file name or the archive's, no path
    yield StringCommand(
        "install -d -m 755 -o root -g root", QuoteString(INCOMING), QuoteString(WHEELHOUSE),
        "&& rm -rf", QuoteString(incoming), "&& install -d -m 755 -o root -g root", QuoteString(incoming),
        "&& install -d -m 755 -o", QuoteString(owner), "-g", f'"$(id -gn {rendering.quote_literal(owner)})"',
        QuoteString(posixpath.dirname(w)),
    )
    yield atomic.Upload(str(local / cached_file(stamp)), f"{incoming}/{wheel}")
    yield atomic.Upload(BytesIO((json.dumps(stamp, sort_keys=True) + "\n").encode()), f"{incoming}/stamp.json")
    # Into the wheelhouse as its owner (the entry's directory is theirs), checked there.
    yield StringCommand(
        "chmod 644", QuoteString(f"{incoming}/{wheel}"), QuoteString(f"{incoming}/stamp.json"),
        "&& runuser -u", QuoteString(owner), "-- sh -c", QuoteString(RECEIVE_SCRIPT), "receive",
        QuoteString(incoming), QuoteString(w), QuoteString(wheel), QuoteString(stamp["sha256"]),
        "&& rm -rf", QuoteString(incoming),
    )


@operation()
def install_prefix(build_name: str, key: str, cache: str, owner: str = "root"):
    """
    Unpack a prefix build's archive from the wheelhouse into ``/opt/sparkrig/builds/NAME/KEY``
    (root's) and point ``/opt/sparkrig/builds/NAME/current`` at it; nothing while no archive
    is built. Root copies the archive out as its owner, checks it against its sha256 (the
    controller's, when the controller holds it) and checks every member before it unpacks
    (sparkrig/unpack_prefix.py): a member it refuses fails this host, and nothing is installed.

    + build_name: the build's name
    + key: its stamp key
    + cache: the controller's cache directory (its stamp pins the sha256 when it has one)
    + owner: the wheelhouse's owner, who reads the archive out of it
    """
    name = build_name
    found = host_output.direct_fact(SourceBuilds, builds=((name, key, ""),), venv="")
    stamp = ((found or {}).get(name) or {}).get("stamp")
    if (found or {}).get(name, {}).get("state") != "built" or not stamp or "archive" not in stamp:
        return
    pinned = cached(cache_root(cache), name, key)
    sha256 = (pinned or stamp)["sha256"]
    incoming = f"{INCOMING}/{name}-{key}.{ARCHIVE}"
    final, record = installed_dir(name, key), installed_stamp(name, key)
    parent = posixpath.dirname(final)
    record_new = f"{parent}/.{key}.json.new"
    # Root's directories, made anew if anything else is in their place; the owner's archive
    # read by the owner (root never opens a path in their directory) into a root-owned file.
    top = posixpath.dirname(PREFIX_ROOT)
    yield StringCommand(
        # /opt/sparkrig holds the venv too: made where missing, never chowned; refused unless root's.
        "mkdir -p -m 755", QuoteString(top), "&& { [ -n \"$(find", QuoteString(top),
        "-maxdepth 0 -user root ! -perm /022)\" ] || { echo", QuoteString(
            f"sparkrig: source build {name}: {top} is not root's alone (owned or writable by another user):"
            " root installs no prefix below it"), ">&2; exit 1; }; }",
        "&& install -d -m 755 -o root -g root", QuoteString(INCOMING), QuoteString(PREFIX_ROOT), QuoteString(parent),
        "&& rm -rf", QuoteString(incoming), QuoteString(f"{final}.new"), QuoteString(record_new),
        "&& install -m 600 -o root -g root /dev/null", QuoteString(incoming),
        "&& runuser -u", QuoteString(owner), "-- cat --", QuoteString(f"{wheelhouse_dir(name, key)}/{ARCHIVE}"),
        ">", QuoteString(incoming),
    )
    public = {k: v for k, v in stamp.items() if k != "sha256"}
    yield atomic.Upload(BytesIO((json.dumps({**public, "sha256": sha256}, sort_keys=True) + "\n").encode()), record_new)
    yield StringCommand(
        "command -v python3 >/dev/null || { echo", QuoteString(f"sparkrig: source build {name}: root checks its archive"
                                                          " with python3, which this host lacks"), ">&2; exit 1; };",
        "python3 -I -c", QuoteString(unpacker_source()), QuoteString(incoming), QuoteString(sha256),
        QuoteString(f"{final}.new"), QuoteString(f"source build {name}"),
        "|| { rm -rf", QuoteString(f"{final}.new"), QuoteString(incoming), QuoteString(record_new), "; exit 1; };",
        "rm -rf", QuoteString(final), QuoteString(record), "&& mv", QuoteString(f"{final}.new"), QuoteString(final),
        "&& chmod 644", QuoteString(record_new), "&& chown root:root", QuoteString(record_new),
        "&& mv", QuoteString(record_new), QuoteString(record),
        "&& ln -sfn", QuoteString(key), QuoteString(f"{current(name)}.new"),
        "&& mv -T", QuoteString(f"{current(name)}.new"), QuoteString(current(name)),
        "&& rm -f", QuoteString(incoming),
    )


# $1 the root-owned incoming directory, $2 the wheelhouse entry, $3 the wheel, $4 its sha256.
RECEIVE_SCRIPT = (
    'set -e; rm -rf "$2.new"; mkdir -m 755 "$2.new"; cp -- "$1/$3" "$1/stamp.json" "$2.new/";'
    ' cd "$2.new"; echo "$4  $3" | sha256sum --check --quiet; chmod 644 ./*; cd /;'
    ' rm -rf "$2"; mv "$2.new" "$2"'
)


# The deploy ------------------------------------------------------------------------



def _peers(name: str, key: str) -> list[str]:
    """The hosts of this run that want build ``name`` with ``key``, in inventory order
    (from their settings alone: no host is contacted)."""
    state = host.state
    return [
        other.name
        for other in state.inventory
        if state.is_host_in_limit(other)
        and other not in state.failed_hosts
        and known_key(resolved(other.data.dict()), name) == key
    ]


def known_key(data: Mapping[str, Any], name: str) -> str | None:
    """The key of build ``name`` for a host's resolved settings, or None when it cannot be
    known from settings alone: a host whose hardware_profile is "auto" and whose box
    hardware() has not read yet (pyinfra prepares hosts one after another, in inventory
    order, so the hosts before this one are resolved and the first of a key still builds)."""
    if data["hardware_profile"] not in data["hardware_profiles"]:
        return None
    return wanted(data).get(name)


@deploy("Source builds", data_defaults=ALL_DEFAULTS)
def source_builds(sync_venv: Callable[..., Any] | None = None):
    """
    Build the enabled source builds once per fleet; have their wheels installed into the venv
    and their prefixes into /opt/sparkrig/builds.

    + sync_venv: the venv owner's operation that makes the venv hold its lock and the built
      wheels as they are when it runs (``python_stack.synced``; deploy.py passes it); called
      with ``data`` and ``built_wheels`` once a build of this run may add a wheel. Without it
      a new wheel reaches the venv with the next deploy.

    Settings: ``source_builds*``; see docs/settings.md and group_data/source_builds.yml.
    """
    data = resolved(host.data.dict())
    builds = wanted(data)
    if not builds:
        return
    found = read_builds(data)
    cache = data["source_builds_controller_cache"]
    owner = data["python_venv_owner"]
    packages = runtime_packages(data)
    if packages:
        present = reading.get(atomic.HostState, packages=packages)["packages"]
        missing = [p for p in packages if present.get(p) is None]
        if missing:
            install_packages(name=f"Packages the prefix builds need at run time ({', '.join(missing)})", packages=missing)
    pending = False
    deferred: set[str] = set()  # prefix builds that cannot be installed in this run
    for name, key in builds.items():
        spec = data["source_builds"][name]
        prefix = spec["kind"] == "prefix"
        entry = found.get(name) or {}
        state = entry.get("state", "absent")
        peers = _peers(name, key)
        builder = peers[0] if peers else host.name
        building = builder == host.name  # `host` is a context proxy: compare names
        in_cache = cached(cache_root(cache), name, key) is not None
        share = len(peers) > 1 and not in_cache
        if state == "failed":
            report_failure(name=f"Source build {name} failed", build_name=name, key=key)
            continue
        installed = prefix and entry.get("installed") == key and entry.get("link") == key
        if (installed or (state == "built" and not prefix)) and not (share and building):
            continue
        pending = pending or (state != "built" and not prefix)
        runs_here = state == "running" or (state == "absent" and building and not in_cache)
        waiting_for = [need for need in spec.get("needs", []) if need in deferred]
        if runs_here and state != "running" and waiting_for:
            # Its build compiles against the needed prefix, which is not installed yet.
            _report(f"source build {name} waits for {', '.join(waiting_for)}: it is built by a later deploy")
            deferred.add(name)
            continue
        if runs_here and not data["source_builds_wait"]:
            _report(
                f"source build {name} {'runs' if state == 'running' else 'starts'} detached "
                f"({unit_name(name, key)}; journalctl -u to follow it): its "
                f"{'prefix' if prefix else 'wheel'} comes with a later deploy"
            )
        if prefix and not installed and (state != "built" and (runs_here and not data["source_builds_wait"])):
            deferred.add(name)
        # Every host with work for this build calls the same operations in the same order
        # (each a no-op where it is not this host's part): pyinfra orders operations by each
        # host's sequence, and the others' upload must come after the builder's fetch.
        build(
            name=f"Source build {name}, on its builder",
            build_name=name,
            key=key,
            script=render_build_script(name, key, data) if runs_here else "",
            owner=owner,
            env=build_env(name, data),
            packages=spec["build_packages"],
            memory_max=spec["memory_max"],
            oom_score_adj=data["jobs_oom_score_adj"],
            cuda_env_file=data["cuda_env_file"],
            launch=runs_here and state != "running",
            wait=runs_here and data["source_builds_wait"],
        )
        product_name = "prefix" if prefix else "wheel"
        fetch(
            name=f"Source build {name}: the {product_name} from its builder into the controller's cache",
            build_name=name, key=key, cache=cache, owner=owner, active=share and building,
        )
        receive(
            name=f"Source build {name}: the {product_name} from the controller's cache",
            build_name=name, key=key, cache=cache, builder=builder, owner=owner,
            active=state == "absent" and not runs_here,
        )
        if prefix and not installed:
            install_prefix(
                name=f"Source build {name}: root checks its archive and installs it into {installed_dir(name, key)}",
                build_name=name, key=key, cache=cache, owner=owner,
            )
    if pending and sync_venv is not None:
        sync_venv(
            name="Built wheels into the venv (python_venv_path)",
            data=data,
            built_wheels=lambda: host_requirement_lines(data),
        )
