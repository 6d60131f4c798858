"""
Python ML stack: uv, and a virtualenv holding cu130 PyTorch, a pinned vLLM and extras.

The stack is data: ``python_stack`` (loaded from ``group_data/python_stack.yml``)
names the Python version, the torch index and versions, vLLM's wheel per CPU
architecture with its sha256, extra packages and optional profiles. On the host:

- uv, pinned by version and sha256, is installed from a package index into its own
  tool environment ``/opt/sparkrig/uv`` (``/usr/local/bin/uv`` links to it unless
  that name is taken); no ``curl | sh``.
- The manifest is rendered into ``<venv>/sparkrig/requirements.in``; uv resolves it
  on the host into ``requirements.lock`` (every file's sha256 included) and
  ``uv pip sync`` makes the venv hold exactly that.
- Whether anything changes is uv's own verdict: an offline
  ``uv pip sync --dry-run`` of the lock must say "Would make no changes". A
  converged host costs one remote command (:class:`PythonStack`).

uv runs as the venv's owner, with ``--no-config`` (no user or system uv.toml
changes what is installed) and ``UV_SYSTEM_CERTS=1`` (the system CA store, which
holds ``ca_certificates_extra``).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

import yaml
from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, QuoteString, StringCommand, deploy, operation

from . import atomic, hardware
from .atomic import refused
from .packages import installed as install_packages
from .settings import USER_NAME, Setting, absolute_path, defaults, one_of

MANIFEST = Path(__file__).resolve().parent.parent / "group_data" / "python_stack.yml"
UV_TOOL = "/opt/sparkrig/uv"
UV = f"{UV_TOOL}/bin/uv"
UV_REQUIREMENTS = "/opt/sparkrig/uv-requirements.txt"
UV_LINK = "/usr/local/bin/uv"
UV_CACHE = "/var/cache/sparkrig/uv"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
STATE_DIR = "sparkrig"  # inside the venv: requirements.in and requirements.lock
NO_CHANGES = "Would make no changes"
LOCK_STAMP = "# sparkrig-input: "
# flash-attn has no sm_121 kernels and builds for CUDA 12 only: never installed.
REFUSED = {"flash-attn": "no sm_121 kernels and CUDA 12 only; PyTorch SDPA replaces it"}
UV_ENV = ("UV_SYSTEM_CERTS=1", "UV_NATIVE_TLS=1", f"UV_CACHE_DIR={UV_CACHE}", "UV_NO_PROGRESS=1")

_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+!-]*)$")
_PYTHON = re.compile(r"^3\.[0-9]+$")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_URL = re.compile(r"^https?://[^\s'\"\\`$;#?]+$")
_UV_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def load_manifest(path: Path | str = MANIFEST) -> dict:
    """The versions manifest at ``path`` (YAML)."""
    return yaml.safe_load(Path(path).read_text())


def normalise(name: str) -> str:
    """A package name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def package_name(name: str) -> bool:
    """Whether ``name`` is a package name sparkrig accepts."""
    return bool(_NAME.match(name))


# Checks --------------------------------------------------------------------


def _pins_problem(pins: Any, where: str) -> str | None:
    if not isinstance(pins, Mapping):
        return f"{where} must map package names to exact versions"
    for name, version in pins.items():
        if not (isinstance(name, str) and _NAME.match(name)):
            return f"{where}: {name!r} is not a package name"
        if normalise(name) in REFUSED:
            return f"{where}: {name} is never installed ({REFUSED[normalise(name)]})"
        if not (isinstance(version, str) and _VERSION.match(version)):
            return f"{where}: {name} needs an exact version as a quoted string, not {version!r}"
    return None


