"""
Containers: the Docker engine and the NVIDIA container toolkit, wired together
without clobbering what the host already has.

- Docker comes from the source the settings name: ``auto`` (the default: what is
  installed is kept, as on DGX OS; where Docker is absent it is installed from a
  source the host already has, else from Docker's apt repository), ``docker-ce``
  (Docker's apt repository), ``distro`` (the distribution's ``docker.io``) or
  ``preinstalled`` (verified, never installed). The toolkit likewise: ``auto``,
  ``nvidia`` (NVIDIA's apt repository) or ``preinstalled``. A vendor repository
  is never added a second time: under ``auto``, a file the host already has for
  the same origin (any URL below the setting's, any file name) is used as it is.
- Each repository is a deb822 ``.sources`` file with its own ``Signed-By``
  keyring. The key is fetched on the host, its primary fingerprint compared with
  the setting, and only that key is written to the keyring. Repository and key
  URLs are settings, with ``{os}``, ``{codename}`` and ``{arch}`` filled in from
  the host (``/etc/os-release``, ``dpkg --print-architecture``), so a fleet can
  point at its own mirror.
- ``/etc/docker/daemon.json`` is merged, never overwritten: the ``nvidia``
  runtime is registered (an existing registration, such as ``nvidia-ctk``'s, is
  kept), optionally made the default, and every other key stays as the user set
  it. The result is checked with ``dockerd --validate`` (or parsed as JSON where
  dockerd is older than 23.0) before it replaces the old file, whose copy is kept
  as ``daemon.json.sparkrig-old``; Docker restarts only when it changed.
- CDI: where the toolkit ships ``nvidia-cdi-refresh.path`` (1.18+), it is enabled
  and keeps ``/var/run/cdi/nvidia.yaml`` current; otherwise, on a host with a GPU
  and ``nvidia-ctk``, ``/etc/cdi/nvidia.yaml`` is generated once.
- Users named in ``containers_docker_users`` join the ``docker`` group. That group
  is root-equivalent: its members can start a privileged container.

The concern reads the host once, with two facts (:class:`ContainerHost`,
:class:`SparkrigAptRepositories`: one remote command each), and adds an operation
only where they show work to do; that operation reads its own state again when it
runs. A converged host costs those two commands.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.facts.files import File
from pyinfra.operations import systemd

from sparkrig import atomic, reading
from sparkrig.atomic import refuse, refused
from sparkrig.packages import installed as install_packages
from sparkrig.settings import ALL_DEFAULTS

from .settings import (  # noqa: F401 (re-exported)
    _FINGERPRINT,
    _PACKAGE,
    _URL,
    DOCKER_SOURCES,
    SETTINGS,
    TOOLKIT_SOURCES,
    URL_FIELDS,
    fingerprint_check,
    image_check,
    packages_check,
    url_check,
    users_check,
)

# What "auto" resolves to, besides the vendor repository or "preinstalled": the
# packages are absent, and installed from a source the host already has.
HOST_SOURCE = "host"


@dataclass(frozen=True)
class Source:
    """One source setting: its vendor's value, the program that shows it is installed
    (and its key in :class:`ContainerHost`), and sparkrig's name for the vendor's repository."""

    key: str
    vendor: str
    program: str
    found: str
    repository: str


SOURCES = (
    Source("containers_docker_source", "docker-ce", "dockerd", "dockerd", "docker"),
    Source("containers_toolkit_source", "nvidia", "nvidia-container-runtime", "nvidia_runtime",
           "nvidia-container-toolkit"),
)
DISTRO_PACKAGES = ("docker.io",)
# Debian 13 ships the docker client apart from the engine, as a recommendation of docker.io.
DISTRO_CLI = "docker-cli"
SERVICE = "docker.service"
GROUP = "docker"
DAEMON_JSON = "/etc/docker/daemon.json"
DAEMON_JSON_BACKUP = "/etc/docker/daemon.json.sparkrig-old"
NVIDIA_RUNTIME = {"path": "nvidia-container-runtime", "args": []}
CDI_REFRESH = "nvidia-cdi-refresh.path"
CDI_STATIC_SPEC = "/etc/cdi/nvidia.yaml"
KEYRING_DIR = "/etc/apt/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"
# What fetches a repository key and reads its fingerprint on the host.
KEY_TOOLS = ("ca-certificates", "curl", "gnupg")
# Reads `gpg --with-colons --show-keys` and prints the primary keys' fingerprints (the
# "fpr" record right after a "pub" one), not the subkeys'.
PRIMARY_FINGERPRINTS = """awk -F: '$1=="pub"{p=1;next} $1=="fpr"&&p{print $10} {p=0}'"""


# Settings ------------------------------------------------------------------















# Repositories --------------------------------------------------------------


@dataclass(frozen=True)
class AptRepository:
    """One vendor apt repository: where it is, what signs it, and its files on the host.

    ``origin`` is the URL setting up to its first placeholder, without the scheme
    (``download.docker.com/linux``): any source below it is the same vendor's."""

    name: str
    url: str
    suite: str
    components: tuple[str, ...]
    key_url: str
    fingerprint: str
    origin: str = ""

    @property
    def keyring(self) -> str:
        return f"{KEYRING_DIR}/sparkrig-{self.name}.gpg"

    @property
    def sources_file(self) -> str:
        return f"{SOURCES_DIR}/sparkrig-{self.name}.sources"


