"""
Python ML stack: uv, and a virtualenv holding exactly a lock made on the controller.

The stack is data: ``python_stack`` (loaded from ``group_data/python_stack.yml``)
names the Python version, torch (from PyPI unless an index is named for it alone),
vLLM's wheel per CPU architecture with its sha256, extras and optional profiles.

- **Locks.** ``uv run python -m tools.python_lock`` resolves the manifest on the
  controller, once per (architecture, Python, set of profiles) listed under ``locks``,
  into ``group_data/python_stack.locks/`` (``uv pip compile --generate-hashes``, every
  file's sha256). Each lock's header records a digest of its inputs: settings
  validation refuses a host whose lock is missing or stale, before any host is contacted.
- **Hosts never resolve.** The lock is uploaded to ``<venv>/sparkrig/requirements.lock``
  (built wheels, operations/source_builds.py, replace their package's entry) and
  ``uv pip sync --require-hashes`` makes the venv hold exactly that. With
  ``python_offline`` the controller downloads the locked wheels once (hashes checked)
  and hosts install them with ``--offline --no-index``.
- uv, pinned by version and sha256, is installed from a package index into its own
  tool environment ``/opt/sparkrig/uv`` (``/usr/local/bin/uv`` links to it unless
  that name is taken); no ``curl | sh``.
- Whether anything changes is read once (:class:`PythonStack`): the sha256 of the
  host's lock and uv's offline ``uv pip sync --dry-run`` of it ("Would make no changes").

uv runs as the venv's owner, with ``--no-config`` (no user or system uv.toml
changes what is installed) and ``UV_SYSTEM_CERTS=1`` (the system CA store, which
holds ``ca_certificates_extra``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation

from sparkrig import atomic, host_output, messages, reading, rendering, user_files
from sparkrig.messages import refused
from sparkrig.packages import installed as install_packages
from sparkrig.profile import ARCHES, host_profile
from sparkrig.profile import profiles_check as hardware_profiles_check
from sparkrig.python_wheels import LOCK_PLATFORM, REFUSED, lock_entries, normalise, offline_wheels
from sparkrig.resources import GROUP_DATA
from sparkrig.settings import (
    ALL_DEFAULTS,
    USER_NAME,
    Setting,
    absolute_path,
    boolean,
    controller_path,
    declare,
    one_of,
    resolved,
    yaml_file,
)
from sparkrig.venv import LOCK_LIMIT, STATE_DIR, UV, UV_CACHE, UV_ENV, UV_TOOL, package_name

REPO = GROUP_DATA.parent  # the checkout, or the installed package: what relative locks paths start from
MANIFEST = GROUP_DATA / "python_stack.yml"
LOCKS = "group_data/python_stack.locks"  # beside the manifest, relative to the repository
REFRESH = "uv run python -m tools.python_lock"
# 2: resolved wheels only (--only-binary :all:, --prerelease explicit), with from_source.
LOCK_FORMAT = 2
UV_REQUIREMENTS = "/opt/sparkrig/uv-requirements.txt"
UV_LINK = "/usr/local/bin/uv"
STAGE = "/var/lib/sparkrig/stage"  # root's: files on their way to a directory of another user
# As the owner: $1 a directory (made if missing), $2 a file to copy in as $3, atomically.
_PUT_AS_OWNER = 'mkdir -p "$1" && cp -- "$2" "$1/.$3.sparkrig-new" && chmod 644 "$1/.$3.sparkrig-new" && mv -f "$1/.$3.sparkrig-new" "$1/$3"'
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
NO_CHANGES = "Would make no changes"
LOCK_STAMP = "# sparkrig-input: "
# The packages a lock leaves to a source build (the manifest's from_source, where needed).
LOCK_FROM_SOURCE = "# sparkrig-from-source: "
OFFLINE_DIR = "/var/lib/sparkrig/python-wheels"  # the controller's wheels, on a host
PLAN_TIMEOUT_S = 300  # the longest the offline dry run of the lock may take (emulated aarch64 included)
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



# Checks --------------------------------------------------------------------


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
    for name, pins in profiles.items():
        problem = _pins_problem(pins, f"profiles.{name}")
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


SETTINGS = (
    Setting(
        "python_stack",
        load_manifest(),
        "The versions manifest: Python, torch's versions (from PyPI unless an index is named for "
        "it alone), vLLM's wheel per architecture with its sha256, extra packages, profiles, and "
        "which locks exist. It lives in group_data/python_stack.yml (documented there); bump the "
        "stack by editing it, then run `uv run python -m tools.python_lock`.",
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
        "architecture and set of profiles, made by `uv run python -m tools.python_lock`. A "
        "host whose lock is missing or stale for the manifest stops the deploy before any host is "
        "contacted.",
        locks_check,
    ),
    Setting("python_venv_path", "/opt/sparkrig/venv", "The virtualenv's directory. It is made anew"
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


# The wanted state --------------------------------------------------------------


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


def missing_builds(data: Mapping[str, Any], arch: str) -> dict[str, list[str]]:
    """Each package the host's lock needs from a source build that no enabled wheel build of
    the host makes: the catalogue's builds that would (``{"xformers": ["xformers"]}``). Empty
    when the lock is missing or stale (reported on its own)."""
    manifest, profiles = data["python_stack"], data["python_stack_profiles"]
    text = read_lock(locks_dir(data["python_stack_locks"]) / lock_name(manifest, profiles, arch))
    if text is None or lock_stamp(text) != lock_input(manifest, profiles, arch):
        return {}
    catalogue = data.get("source_builds") or {}
    makes: dict[str, list[str]] = {}
    for build, spec in catalogue.items():
        if isinstance(spec, Mapping) and spec.get("kind") == "wheel" and isinstance(spec.get("package"), str):
            makes.setdefault(normalise(spec["package"]), []).append(build)
    enabled = set(data.get("source_builds_enabled") or [])
    return {
        package: sorted(makes.get(package, []))
        for package in lock_from_source(text)
        if not enabled & set(makes.get(package, []))
    }


def missing_builds_message(data: Mapping[str, Any], arch: str) -> str | None:
    """:func:`missing_builds` in words, or None."""
    missing = missing_builds(data, arch)
    if not missing:
        return None
    name = lock_name(data["python_stack"], data["python_stack_profiles"], arch)
    said = "; ".join(
        f"{package} has no {arch} wheel: enable "
        + (" or ".join(builds) if builds else f"a build of {package} (none in source_builds)")
        for package, builds in sorted(missing.items())
    )
    return f"the lock {name} leaves {', '.join(sorted(missing))} to a source build ({said})"


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
    """What a host installs: the controller's lock, each built wheel (operations/source_builds.py,
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