def manifest_problem(manifest: Any, arch: str | None) -> str | None:
    """Why ``manifest`` cannot be installed on an ``arch`` host, or None (``arch`` None:
    the host's profile is itself invalid, reported on its own; wheels are not matched)."""
    if not isinstance(manifest, Mapping):
        return "the manifest must be a mapping (group_data/python_stack.yml)"
    unknown = set(manifest) - {"python", "torch", "vllm", "packages", "profiles"}
    if unknown:
        return f"unknown manifest keys: {', '.join(sorted(map(str, unknown)))}"
    if not (isinstance(manifest.get("python"), str) and _PYTHON.match(manifest["python"])):
        return "python must be a quoted major.minor version such as '3.12'"
    torch = manifest.get("torch")
    if torch is not None:
        if not isinstance(torch, Mapping) or set(torch) != {"index_url", "packages"}:
            return "torch must hold index_url and packages (or be null)"
        if not (isinstance(torch["index_url"], str) and _URL.match(torch["index_url"])):
            return "torch.index_url must be an http(s) URL; never uv's 'auto' backend"
        problem = _pins_problem(torch["packages"], "torch.packages")
        if problem:
            return problem
    vllm = manifest.get("vllm")
    if vllm is not None:
        if not isinstance(vllm, Mapping) or not {"name", "version"} <= set(vllm) <= {
            "name", "version", "wheels"
        }:
            return "vllm must hold name, version and optionally wheels (or be null)"
        problem = _pins_problem({vllm["name"]: vllm["version"]}, "vllm")
        if problem:
            return problem
        wheels = vllm.get("wheels")
        if wheels is not None and not isinstance(wheels, Mapping):
            return "vllm.wheels must map CPU architectures to {url, sha256}"
        if wheels is not None and arch is not None:
            wheel = wheels.get(arch)
            if not isinstance(wheel, Mapping) or set(wheel) != {"url", "sha256"}:
                return f"vllm.wheels has no {{url, sha256}} entry for this host's architecture {arch}"
            if not (isinstance(wheel["url"], str) and _URL.match(wheel["url"])):
                return f"vllm.wheels.{arch}.url must be an http(s) URL without query or fragment"
            if not (isinstance(wheel["sha256"], str) and _SHA256.match(wheel["sha256"])):
                return f"vllm.wheels.{arch}.sha256 must be 64 lower-case hex digits"
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
    return None


def _arch(data: Mapping[str, Any]) -> str | None:
    """The host's CPU architecture from its profile; None when the profile is invalid."""
    if hardware.profiles_check(data.get("hardware_profiles"), data):
        return None
    profile = data["hardware_profiles"].get(data.get("hardware_profile"))
    return profile["arch"] if isinstance(profile, Mapping) else None


def manifest_check(value: Any, data: Mapping[str, Any]) -> str | None:
    problem = manifest_problem(value, _arch(data))
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
    ok = isinstance(value, str) and USER_NAME.match(value)
    return None if ok else "a user name ([a-z_][a-z0-9_-]*, at most 32 characters) that exists on the host"


def index_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and _URL.match(value)
    return None if ok else "an http(s) URL of a package index (PEP 503), e.g. https://pypi.org/simple"


def uv_version_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and _UV_VERSION.match(value)
    return None if ok else "a uv release as X.Y.Z, e.g. '0.13.9'"


def hashes_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(h, str) and _SHA256.match(h) for h in value)
    return None if ok else "a non-empty list of sha256 digests (64 lower-case hex digits)"


SETTINGS = (
    Setting(
        "python_stack",
        load_manifest(),
        "The versions manifest: Python, torch index and versions, vLLM wheels, extras, profiles.",
        manifest_check,
    ),
    Setting(
        "python_stack_profiles",
        [],
        "Which profiles of the manifest the host also installs, e.g. ['unsloth'].",
        profiles_check,
    ),
    Setting("python_venv_path", "/opt/sparkrig/venv", "Where the virtualenv lives.", absolute_path),
    Setting("python_venv_owner", "root", "The user who owns the venv; uv runs as this user.", user_check),
    Setting(
        "python_venv_python_preference",
        "system",
        "uv's --python-preference: a system interpreter first, a uv-managed one only if none fits.",
        one_of("only-system", "system", "managed", "only-managed"),
    ),
    Setting(
        "python_index_url",
        "https://pypi.org/simple",
        "The package index for uv itself and every package not pinned to another index.",
        index_check,
    ),
    Setting("python_uv_version", "0.13.9", "The uv release installed on the hosts.", uv_version_check),
    Setting(
        "python_uv_sha256",
        [
            # uv 0.13.9 wheels from PyPI: manylinux aarch64 (two builds) and x86_64.
            "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
            "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",
            "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
        ],
        "sha256 of the uv wheels pip may pick for python_uv_version; change both together.",
        hashes_check,
    ),
)


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