REPOSITORY_NAMES = tuple(src.repository for src in SOURCES)


def url_origin(template: str) -> str:
    """A repository URL setting up to its first placeholder, without scheme or final '/'."""
    return template.split("://", 1)[-1].split("{", 1)[0].rstrip("/")


def repositories(data: Mapping[str, Any], release: Mapping[str, str]) -> list[AptRepository]:
    """The repositories a host's (resolved) sources ask for, URLs filled in from
    ``release`` (``{"os": "ubuntu", "codename": "noble", "arch": "arm64"}``)."""
    found = []
    if data["containers_docker_source"] == "docker-ce":
        found.append(AptRepository(
            "docker",
            data["containers_docker_repo_url"].format(**release),
            release["codename"],
            ("stable",),
            data["containers_docker_key_url"].format(**release),
            data["containers_docker_key_fingerprint"],
            url_origin(data["containers_docker_repo_url"]),
        ))
    if data["containers_toolkit_source"] == "nvidia":
        found.append(AptRepository(
            "nvidia-container-toolkit",
            data["containers_toolkit_repo_url"].format(**release),
            "/",  # a flat repository: no dists/, no components
            (),
            data["containers_toolkit_key_url"].format(**release),
            data["containers_toolkit_key_fingerprint"],
            url_origin(data["containers_toolkit_repo_url"]),
        ))
    return found


def resolve_sources(data: Mapping[str, Any], found: Mapping[str, Any]) -> dict[str, str]:
    """The Docker and toolkit sources to act on: the settings, with ``auto`` decided
    from the host (:class:`ContainerHost`). ``auto`` keeps what sparkrig configured
    itself (its own sources file), else keeps what is installed (``preinstalled``),
    else installs from a source the host already has (:data:`HOST_SOURCE`) when apt
    knows the package, else takes the vendor repository."""
    resolved = {}
    for src in SOURCES:
        source = data[src.key]
        if source == "auto":
            if src.repository in found["own_sources"]:
                source = src.vendor
            elif found[src.found]:
                source = "preinstalled"
            elif vendor_package(data, src.key) in found["available"]:
                source = HOST_SOURCE
            else:
                source = src.vendor
        resolved[src.key] = source
    return resolved


def vendor_package(data: Mapping[str, Any], key: str) -> str:
    """The first package the vendor repository of a source setting installs."""
    if key == "containers_docker_source":
        return data["containers_docker_ce_packages"][0]
    return data["containers_toolkit_packages"][0]
def in_slots(repos: Sequence[AptRepository]) -> Iterator[AptRepository]:
    """``repos``, each at its own place in every host's sequence of operations: pyinfra
    groups operations across hosts by that place, and a host with one repository would
    otherwise list its key in the row of the other host's first one."""
    named = {repo.name: repo for repo in repos}
    for name in host.loop(REPOSITORY_NAMES):
        if name in named:
            yield named[name]