def major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


# Facts ---------------------------------------------------------------------------


_STACK_SCRIPT = r"""
s="$v/sparkrig"
[ -x {uv} ] && echo "uv $({uv} --version 2>/dev/null | cut -d' ' -f2)"
[ -e {link} ] && echo "link_exists yes"
python3 -I -c 'import ensurepip' 2>/dev/null &&
  case "$(dpkg-query -W -f '${{db:Status-Abbrev}}' python3-venv 2>/dev/null)" in ""|ii*) echo "venv_module yes";; esac
[ -d {cache} ] && echo "cache_owner $(stat -c %U {cache})"
id -u "$o" >/dev/null 2>&1 && echo "owner_exists yes"
[ -d "$v" ] && [ -n "$(ls -A "$v")" ] && echo "occupied yes"
if [ -f "$v/pyvenv.cfg" ]; then
  echo "python $({read_cfg} | sed -n 's/^version_info *= *//p; s/^version *= *//p' | head -n 1)"
  echo "owner $(stat -c %U "$v")"
  # Usable: its interpreter link leads to an executable file. Read, never run: the owner
  # can put anything at bin/python, and this runs as root.
  t=$(readlink -e "$v/bin/python") && [ -f "$t" ] && [ -x "$t" ] && echo "usable yes"
fi
[ -f "$s/requirements.lock" ] && echo "lock $({read_lock} | sha256sum | cut -d' ' -f1)"
[ -n "$w" ] && [ -d "$w" ] && for f in "$w"/*.whl; do [ -f "$f" ] && echo "wheel ${{f##*/}}"; done
[ -d {offline} ] && echo "offline_dir yes"
if [ -x {uv} ] && [ -f "$s/requirements.lock" ] && [ ! -L "$s/requirements.lock" ] && [ -x "$v/bin/python" ] && id -u "$o" >/dev/null 2>&1; then
  echo "plan $(runuser -u "$o" -- timeout -k 5 {plan_timeout} env {env} {uv} pip sync --no-config --offline --dry-run --require-hashes --python "$v/bin/python" "$s/requirements.lock" 2>&1 | tail -n 1)"
fi
true
""".format(
    uv=UV, link=UV_LINK, cache=UV_CACHE, env=" ".join(UV_ENV), offline=OFFLINE_DIR,
    read_cfg=user_files.user_read('"$v/pyvenv.cfg"', 1 << 16), read_lock=user_files.user_read('"$s/requirements.lock"', LOCK_LIMIT),
    # The owner's venv could make the dry run wait for ever (a FIFO where uv reads).
    plan_timeout=PLAN_TIMEOUT_S,
)