def render_requirements(
    manifest: Mapping[str, Any],
    profiles: Sequence[str],
    arch: str,
    index_url: str,
    built: Mapping[str, str] | None = None,
) -> str:
    """The requirements.in of a host: index options, then one exact pin per package.

    ``built`` maps normalised package names to the requirement lines of wheels built
    from source (operations/source_builds.py); each replaces the manifest's pin of the
    same package, if any."""
    built = built or {}
    wanted = {**pins(manifest, profiles), **{name: None for name in built}}
    vllm = manifest.get("vllm")
    wheel = (vllm.get("wheels") or {}).get(arch) if vllm else None
    lines = []
    for name, version in sorted(wanted.items()):
        if name in built:
            lines.append(built[name])
        elif vllm and wheel and name == normalise(vllm["name"]):
            lines.append(f"{name} @ {wheel['url']} --hash=sha256:{wheel['sha256']}")
        else:
            lines.append(f"{name}=={version}")
    torch = manifest.get("torch")
    return atomic.render(
        "python_stack/requirements.in.j2",
        index_url=index_url,
        torch_index_url=torch["index_url"] if torch else None,
        lines=lines,
    )


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


# Facts ---------------------------------------------------------------------------


_STACK_SCRIPT = r"""
s="$v/sparkrig"
[ -x {uv} ] && echo "uv $({uv} --version 2>/dev/null | cut -d' ' -f2)"
[ -e {link} ] && echo "link_exists yes"
python3 -c 'import ensurepip' 2>/dev/null && echo "venv_module yes"
[ -d {cache} ] && echo "cache_owner $(stat -c %U {cache})"
id -u "$o" >/dev/null 2>&1 && echo "owner_exists yes"
[ -d "$v" ] && [ -n "$(ls -A "$v")" ] && echo "occupied yes"
if [ -f "$v/pyvenv.cfg" ]; then
  echo "python $(sed -n 's/^version_info *= *//p; s/^version *= *//p' "$v/pyvenv.cfg" | head -n 1)"
  echo "owner $(stat -c %U "$v")"
  "$v/bin/python" -c '' 2>/dev/null && echo "usable yes"
fi
[ -f "$s/requirements.in" ] && echo "input $(sha256sum < "$s/requirements.in" | cut -d' ' -f1)"
[ -f "$s/requirements.lock" ] && echo "locked $(sed -n '1s/^{stamp}//p' "$s/requirements.lock")"
if [ -x {uv} ] && [ -f "$s/requirements.lock" ] && [ -x "$v/bin/python" ] && id -u "$o" >/dev/null 2>&1; then
  echo "plan $(runuser -u "$o" -- env {env} {uv} pip sync --no-config --offline --dry-run --require-hashes --python "$v/bin/python" "$s/requirements.lock" 2>&1 | tail -n 1)"
fi
true
""".format(
    uv=UV, link=UV_LINK, cache=UV_CACHE, stamp=LOCK_STAMP, env=" ".join(UV_ENV)
)


class PythonStack(FactBase):
    """
    Returns the state of uv and of one virtualenv, read in one command: uv's version,
    whether ``/usr/local/bin/uv`` is taken, whether ``python3 -m venv`` can make a tool
    environment, the venv's Python, owner and usability, the sha256 of its
    requirements.in, the input its lock was made from, and the last line of an
    offline ``uv pip sync --dry-run`` of the lock (run as the owner).

    .. code:: python

        {"uv": "0.13.9", "link_exists": True,
         "venv_module": True, "cache_owner": "spark", "owner_exists": True, "occupied": True, "python": "3.12.3",
         "owner": "spark", "usable": True, "input": "9a...", "locked": "9a...",
         "plan": "Would make no changes"}
    """

    def command(self, venv: str, owner: str) -> StringCommand:
        return StringCommand(
            "v=", QuoteString(venv), "; o=", QuoteString(owner), ";", _STACK_SCRIPT, _separator=""
        )

    def process(self, output: list[str]) -> dict:
        found = self.default()
        for line in output:
            key, _, value = line.partition(" ")
            if key in ("link_exists", "venv_module", "usable", "occupied", "owner_exists"):
                found[key] = value == "yes"
            elif key in found:
                found[key] = value or None
        return found

    @staticmethod
    def default() -> dict:
        return {
            "uv": None, "link_exists": False, "venv_module": False,
            "cache_owner": None, "owner_exists": False, "occupied": False, "python": None, "owner": None, "usable": False,
            "input": None, "locked": None, "plan": None,
        }