def render_sources(repo: AptRepository, arch: str) -> str:
    return atomic.render(
        "containers/repository.sources.j2",
        name=repo.name,
        url=repo.url,
        suite=repo.suite,
        components=" ".join(repo.components),
        arch=arch,
        keyring=repo.keyring,
        fingerprint=repo.fingerprint,
    )


def source_uris(line: str) -> list[str]:
    """The URIs of one apt source line: one-line (``deb [opts] URI suite ...``) or
    deb822 (``URIs: A B``)."""
    line = line.strip()
    if line.startswith("URIs:"):
        return line[len("URIs:"):].split()
    words = re.sub(r"\[[^\]]*\]", " ", line).split()
    return words[1:2] if words and words[0] in ("deb", "deb-src") else []


def same_origin(uri: str, repo: AptRepository) -> bool:
    """Whether a source URI is ``repo``'s or another of the same vendor's (any scheme,
    any path below the origin)."""
    plain = uri.split("://", 1)[-1].rstrip("/")
    origin = repo.origin or repo.url.split("://", 1)[-1].rstrip("/")
    return plain == origin or plain.startswith(origin + "/")


def foreign_sources(entries: Sequence[tuple[str, str]], repo: AptRepository) -> list[str]:
    """The files other than sparkrig's own that already configure ``repo``'s origin:
    apt refuses two entries of one repository with different Signed-By keyrings, and
    a second copy of a vendor's repository is never wanted."""
    return sorted({
        path for path, line in entries
        if path != repo.sources_file and any(same_origin(uri, repo) for uri in source_uris(line))
    })


# Facts ---------------------------------------------------------------------


