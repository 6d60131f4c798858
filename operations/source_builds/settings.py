"""Source builds: the catalogue (group_data/source_builds.yml), the builds a host enables,
the deploy's waiting and the controller's cache; declared once, with their checks."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkrig import stack_locks
from sparkrig.operations.cuda_env import settings as cuda_env_settings
from sparkrig.operations.hardware import settings as hardware_settings
from sparkrig.operations.jobs import settings as jobs_settings
from sparkrig.python_wheels import normalise
from sparkrig.resources import GROUP_DATA
from sparkrig.settings import (
    ENV_NAME,
    Setting,
    controller_path,
    declare,
    defaults,
    env_value_problem,
    mapping_of,
    memory_max_check,
    yaml_file,
)
from sparkrig.venv import package_name

CATALOGUE = GROUP_DATA / "source_builds.yml"

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")
COMMIT = re.compile(r"[0-9a-f]{40}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
_URL = re.compile(r"(https?://|file:///|/)[^\s'\"\\`$;]+")
_REQUIREMENT = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[A-Za-z0-9.*+!-]+(,[<>=!~]=?[A-Za-z0-9.*+!-]+)*)?"
)
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
        return (
            f"{name} (kind {kind}) must hold exactly: {', '.join(sorted(KIND_KEYS[kind]))}"
            f" (and optionally {', '.join(sorted(OPTIONAL_KEYS))})"
        )
    if not (isinstance(spec["url"], str) and _URL.fullmatch(spec["url"])):
        return f"{name}.url must be an http(s):// or file:/// URL or an absolute path, without quotes or spaces"
    ref = spec["ref"]
    if not (isinstance(ref, str) and (COMMIT.fullmatch(ref) or _TAG.fullmatch(ref))) or ref in (
        "HEAD",
        "main",
        "master",
    ):
        return f"{name}.ref must be a commit id (40 lower-case hex digits) or a tag, never a branch"
    if kind == "wheel" and not (isinstance(spec["package"], str) and package_name(spec["package"])):
        return f"{name}.package must be a distribution name"
    env = spec["env"]
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and ENV_NAME.fullmatch(k) and env_value_problem(v) is None for k, v in env.items()
    ):
        return f"{name}.env must map variable names to strings without quotes or newlines"
    if TARGET in env:
        return (
            f"{name}.env must not set {TARGET}: a build targets the host's hardware profile "
            f"(hardware_profiles); set torch_cuda_arch_list: {{PROFILE: LIST}} to override it per profile"
        )
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
    if (
        not isinstance(needs, list)
        or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in needs)
        or len(set(needs)) != len(needs)
        or name in needs
    ):
        return f"{name}.needs must be a list of other prefix builds of the catalogue, each once"
    for flag in ("submodules", "uses_torch", "abi3"):
        if flag in spec and not isinstance(spec[flag], bool):
            return f"{name}.{flag} must be true or false"
    subdirectory = spec["subdirectory"]
    if not (
        isinstance(subdirectory, str)
        and _SUBDIR.fullmatch(subdirectory)
        and ".." not in subdirectory.split("/")
        and posixpath.normpath(subdirectory) == subdirectory
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
        if (
            isinstance(spec, Mapping)
            and spec.get("uses_torch")
            and not (isinstance(manifest, Mapping) and manifest.get("torch"))
        ):
            return f"{allowed} ({name} compiles against torch, but python_stack installs no torch)"
    return None


def _needs_loop(catalogue: Mapping[str, Any]) -> list[str] | None:
    """A loop of ``needs`` in the catalogue (its builds in order), or None."""

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return path[path.index(name) :] + [name]
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
    ok = (
        isinstance(value, list)
        and len(set(value)) == len(value)
        and all(isinstance(name, str) and name in known for name in value)
    )
    if not ok:
        return allowed
    for name in value:
        needs = catalogue[name].get("needs") if isinstance(catalogue[name], Mapping) else None
        missing = [n for n in needs if n not in value] if isinstance(needs, list) else []
        if missing:
            return f"{allowed}, with every build each one needs ({name} needs {', '.join(missing)}: enable it too)"
    arch = stack_locks.host_arch(data)
    # A bad manifest, profile list or lock directory is reported by its own key; "auto" at deploy.
    if (
        arch is None
        or stack_locks.manifest_check(data.get("python_stack"), data)
        or stack_locks.profiles_check(data.get("python_stack_profiles"), data)
        or stack_locks.locks_check(data.get("python_stack_locks"), data)
        or _catalogue_entries(catalogue, data)
    ):
        return None
    problem = missing_builds_message(data, arch)
    return f"{allowed} that makes every package the host's lock leaves to one ({problem})" if problem else None


def wait_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    return None if isinstance(value, bool) else "True (wait for builds) or False (return at once)"


def missing_builds(data: Mapping[str, Any], arch: str) -> dict[str, list[str]]:
    """Each package the host's lock (python_stack's) leaves to a source build that no enabled
    wheel build of the host makes: the catalogue's builds that would (``{"xformers":
    ["xformers"]}``). Empty when the lock is missing or stale (reported on its own)."""
    found = stack_locks.packages_from_source(data, arch)
    if found is None:
        return {}
    makes: dict[str, list[str]] = {}
    for build, spec in (data.get("source_builds") or {}).items():
        if isinstance(spec, Mapping) and spec.get("kind") == "wheel" and isinstance(spec.get("package"), str):
            makes.setdefault(normalise(spec["package"]), []).append(build)
    enabled = set(data.get("source_builds_enabled") or [])
    return {
        package: sorted(makes.get(package, [])) for package in found[1] if not enabled & set(makes.get(package, []))
    }


def missing_builds_message(data: Mapping[str, Any], arch: str) -> str | None:
    """:func:`missing_builds` in words, or None."""
    missing = missing_builds(data, arch)
    if not missing:
        return None
    name = stack_locks.packages_from_source(data, arch)[0]
    said = "; ".join(
        f"{package} has no {arch} wheel: enable "
        + (" or ".join(builds) if builds else f"a build of {package} (none in source_builds)")
        for package, builds in sorted(missing.items())
    )
    return f"the lock {name} leaves {', '.join(sorted(missing))} to a source build ({said})"


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
        "its venv) or your prefix builds (into /opt/sparkrig/builds; a build needs what its "
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

# The deploy's data_defaults: its own settings and the shared layer's that it reads with the
# Python stack (the manifest, profiles and locks its checks and stamps read; the venv, its owner
# and index: sparkrig/stack_locks.py),
# hardware (the profile the build targets), jobs (jobs_oom_score_adj of the build's unit) and
# cuda_env (cuda_env_file, the unit's environment).
DEFAULTS = defaults(
    (
        *SETTINGS,
        *stack_locks.SETTINGS,
        *hardware_settings.SETTINGS,
        *jobs_settings.SETTINGS,
        *cuda_env_settings.SETTINGS,
    )
)