class PythonStack(FactBase):
    """
    Returns the state of uv and of one virtualenv, read in one command: uv's version,
    whether ``/usr/local/bin/uv`` is taken, whether ``python3 -m venv`` can make a tool
    environment, the venv's Python, owner and usability, the sha256 of its lock, the
    last line of an offline ``uv pip sync --dry-run`` of the lock (run as the owner), and
    the wheel files in ``wheels`` (the controller's wheels, with ``python_offline``), and
    whether :data:`OFFLINE_DIR` is there at all (``offline_dir``).

    .. code:: python

        {"uv": "0.13.9", "link_exists": True,
         "venv_module": True, "cache_owner": "spark", "owner_exists": True, "occupied": True, "python": "3.12.3",
         "owner": "spark", "usable": True, "lock": "9a...", "plan": "Would make no changes", "wheels": [],
         "offline_dir": False}
    """

    def command(self, venv: str, owner: str, wheels: str = "") -> StringCommand:
        return host_output.encoded(StringCommand(
            "v=", QuoteString(venv), "; o=", QuoteString(owner), "; w=", QuoteString(wheels), ";",
            _STACK_SCRIPT, _separator=""
        ))

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        return self.parse(host_output.decoded(output))

    def parse(self, output: list[str]) -> dict:
        """The reading from the command's decoded lines."""
        found = self.default()
        for line in output:
            key, _, value = line.partition(" ")
            if key in ("link_exists", "venv_module", "usable", "occupied", "owner_exists", "offline_dir"):
                found[key] = value == "yes"
            elif key == "wheel":
                found["wheels"].append(value)
            elif key in found:
                found[key] = value or None
        return found

    @staticmethod
    def default() -> dict:
        return {
            "uv": None, "link_exists": False, "venv_module": False,
            "cache_owner": None, "owner_exists": False, "occupied": False, "python": None, "owner": None, "usable": False,
            "lock": None, "plan": None, "wheels": [], "offline_dir": False,
        }


# Operations ----------------------------------------------------------------------


def as_owner(owner: str, *argv: Any) -> list[Any]:
    """``argv`` run as ``owner`` with uv's environment (runuser: no password, no PAM session)."""
    return ["runuser", "-u", QuoteString(owner), "--", "env", *UV_ENV, *argv]


def render_uv_requirements(version: str, hashes: Sequence[str]) -> str:
    return rendering.render("python_stack/uv-requirements.txt.j2", version=version, hashes=hashes)


@operation()
def uv_tool(version: str, index_url: str, present: str | None = None, link: bool = True):
    """
    Install uv ``version`` into its own tool environment from a package index, checked
    against the hashes of :data:`UV_REQUIREMENTS`.

    + version: the uv release
    + index_url: the package index pip installs it from
    + present: the version the host has now (``None``: none); nothing happens when equal
    + link: make ``/usr/local/bin/uv`` a link to it (when that name is free or already ours)

    A new tool environment is built beside the old one and swapped in only once its
    uv runs, so a failed upgrade leaves the old uv working.

    **Example:**

    .. code:: python

        uv_tool(name="uv 0.13.9", version="0.13.9", index_url="https://pypi.org/simple")
    """
    if present != version:
        messages.detail(f"uv {version} (this host has {present or 'none'})")
        new = QuoteString(f"{UV_TOOL}.sparkrig-new")
        python = QuoteString(f"{UV_TOOL}.sparkrig-new/bin/python")
        yield StringCommand(
            "rm -rf", new,
            "&& python3 -I -m venv", new,
            # Debian's and Ubuntu's pip read the system store; say so for any other pip.
            f"&& {{ [ ! -f {CA_BUNDLE} ] || export PIP_CERT={CA_BUNDLE}; }}",
            "&&", python, "-I -m pip install --quiet --disable-pip-version-check --no-cache-dir",
            "--require-hashes --only-binary :all: --index-url", QuoteString(index_url),
            "-r", QuoteString(UV_REQUIREMENTS),
            "&&", QuoteString(f"{UV_TOOL}.sparkrig-new/bin/uv"), "--version",
            "&& rm -rf", QuoteString(UV_TOOL),
            "&& mv", new, QuoteString(UV_TOOL),
        )
    if link:
        yield StringCommand(
            "[ -e", QuoteString(UV_LINK), "] || ln -s", QuoteString(UV), QuoteString(UV_LINK)
        )