def _lines(output: list[str]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in output:
        key, _, value = line.partition("=")
        values.setdefault(key, []).append(value.strip())
    return values


def _group_members(entry: str) -> list[str] | None:
    """The members of a ``getent group`` entry, ``None`` for no entry."""
    fields = entry.split(":")
    return [m for m in fields[3].split(",") if m] if len(fields) == 4 else None


def _decode(values: dict[str, list[str]], key: str) -> str | None:
    return base64.b64decode(values[key][0]).decode() if key in values else None


class ContainerHost(FactBase):
    """
    Returns, in one command, what the containers concern decides from: the host's
    release, which of the given packages are installed, Docker's daemon.json and
    service, the docker group, the NVIDIA pieces present, and which of sparkrig's
    repository files exist.

    ``daemon_json`` is the file's text (``None``: no file); ``group_members`` is
    ``None`` when there is no docker group; ``users`` lists the given users that exist;
    ``available`` the given packages that apt can install (they have a candidate), of ``available`` and of the
    ``candidates`` (pairs of a program and a package) whose program is missing;
    ``own_sources`` names the repositories with a sparkrig sources file.

    .. code:: python

        {"os": "ubuntu", "codename": "noble", "arch": "arm64",
         "installed": ["docker-ce", "nvidia-container-toolkit"], "available": [],
         "own_sources": [],
         "daemon_json": '{"log-driver": "json-file"}\\n',
         "docker_active": True, "docker_enabled": True,
         "group_members": ["alice"], "users": ["alice", "bob"],
         "dockerd": "/usr/bin/dockerd", "nvidia_runtime": "/usr/bin/nvidia-container-runtime",
         "nvidia_ctk": "/usr/bin/nvidia-ctk", "gpu": True,
         "cdi_refresh": "enabled active", "cdi_static_spec": False}
    """

    def command(
        self,
        packages: Sequence[str] = (),
        users: Sequence[str] = (),
        available: Sequence[str] = (),
        candidates: Sequence[tuple[str, str]] = (),
    ) -> StringCommand:
        parts = [
            ". /etc/os-release; echo os=$ID; echo codename=$VERSION_CODENAME;",
            "echo arch=$(dpkg --print-architecture);",
        ]
        if packages:
            parts += [
                "dpkg-query -W -f 'pkg=${Package} ${db:Status-Abbrev}\\n'",
                *map(QuoteString, packages), "2>/dev/null;",
            ]
        if available or candidates:
            # One apt-cache for every package asked: each start loads apt's cache (apt-cache
            # show of an unknown package took 120 ms on a lab host; policy of two, 19 ms).
            parts += ["set --", *map(QuoteString, available), ";"]
            for program, package in candidates:
                parts += ["command -v", QuoteString(program), ">/dev/null 2>&1 || set -- \"$@\"",
                          QuoteString(package), ";"]
            parts += [
                "[ $# -eq 0 ] || apt-cache policy \"$@\" 2>/dev/null | awk",
                QuoteString('/^[^ ]/ { p = $0; sub(/:$/, "", p) } /^  Candidate: / && $2 != "(none)" { print "available=" p }'),
                ";",
            ]
        parts += [
            "for r in", *REPOSITORY_NAMES, f"; do [ -f {SOURCES_DIR}/sparkrig-$r.sources ] && echo own=$r; done;",
        ]
        parts += [
            f"[ -f {DAEMON_JSON} ] && echo daemon_json=$(base64 -w0 {DAEMON_JSON});",
            f"echo docker=$(systemctl is-enabled {SERVICE} 2>/dev/null) $(systemctl is-active {SERVICE});",
            f"echo group=$(getent group {GROUP});",
        ]
        if users:
            parts += [
                "for u in", *map(QuoteString, users),
                "; do getent passwd \"$u\" >/dev/null && echo user=$u; done;",
            ]
        parts += [
            "echo dockerd=$(command -v dockerd);",
            "echo nvidia_runtime=$(command -v nvidia-container-runtime);",
            "echo nvidia_ctk=$(command -v nvidia-ctk);",
            "[ -e /dev/nvidiactl ] && echo gpu=1;",
            f"[ -f /lib/systemd/system/{CDI_REFRESH} ] || [ -f /usr/lib/systemd/system/{CDI_REFRESH} ]",
            f"&& echo cdi_refresh=$(systemctl is-enabled {CDI_REFRESH}) $(systemctl is-active {CDI_REFRESH});",
            f"[ -f {CDI_STATIC_SPEC} ] && echo cdi_static_spec=1; true",
        ]
        return StringCommand(*parts)

    @atomic.parses
    def process(self, output: list[str]):
        values = _lines(output)

        def one(key: str) -> str:
            return values.get(key, [""])[0]

        docker = one("docker").split()
        return {
            "os": one("os"),
            "codename": one("codename"),
            "arch": one("arch"),
            # "ii " (wanted: install, state: installed) is an installed package.
            "installed": [p.split()[0] for p in values.get("pkg", []) if p.split()[1:2] == ["ii"]],
            "available": values.get("available", []),
            "own_sources": values.get("own", []),
            "daemon_json": _decode(values, "daemon_json"),
            "docker_enabled": docker[:1] == ["enabled"],
            "docker_active": docker[-1:] == ["active"],
            "group_members": _group_members(one("group")),
            "users": values.get("user", []),
            "dockerd": one("dockerd") or None,
            "nvidia_runtime": one("nvidia_runtime") or None,
            "nvidia_ctk": one("nvidia_ctk") or None,
            "gpu": one("gpu") == "1",
            "cdi_refresh": one("cdi_refresh") or None,
            "cdi_static_spec": one("cdi_static_spec") == "1",
        }


class DockerDaemonJson(FactBase):
    """
    Returns the text of Docker's ``/etc/docker/daemon.json``, ``None`` when there is none.

    .. code:: python

        '{\\n  "log-driver": "json-file"\\n}\\n'
    """

    def command(self) -> str:
        return f"[ -f {DAEMON_JSON} ] && echo daemon_json=$(base64 -w0 {DAEMON_JSON}); true"

    @atomic.parses
    def process(self, output: list[str]):
        # Not UTF-8 (a Latin-1 file): UnicodeDecodeError, a ValueError: this host fails.
        return _decode(_lines(output), "daemon_json")


class GroupMembers(FactBase):
    """
    Returns a group's members and which of the given users exist; ``members`` is
    ``None`` when there is no such group.

    .. code:: python

        {"members": ["alice"], "users": ["alice", "bob"]}
    """

    def command(self, group: str, users: Sequence[str] = ()) -> StringCommand:
        return StringCommand(
            "echo group=$(getent group", QuoteString(group), ");",
            "for u in", *map(QuoteString, users), "; do getent passwd \"$u\" >/dev/null && echo user=$u; done",
        )

    @atomic.parses
    def process(self, output: list[str]):
        values = _lines(output)
        return {"members": _group_members(values.get("group", [""])[0]), "users": values.get("user", [])}


class SparkrigAptRepositories(FactBase):
    """
    Returns sparkrig's repository files (keyrings and sources, by repository name) and
    every apt source entry on the host, to find repositories configured twice.

    ``fingerprints`` lists the keyring's primary key fingerprints (``None``: no
    keyring, or no gpg to read it); ``sources`` is the sources file's sha256 and mode.

    .. code:: python

        {"docker": {"fingerprints": ["9DC8…CD88"], "sources": ["5e0c…", 0o644]},
         "nvidia-container-toolkit": {"fingerprints": None, "sources": None},
         "entries": [("/etc/apt/sources.list.d/docker.list",
                      "deb [arch=arm64] https://download.docker.com/linux/ubuntu noble stable")]}
    """

    def command(self, names: Sequence[str] = REPOSITORY_NAMES) -> StringCommand:
        parts = ["t=$(mktemp -d);"]
        for name in names:
            keyring = QuoteString(f"{KEYRING_DIR}/sparkrig-{name}.gpg")
            sources = QuoteString(f"{SOURCES_DIR}/sparkrig-{name}.sources")
            parts += [
                "if [ -f", keyring, "] && command -v gpg >/dev/null; then",
                "echo key", QuoteString(name),
                "$(gpg --homedir \"$t\" --batch --with-colons --show-keys", keyring,
                "2>/dev/null |", PRIMARY_FINGERPRINTS, "); fi;",
                "[ -f", sources, "] && echo src", QuoteString(name),
                "$(sha256sum <", sources, "| cut -d' ' -f1) $(stat -c %a", sources, ");",
            ]
        parts += [
            "rm -rf \"$t\";",
            "grep -s -H -E '^[[:space:]]*(deb|deb-src|URIs:)[[:space:]]' /etc/apt/sources.list",
            f"{SOURCES_DIR}/*.list {SOURCES_DIR}/*.sources | sed 's/^/entry /'; true",
        ]
        return StringCommand(*parts)

    @staticmethod
    def default():
        return {"entries": [], **{name: {"fingerprints": None, "sources": None} for name in REPOSITORY_NAMES}}

    @atomic.parses
    def process(self, output: list[str]):
        found = self.default()
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "entry":
                path, _, entry = rest.partition(":")
                found["entries"].append((path, entry))
                continue
            name, *words = rest.split()
            repo = found.setdefault(name, {"fingerprints": None, "sources": None})
            if kind == "key":
                repo["fingerprints"] = words
            elif kind == "src" and len(words) == 2:
                repo["sources"] = [words[0], int(words[1], 8)]
        return found


# daemon.json ---------------------------------------------------------------


def merged_daemon_config(current: Mapping[str, Any], default_runtime: bool) -> dict[str, Any]:
    """``current`` with the nvidia runtime registered (an existing registration kept)
    and ``default-runtime`` set to nvidia, or no longer nvidia; every other key as it was."""
    config = copy.deepcopy(dict(current))
    runtimes = config.setdefault("runtimes", {})
    if not isinstance(runtimes, dict):
        raise ValueError('"runtimes" is not a JSON object')
    runtimes.setdefault("nvidia", copy.deepcopy(NVIDIA_RUNTIME))
    if default_runtime:
        config["default-runtime"] = "nvidia"
    elif config.get("default-runtime") == "nvidia":
        del config["default-runtime"]
    return config


def parse_daemon_json(text: str | None) -> dict[str, Any]:
    """The daemon.json object (``{}`` without a file); ValueError saying why it is unusable."""
    if text is None or not text.strip():
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"it is not valid JSON ({error})") from None
    except RecursionError:
        raise ValueError("it nests deeper than Python's JSON reader goes") from None
    if not isinstance(config, dict):
        raise ValueError("it is not a JSON object")
    return config


