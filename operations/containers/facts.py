"""Containers: what the concern reads from a host (its release, packages, Docker, the docker
group, the NVIDIA pieces, sparkrig's repository files) and where those are."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output


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
    Source(
        "containers_toolkit_source", "nvidia", "nvidia-container-runtime", "nvidia_runtime", "nvidia-container-toolkit"
    ),
)
SERVICE = "docker.service"
GROUP = "docker"
DAEMON_JSON = "/etc/docker/daemon.json"
CDI_REFRESH = "nvidia-cdi-refresh.path"
CDI_STATIC_SPEC = "/etc/cdi/nvidia.yaml"
KEYRING_DIR = "/etc/apt/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"
# Reads `gpg --with-colons --show-keys` and prints the primary keys' fingerprints (the
# "fpr" record right after a "pub" one), not the subkeys'.
PRIMARY_FINGERPRINTS = """awk -F: '$1=="pub"{p=1;next} $1=="fpr"&&p{print $10} {p=0}'"""
REPOSITORY_NAMES = tuple(src.repository for src in SOURCES)


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
    # A file's body: compared with what the deploy writes, never shown (host_output.Content).
    return host_output.Content(base64.b64decode(values[key][0]).decode()) if key in values else None


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
                *map(QuoteString, packages),
                "2>/dev/null;",
            ]
        if available or candidates:
            # One apt-cache for every package asked: each start loads apt's cache (apt-cache
            # show of an unknown package took 120 ms on a lab host; policy of two, 19 ms).
            parts += ["set --", *map(QuoteString, available), ";"]
            for program, package in candidates:
                parts += [
                    "command -v",
                    QuoteString(program),
                    '>/dev/null 2>&1 || set -- "$@"',
                    QuoteString(package),
                    ";",
                ]
            parts += [
                '[ $# -eq 0 ] || apt-cache policy "$@" 2>/dev/null | awk',
                QuoteString(
                    '/^[^ ]/ { p = $0; sub(/:$/, "", p) } /^  Candidate: / && $2 != "(none)" { print "available=" p }'
                ),
                ";",
            ]
        parts += [
            "for r in",
            *REPOSITORY_NAMES,
            f"; do [ -f {SOURCES_DIR}/sparkrig-$r.sources ] && echo own=$r; done;",
        ]
        parts += [
            f"[ -f {DAEMON_JSON} ] && echo daemon_json=$(base64 -w0 {DAEMON_JSON});",
            f"echo docker=$(systemctl is-enabled {SERVICE} 2>/dev/null) $(systemctl is-active {SERVICE});",
            f"echo group=$(getent group {GROUP});",
        ]
        if users:
            parts += [
                "for u in",
                *map(QuoteString, users),
                '; do getent passwd "$u" >/dev/null && echo user=$u; done;',
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

    @host_output.parses
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

    @host_output.parses
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
            "echo group=$(getent group",
            QuoteString(group),
            ");",
            "for u in",
            *map(QuoteString, users),
            '; do getent passwd "$u" >/dev/null && echo user=$u; done',
        )

    @host_output.parses
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
                "if [ -f",
                keyring,
                "] && command -v gpg >/dev/null; then",
                "echo key",
                QuoteString(name),
                '$(gpg --homedir "$t" --batch --with-colons --show-keys',
                keyring,
                "2>/dev/null |",
                PRIMARY_FINGERPRINTS,
                "); fi;",
                "[ -f",
                sources,
                "] && echo src",
                QuoteString(name),
                "$(sha256sum <",
                sources,
                "| cut -d' ' -f1) $(stat -c %a",
                sources,
                ");",
            ]
        parts += [
            'rm -rf "$t";',
            "grep -s -H -E '^[[:space:]]*(deb|deb-src|URIs:)[[:space:]]' /etc/apt/sources.list",
            f"{SOURCES_DIR}/*.list {SOURCES_DIR}/*.sources | sed 's/^/entry /'; true",
        ]
        return StringCommand(*parts)

    @staticmethod
    def default():
        return {"entries": [], **{name: {"fingerprints": None, "sources": None} for name in REPOSITORY_NAMES}}

    @host_output.parses
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