def virtualenv_arguments(data: Mapping[str, Any], built: Mapping[str, str]) -> dict[str, Any]:
    """The arguments of :func:`virtualenv` for a host's resolved settings ``data``, with
    the requirement lines of its built wheels (``built``, see :func:`host_lock`)."""
    manifest = data["python_stack"]
    arch = data["hardware_profiles"][data["hardware_profile"]]["arch"]
    profiles = data["python_stack_profiles"]
    text = read_lock(locks_dir(data["python_stack_locks"]) / lock_name(manifest, profiles, arch)) or ""
    arguments = {
        "path": data["python_venv_path"],
        "owner": data["python_venv_owner"],
        "python": manifest["python"],
        "lock": host_lock(text, built),
        "index_url": data["python_index_url"],
        "extra_index_urls": sorted(set(indexes(manifest).values())),
        "python_preference": data["python_venv_python_preference"],
        "wheels": {},
    }
    if data["python_offline"] and text:
        arguments["wheels"] = offline_wheels(
            text, arch, manifest["python"], Path(data["python_offline_cache"]).expanduser()
        )
        arguments["lock"] = offline_lock(arguments["lock"])
    return arguments


def offline_lock(text: str) -> str:
    """A lock for ``--offline --no-index``: each wheel locked by its URL (vLLM's) named by its
    copy in :data:`OFFLINE_DIR` instead, its hashes kept (uv fetches no URL offline, and
    --find-links serves only what is locked by name)."""
    def local(match: re.Match) -> str:
        return f" @ file://{OFFLINE_DIR}/{urllib.parse.unquote(match[1])}"  # as offline_wheels names it

    return re.sub(r" @ https?://[^\s]*/([^/\s]+\.whl)(?=\s)", local, text)