def daemon_json_change(text: str | None, default_runtime: bool) -> str | None:
    """The new daemon.json for a host whose file holds ``text`` (``None``: no file), or
    ``None`` when it is right already; ValueError when the file is unusable."""
    current = parse_daemon_json(text)
    wanted = merged_daemon_config(current, default_runtime)
    if text is not None and wanted == current:
        return None
    return json.dumps(wanted, indent=2) + "\n"


# dockerd >= 23 checks the whole configuration; an older one (Debian 12's 20.10) has no
# --validate, and the file is then at least parsed as JSON. $1: the new file.
DAEMON_JSON_CHECK = (
    'if dockerd --help 2>/dev/null | grep -q -e --validate; then '
    'dockerd --validate --config-file "$1"; '
    'else python3 -I -c "import json, sys; json.load(open(sys.argv[1]))" "$1"; fi'
)


# Operations ----------------------------------------------------------------


# $1 key URL, $2 expected primary fingerprint, $3 keyring. The key is imported into a
# scratch keyring and only the expected key is exported: a key file that carries other
# keys does not widen what the repository may be signed with.
FETCH_KEY = r"""
t=$(mktemp -d) || exit 1
trap 'gpgconf --homedir "$t" --kill all 2>/dev/null; rm -rf "$t"' EXIT
curl -fsSL --retry 3 -o "$t/key" "$1" || { echo "sparkrig: cannot download $1" >&2; exit 1; }
got=$(gpg --homedir "$t" --batch --with-colons --show-keys "$t/key" 2>/dev/null |
      PRIMARY_FINGERPRINTS)
case " $(echo $got) " in
  *" $2 "*) ;;
  *) echo "sparkrig: the key at $1 has fingerprint(s) '$(echo $got)', not $2: refusing it" >&2; exit 1 ;;
esac
gpg --homedir "$t" --batch --quiet --import "$t/key" 2>/dev/null &&
gpg --homedir "$t" --batch --export "$2" > "$t/keyring" &&
[ -s "$t/keyring" ] || { echo "sparkrig: cannot export key $2 from $1" >&2; exit 1; }
mkdir -p "$(dirname "$3")" &&
install -m 644 -o root -g root "$t/keyring" "$3.sparkrig-new" &&
mv -f "$3.sparkrig-new" "$3"
""".replace("PRIMARY_FINGERPRINTS", PRIMARY_FINGERPRINTS)