# Operations ----------------------------------------------------------------------


def as_owner(owner: str, *argv: Any) -> list[Any]:
    """``argv`` run as ``owner`` with uv's environment (runuser: no password, no PAM session)."""
    return ["runuser", "-u", QuoteString(owner), "--", "env", *UV_ENV, *argv]


def render_uv_requirements(version: str, hashes: Sequence[str]) -> str:
    return atomic.render("python_stack/uv-requirements.txt.j2", version=version, hashes=hashes)


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
        atomic.detail(f"uv {version} (this host has {present or 'none'})")
        new = QuoteString(f"{UV_TOOL}.sparkrig-new")
        pip = QuoteString(f"{UV_TOOL}.sparkrig-new/bin/pip")
        yield StringCommand(
            "rm -rf", new,
            "&& python3 -m venv", new,
            # Debian's and Ubuntu's pip read the system store; say so for any other pip.
            f"&& {{ [ ! -f {CA_BUNDLE} ] || export PIP_CERT={CA_BUNDLE}; }}",
            "&&", pip, "install --quiet --disable-pip-version-check --no-cache-dir",
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
    the requirement lines of its built wheels (``built``, see :func:`render_requirements`)."""
    manifest = data["python_stack"]
    arch = data["hardware_profiles"][data["hardware_profile"]]["arch"]
    return {
        "path": data["python_venv_path"],
        "owner": data["python_venv_owner"],
        "python": manifest["python"],
        "requirements": render_requirements(
            manifest, data["python_stack_profiles"], arch, data["python_index_url"], built
        ),
        "python_preference": data["python_venv_python_preference"],
    }


@operation()
def virtualenv(
    path: str,
    owner: str,
    python: str,
    requirements: str,
    python_preference: str = "system",
):
    """
    Make the virtualenv at ``path`` hold exactly ``requirements``, resolved by uv.

    + path: the venv's directory
    + owner: the user who owns the venv and runs uv
    + python: the venv's Python, major.minor; a venv of another Python is made anew
    + requirements: the requirements.in text (pins and index options)
    + python_preference: uv's ``--python-preference`` when the venv is made

    Reads the host with :class:`PythonStack`. requirements.in is replaced when its
    content differs; the lock is made again (``uv pip compile --generate-hashes``) when
    it was made from other input; ``uv pip sync`` runs when the lock is new or uv's
    dry run of it would change anything. A failed step leaves the next run to redo it.

    **Example:**

    .. code:: python

        virtualenv(
            name="ML venv",
            path="/opt/sparkrig/venv",
            owner="spark",
            python="3.12",
            requirements="torch==2.11.0\\n",
        )
    """
    found = host.get_fact(PythonStack, venv=path, owner=owner)
    atomic.detail(f"virtualenv {path}: Python {python}, owner {owner}")
    state = posixpath.join(path, STATE_DIR)
    lock = posixpath.join(state, "requirements.lock")
    wanted = digest(requirements)
    q_path, q_state = QuoteString(path), QuoteString(state)
    q_group = QuoteString(f"{owner}:")  # the owner and their login group
    venv_python = QuoteString(posixpath.join(path, "bin", "python"))
    changed = False

    if not found["owner_exists"]:
        yield atomic.refuse(f"python_venv_owner {owner} is no user on this host: create it first")
        return
    if found["cache_owner"] != owner:
        changed = True
        yield StringCommand("mkdir -p", QuoteString(UV_CACHE), "&& chown -R", q_group, QuoteString(UV_CACHE))

    fresh = not found["usable"] or major_minor(found["python"]) != python
    if fresh and found["occupied"] and found["python"] is None:
        yield atomic.refuse(
            f"{path} is a non-empty directory but no virtualenv (no pyvenv.cfg): sparkrig "
            "makes its venv only in an empty or new directory, or over an earlier venv"
        )
        return
    if fresh:
        changed = True
        yield StringCommand(
            "mkdir -p", q_path, "&& chown -R", q_group, q_path,
            "&&", *as_owner(
                owner, QuoteString(UV), "venv --no-config --clear --python", QuoteString(python),
                "--python-preference", QuoteString(python_preference), q_path,
            ),
        )
    elif found["owner"] != owner:
        changed = True
        yield StringCommand("chown -R", q_group, q_path)

    stale_input = fresh or found["input"] != wanted
    if stale_input:
        changed = True
        temp = atomic.temp_path(posixpath.join(state, "requirements.in"))
        yield StringCommand("mkdir -p", q_state, "&& chown", q_group, q_state)
        yield FileUploadCommand(BytesIO(requirements.encode()), temp)
        yield StringCommand(
            "chown", q_group, QuoteString(temp), "&& chmod 644", QuoteString(temp),
            "&& mv -f", QuoteString(temp), QuoteString(posixpath.join(state, "requirements.in")),
        )

    stale_lock = stale_input or found["locked"] != wanted
    if stale_lock:
        changed = True
        new = QuoteString(f"{lock}.sparkrig-new")
        body = QuoteString(f"{lock}.sparkrig-body")
        yield StringCommand(
            *as_owner(
                owner, QuoteString(UV), "pip compile --no-config --quiet --generate-hashes",
                "--emit-index-url --no-header --python", venv_python,
                QuoteString(posixpath.join(state, "requirements.in")), "-o", body,
            ),
            f"&& {{ echo '{LOCK_STAMP}{wanted}'; cat", body, "; } >", new,
            "&& chown", q_group, new, "&& chmod 644", new,
            "&& mv -f", new, QuoteString(lock), "&& rm -f", body,
        )

    if stale_lock or found["plan"] != NO_CHANGES:
        changed = True
        yield StringCommand(
            *as_owner(
                owner, QuoteString(UV), "pip sync --no-config --quiet --require-hashes --python",
                venv_python, QuoteString(lock),
            )
        )

    if not changed:
        host.noop(f"virtualenv {path} holds its requirements")


# The deploy ------------------------------------------------------------------------


def venv_stale(found: Mapping[str, Any], python: str, owner: str, wanted: str) -> bool:
    """Whether :func:`virtualenv` has work, from one :class:`PythonStack` reading."""
    return (
        not found["usable"]
        or major_minor(found["python"]) != python
        or (found["owner"], found["cache_owner"]) != (owner, owner)
        or (found["input"], found["locked"]) != (wanted, wanted)
        or found["plan"] != NO_CHANGES
    )


@deploy("Python stack", data_defaults=defaults(SETTINGS + hardware.SETTINGS))
def python_stack():
    """
    Install uv and make the virtualenv hold the manifest's stack.

    Settings: ``python_*``; see group_data/all.py and group_data/python_stack.yml.
    """
    from . import source_builds  # it builds on this module

    data = host.data
    manifest = data.python_stack
    arch = hardware.host_profile()["arch"]
    # Checked before any connection for a named profile; for "auto", now that the box said.
    problem = manifest_problem(manifest, arch)
    if problem:
        refused(name="The versions manifest fits this box", message=f"python_stack: {problem}")
        return
    requirements = render_requirements(
        manifest, data.python_stack_profiles, arch, data.python_index_url,
        source_builds.host_requirement_lines(),
    )
    owner = data.python_venv_owner
    found = host.get_fact(PythonStack, venv=data.python_venv_path, owner=owner)

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

    if venv_stale(found, manifest["python"], owner, digest(requirements)):
        virtualenv(
            name="Virtualenv python_venv_path, with the manifest's Python, owned by python_venv_owner",
            path=data.python_venv_path,
            owner=owner,
            python=manifest["python"],
            requirements=requirements,
            python_preference=data.python_venv_python_preference,
        )