@operation()
def virtualenv(
    path: str,
    owner: str,
    python: str,
    lock: str,
    index_url: str = "https://pypi.org/simple",
    extra_index_urls: Sequence[str] = (),
    python_preference: str = "system",
    wheels: Mapping[str, str] | None = None,
):
    """
    Make the virtualenv at ``path`` hold exactly ``lock``, a lock made on the controller.

    + path: the venv's directory
    + owner: the user who owns the venv and runs uv
    + python: the venv's Python, major.minor; a venv of another Python is made anew
    + lock: the lock's text (``uv pip compile --generate-hashes`` output; every file's sha256)
    + index_url: where the locked files are downloaded from
    + extra_index_urls: the indexes the manifest names for some packages alone (torch, vLLM)
    + python_preference: uv's ``--python-preference`` when the venv is made
    + wheels: offline: every locked wheel, file name: path on the controller; uploaded to
      :data:`OFFLINE_DIR` when missing there, and installed with ``--offline --no-index``;
      without them, :data:`OFFLINE_DIR` is removed

    Reads the host with :class:`PythonStack`. The lock is uploaded when its sha256 differs;
    ``uv pip sync --require-hashes`` runs when it was, or when uv's dry run of it would
    change anything. Hosts never resolve. A failed step leaves the next run to redo it.

    **Example:**

    .. code:: python

        virtualenv(
            name="ML venv",
            path="/opt/sparkrig/venv",
            owner="spark",
            python="3.12",
            lock=open("group_data/python_stack.locks/aarch64-py3.12.txt").read(),
        )
    """
    wheels = wheels or {}
    found = host_output.direct_fact(PythonStack, venv=path, owner=owner, wheels=OFFLINE_DIR if wheels else "")
    if found is None:
        return
    messages.detail(f"virtualenv {path}: Python {python}, owner {owner}")
    state = posixpath.join(path, STATE_DIR)
    lock_path = posixpath.join(state, "requirements.lock")
    q_path, q_state = QuoteString(path), QuoteString(state)
    q_group = QuoteString(f"{owner}:")  # the owner and their login group
    venv_python = QuoteString(posixpath.join(path, "bin", "python"))
    changed = False

    if not lock:
        yield messages.refuse(f"no lock for this host on the controller: run `{REFRESH}`")
        return
    if not found["owner_exists"]:
        yield messages.refuse(f"python_venv_owner {owner} is no user on this host: create it first")
        return
    if found["cache_owner"] != owner:
        changed = True
        yield StringCommand("mkdir -p", QuoteString(UV_CACHE), "&& chown -hR", q_group, QuoteString(UV_CACHE))

    fresh = not found["usable"] or major_minor(found["python"]) != python
    if fresh and found["occupied"] and found["python"] is None:
        yield messages.refuse(
            f"{path} is a non-empty directory but no virtualenv (no pyvenv.cfg): sparkrig "
            "makes its venv only in an empty or new directory, or over an earlier venv"
        )
        return
    if fresh:
        changed = True
        yield StringCommand(
            # Root makes the directory, never through a link (-h: the links inside are the owner's).
            "{ [ ! -L", q_path, "] || {", messages.refuse(f"{path} is a symbolic link: sparkrig makes its venv only in a directory"), "; }; }",
            "&& mkdir -p", q_path, "&& chown -hR", q_group, q_path,
            "&&", *as_owner(
                owner, QuoteString(UV), "venv --no-config --clear --python", QuoteString(python),
                "--python-preference", QuoteString(python_preference), q_path,
            ),
        )
    elif found["owner"] != owner:
        changed = True
        yield StringCommand("chown -hR", q_group, q_path)

    missing = sorted(set(wheels) - set(found["wheels"]))
    extra = sorted(set(found["wheels"]) - set(wheels))
    if missing or extra:
        changed = True
        yield StringCommand("mkdir -p", QuoteString(OFFLINE_DIR), "&& chmod 755", QuoteString(OFFLINE_DIR))
        for name in missing:
            temp = f"{OFFLINE_DIR}/.{name}.sparkrig-new"
            yield atomic.Upload(wheels[name], temp)
            yield StringCommand("chmod 644", QuoteString(temp), "&& mv -f", QuoteString(temp),
                                QuoteString(f"{OFFLINE_DIR}/{name}"))
        if extra:
            yield StringCommand("rm -f", *[QuoteString(f"{OFFLINE_DIR}/{name}") for name in extra])
    elif not wheels and found["offline_dir"]:
        # python_offline was turned off: the controller's copies of the locked wheels (torch's
        # alone is over a GB) would stay for good. Root's directory, below root's /var/lib/sparkrig.
        changed = True
        yield StringCommand("rm -rf", QuoteString(OFFLINE_DIR))

    stale_lock = fresh or found["lock"] != digest(lock)
    if stale_lock:
        changed = True
        # Uploaded into a root-owned directory, then put in place by the owner: the venv is
        # theirs, and root never writes or chowns through a path they can change.
        staged = f"{STAGE}/requirements-{digest(path)[:16]}.lock"
        yield StringCommand(
            "install -d -m 755 -o root -g root", QuoteString(STAGE), "&& rm -f", QuoteString(staged)
        )
        yield atomic.Upload(BytesIO(lock.encode()), staged)
        yield StringCommand(
            "chmod 644", QuoteString(staged), "&& runuser -u", QuoteString(owner), "-- sh -c",
            QuoteString(_PUT_AS_OWNER), "put", q_state, QuoteString(staged), "requirements.lock",
            "; s=$?; rm -f", QuoteString(staged), "; exit $s",
        )

    if stale_lock or missing or found["plan"] != NO_CHANGES:
        changed = True
        if wheels:
            source = ["--offline --no-index --find-links", QuoteString(OFFLINE_DIR)]
        else:
            source = ["--index-url", QuoteString(index_url)]
            for url in extra_index_urls:
                source += ["--extra-index-url", QuoteString(url)]
            if extra_index_urls:
                # Resolved on the controller with each named index explicit; here every
                # file is pinned by sha256, so any index may only hand over those files.
                source.append("--index-strategy unsafe-best-match")
        yield StringCommand(
            *as_owner(
                owner, QuoteString(UV), "pip sync --no-config --quiet --require-hashes",
                *source, "--python", venv_python, QuoteString(lock_path),
            )
        )

    if not changed:
        host.noop(f"virtualenv {path} holds its lock")