@operation()
def repository_key(repository: str, url: str, fingerprint: str, keyring: str):
    """
    Install an apt repository's signing key, after checking its primary fingerprint.

    + repository: the repository's name in sparkrig (``docker``, ``nvidia-container-toolkit``)
    + url: where the host downloads the key (armored or binary)
    + fingerprint: the primary key fingerprint the key must have (40 hex digits)
    + keyring: the keyring file the repository's ``Signed-By`` names

    **Example:**

    .. code:: python

        containers.repository_key(
            repository="docker", url="https://download.docker.com/linux/ubuntu/gpg",
            fingerprint="9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
            keyring="/etc/apt/keyrings/sparkrig-docker.gpg",
        )
    """
    current = host.get_fact(SparkrigAptRepositories, names=(repository,))[repository]["fingerprints"]
    if current == [fingerprint]:
        host.noop(f"{keyring} holds key {fingerprint}")
        return
    yield StringCommand("sh", "-c", QuoteString(FETCH_KEY), "fetch-key",
                        QuoteString(url), QuoteString(fingerprint), QuoteString(keyring))


@operation()
def daemon_config(default_runtime: bool = False):
    """
    Merge the nvidia runtime into Docker's daemon.json, keeping every other key.

    + default_runtime: make ``nvidia`` the default runtime (False: make sure it is not)

    **Example:**

    .. code:: python

        containers.daemon_config(default_runtime=True)
    """
    text = host.get_fact(DockerDaemonJson)
    if atomic.fact_failed():  # unreadable: pyinfra has failed this host and said why
        return
    try:
        content = daemon_json_change(text, default_runtime)
    except ValueError as error:
        yield refuse(f"{DAEMON_JSON}: {error}; sparkrig merges into it and never overwrites it: "
                     "fix or remove it, then run again")
        return
    if content is None:
        host.noop(f"{DAEMON_JSON} registers the nvidia runtime")
        return
    yield from atomic.file._inner(
        dest=DAEMON_JSON,
        content=content,
        mode=0o644,
        validate=("sh", "-c", DAEMON_JSON_CHECK, "daemon-json-check"),
        backup=DAEMON_JSON_BACKUP,
    )


@operation()
def group_members(group: str, users: Sequence[str]):
    """
    Add existing users to a group (never removes anyone, never creates a user).

    + group: the group, created as a system group when missing
    + users: user names; a name without an account fails the operation

    **Example:**

    .. code:: python

        containers.group_members(group="docker", users=["alice"])
    """
    found = host.get_fact(GroupMembers, group=group, users=tuple(users))
    missing = [user for user in users if user not in found["users"]]
    if missing:
        yield refuse(f"no such user on this host: {', '.join(missing)} (containers_docker_users)")
        return
    members = found["members"]
    if members is None:
        yield StringCommand("groupadd", "--system", QuoteString(group))
        members = []
    joining = [user for user in users if user not in members]
    if not joining:
        host.noop(f"{', '.join(users)} in group {group}")
        return
    atomic.detail(f"adding {', '.join(joining)} to group {group}")
    for user in joining:
        yield StringCommand("gpasswd", "-a", QuoteString(user), QuoteString(group))


@operation()
def static_cdi_spec(path: str = CDI_STATIC_SPEC):
    """
    Generate a CDI specification of the host's GPUs with ``nvidia-ctk`` when there is none.

    + path: where the specification is written

    **Example:**

    .. code:: python

        containers.static_cdi_spec()
    """
    if host.get_fact(File, path=path):
        host.noop(f"{path} exists")
        return
    yield StringCommand("nvidia-ctk", "cdi", "generate", QuoteString(f"--output={path}"))


# The deploy ----------------------------------------------------------------


def wanted_packages(data: Any, sources: Mapping[str, str]) -> list[str]:
    """The packages the host's (resolved) sources ask for, Docker's first."""
    packages: list[str] = []
    docker, toolkit = sources["containers_docker_source"], sources["containers_toolkit_source"]
    if docker == "distro":
        packages += DISTRO_PACKAGES
    elif docker in ("docker-ce", HOST_SOURCE):
        packages += data.containers_docker_ce_packages
    if toolkit in ("nvidia", HOST_SOURCE):
        packages += data.containers_toolkit_packages
    return packages


def host_part(settings: Mapping[str, Any]) -> reading.Part:
    """The :class:`ContainerHost` reading these settings decide from."""
    distro = settings["containers_docker_source"] == "distro"
    # Every package any source could ask for: "auto" is decided from this reading.
    candidates = [
        (src.program, vendor_package(settings, src.key)) for src in SOURCES if settings[src.key] == "auto"
    ]
    return reading.part(
        ContainerHost,
        packages=(
            *dict.fromkeys([*settings["containers_docker_ce_packages"], *DISTRO_PACKAGES,
                            *settings["containers_toolkit_packages"], *KEY_TOOLS,
                            *([DISTRO_CLI] if distro else [])]),
        ),
        users=tuple(settings["containers_docker_users"]),
        available=(DISTRO_CLI,) if distro else (),
        candidates=tuple(candidates),
    )


# sparkrig's repository files: read with the rest (cheap), used where a repository is wanted.
APT_REPOSITORIES = reading.part(SparkrigAptRepositories)


@reading.planner
def reads(settings):
    return [host_part(settings), APT_REPOSITORIES]