# The deploy ------------------------------------------------------------------------


@operation()
def synced(data: Mapping[str, Any], built_wheels: Callable[[], Mapping[str, str]]):
    """
    Make the venv hold its lock and the built wheels there are when this operation runs
    (source builds of this deploy may have added one): :func:`virtualenv`, its arguments
    worked out at that moment.

    + data: the host's resolved settings
    + built_wheels: returns the requirement lines of the built wheels, by package

    **Example:**

    .. code:: python

        source_builds(sync_venv=python_stack.synced)
    """
    yield from virtualenv._inner(**virtualenv_arguments(data, built_wheels()))


def venv_stale(found: Mapping[str, Any], python: str, owner: str, lock: str, wheels: Sequence[str]) -> bool:
    """Whether :func:`virtualenv` has work, from one :class:`PythonStack` reading."""
    return (
        not found["usable"]
        or major_minor(found["python"]) != python
        or (found["owner"], found["cache_owner"]) != (owner, owner)
        or found["lock"] != digest(lock)
        or found["plan"] != NO_CHANGES
        or sorted(found["wheels"]) != sorted(wheels)
        or (found["offline_dir"] and not wheels)
    )


@reading.planner
def reads(settings):
    # As python_stack() asks (offline wheels exist when python_offline is on).
    return [reading.part(
        PythonStack, venv=settings["python_venv_path"], owner=settings["python_venv_owner"],
        wheels=OFFLINE_DIR if settings["python_offline"] else "",
    )]


@deploy("Python stack", data_defaults=ALL_DEFAULTS)
def python_stack(built_wheels: Callable[[], Mapping[str, str]] | None = None):
    """
    Install uv and make the virtualenv hold the controller's lock of the manifest.

    + built_wheels: what else the venv holds, by package: requirement lines of wheels built
      on the host (``source_builds.host_requirement_lines``; deploy.py passes it). Without
      it the venv holds the lock alone, and a built wheel would be synced away.

    Settings: ``python_*``; see docs/settings.md and group_data/python_stack.yml.
    """
    data = host.data
    manifest = data.python_stack
    arch = host_profile()["arch"]
    # Checked before any connection for a named profile; for "auto", now that the box said.
    problem = manifest_problem(manifest, arch) or lock_problem(
        manifest, arch, data.python_stack_profiles, data.python_stack_locks
    ) or missing_builds_message(resolved(data.dict()), arch)
    if problem:
        refused(name="The versions manifest and its lock fit this box", message=f"python_stack: {problem}")
        return
    try:
        arguments = virtualenv_arguments(
            resolved(data.dict()), built_wheels() if built_wheels else {}
        )
    except (OSError, RuntimeError, ValueError) as error:  # python_offline's downloads
        refused(name="The controller has the locked wheels", message=f"python_offline: {error}")
        return
    owner = data.python_venv_owner
    found = reading.fact(
        PythonStack, venv=data.python_venv_path, owner=owner,
        wheels=OFFLINE_DIR if arguments["wheels"] else "",
    )
    if found is None:
        return

    # The pins file is read only when uv is (re)installed: the uv version tells the rest.
    if found["uv"] != data.python_uv_version:
        if not found["venv_module"]:
            install_packages(name="Install python3-venv (uv's tool environment)", packages=["python3-venv"])
        atomic.file(
            name=f"uv pin (python_uv_version) and its sha256 ({UV_REQUIREMENTS})",
            dest=UV_REQUIREMENTS,
            content=render_uv_requirements(data.python_uv_version, data.python_uv_sha256),
            mode=0o644,
        )
    link_free = not found["link_exists"]
    if found["uv"] != data.python_uv_version or link_free:
        uv_tool(
            name=f"uv in {UV_TOOL}",
            version=data.python_uv_version,
            index_url=data.python_index_url,
            present=found["uv"],
            link=link_free,
        )

    if venv_stale(found, manifest["python"], owner, arguments["lock"], list(arguments["wheels"])):
        virtualenv(
            name="Virtualenv python_venv_path, with the manifest's Python, owned by python_venv_owner",
            **arguments,
        )