@deploy("Docker and the NVIDIA container toolkit", data_defaults=ALL_DEFAULTS)
def containers():
    """
    Install (or verify) Docker and the NVIDIA container toolkit, register the nvidia
    runtime in daemon.json, keep Docker running, set up CDI and the docker group.

    Settings: ``containers_*``; see docs/settings.md. The host's one reading holds
    :class:`ContainerHost` and :class:`SparkrigAptRepositories`; an operation is added
    only where that reading shows work to do, and it reads its own state again when it runs.
    """
    data = host.data
    settings = {s.key: getattr(data, s.key) for s in SETTINGS}
    distro = data.containers_docker_source == "distro"
    found = reading.value(host_part(settings))
    if atomic.fact_failed():  # unreadable: pyinfra has failed this host and said why
        return
    sources = resolve_sources(settings, found)
    packages = wanted_packages(data, sources)
    if distro and DISTRO_CLI in found["available"] + found["installed"]:
        packages.insert(len(DISTRO_PACKAGES), DISTRO_CLI)
    if data.containers_docker_source == "preinstalled" and not found["dockerd"]:
        refused(
            name="Docker is preinstalled",
            message="containers_docker_source is 'preinstalled' but this host has no dockerd",
        )
        return
    if data.containers_toolkit_source == "preinstalled" and not found["nvidia_runtime"]:
        refused(
            name="The NVIDIA container toolkit is preinstalled",
            message="containers_toolkit_source is 'preinstalled' but this host has no "
            "nvidia-container-runtime",
        )
        return

    release = {field: found[field] for field in URL_FIELDS}
    repos = repositories({**settings, **sources}, release)
    existing = reading.value(APT_REPOSITORIES) if repos else SparkrigAptRepositories.default()
    for repo in list(repos):
        conflicts = foreign_sources(existing["entries"], repo)
        key = next(src.key for src in SOURCES if src.repository == repo.name)
        if conflicts and settings[key] == "auto" and repo.name not in found["own_sources"]:
            # The host has this vendor's repository already: install from it as it is.
            repos.remove(repo)
            continue
        if conflicts:
            refused(
                name="Docker's and NVIDIA's repositories are configured once",
                message=f"{repo.url} is already configured in {', '.join(conflicts)}; apt refuses "
                "one repository with two keyrings: remove that file, or set the source to "
                "'preinstalled' to keep it",
            )
            return

    stale_keys = [repo for repo in repos if existing[repo.name]["fingerprints"] != [repo.fingerprint]]
    tools = [p for p in KEY_TOOLS if p not in found["installed"]]
    if stale_keys and tools:
        install_packages(name="Install what fetches and checks repository keys", packages=tools)
    for repo in in_slots(stale_keys):
        repository_key(
            name=f"Signing key of the {repo.name} repository ({repo.keyring})",
            repository=repo.name,
            url=repo.key_url,
            fingerprint=repo.fingerprint,
            keyring=repo.keyring,
        )
    stale_sources = []
    for repo in in_slots(repos):
        content = render_sources(repo, found["arch"])
        if existing[repo.name]["sources"] == [hashlib.sha256(content.encode()).hexdigest(), 0o644]:
            continue
        stale_sources.append(repo)
        atomic.file(
            name=f"The {repo.name} repository ({repo.sources_file})",
            dest=repo.sources_file,
            content=content,
            mode=0o644,
        )

    missing = [p for p in packages if p not in found["installed"]]
    if missing or stale_keys or stale_sources:
        # Fresh package lists when a repository changed or a package is missing.
        install_packages(name="Install Docker and the NVIDIA container toolkit", packages=missing)

    try:
        config_stale = daemon_json_change(found["daemon_json"], data.containers_nvidia_default_runtime) is not None
    except ValueError:
        config_stale = True  # unusable: daemon_config says why, and fails this host
    config = None
    if config_stale:
        config = daemon_config(
            name=f"Register the nvidia runtime in {DAEMON_JSON} (other keys kept)",
            default_runtime=data.containers_nvidia_default_runtime,
        )
    # A package installed in this run may start or not start Docker: check again then.
    if missing or not (found["docker_active"] and found["docker_enabled"]):
        systemd.service(
            name="Docker is enabled and running",
            service=SERVICE,
            running=True,
            enabled=True,
        )
    if config is not None:
        systemd.service(
            name=f"Restart Docker: {DAEMON_JSON} changed",
            service=SERVICE,
            running=True,
            restarted=True,
            _if=config.did_change,
        )

    if found["cdi_refresh"] is not None:
        if found["cdi_refresh"] != "enabled active":
            systemd.service(
                name=f"CDI specification kept current by {CDI_REFRESH}",
                service=CDI_REFRESH,
                running=True,
                enabled=True,
            )
    elif found["nvidia_ctk"] and found["gpu"] and not found["cdi_static_spec"]:
        static_cdi_spec(name=f"CDI specification of the GPUs ({CDI_STATIC_SPEC})")

    users = data.containers_docker_users
    members = found["group_members"] or []
    if any(user not in members for user in users):
        group_members(
            name="containers_docker_users in the docker group (root-equivalent)",
            group=GROUP,
            users=users,
        )
