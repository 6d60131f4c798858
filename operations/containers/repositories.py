"""Containers: where Docker and the toolkit come from ("auto" decided from the host), and the
vendors' apt repositories: their sources files and signing keys."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import rendering

from .facts import KEYRING_DIR, REPOSITORY_NAMES, SOURCES, SOURCES_DIR, SparkrigAptRepositories

# What "auto" resolves to, besides the vendor repository or "preinstalled": the
# packages are absent, and installed from a source the host already has.
HOST_SOURCE = "host"
# What fetches a repository key and reads its fingerprint on the host.
KEY_TOOLS = ("ca-certificates", "curl", "gnupg")


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


def url_origin(template: str) -> str:
    """A repository URL setting up to its first placeholder, without scheme or final '/'."""
    return template.split("://", 1)[-1].split("{", 1)[0].rstrip("/")


def repositories(data: Mapping[str, Any], release: Mapping[str, str]) -> list[AptRepository]:
    """The repositories a host's (resolved) sources ask for, URLs filled in from
    ``release`` (``{"os": "ubuntu", "codename": "noble", "arch": "arm64"}``)."""
    found = []
    if data["containers_docker_source"] == "docker-ce":
        found.append(
            AptRepository(
                "docker",
                data["containers_docker_repo_url"].format(**release),
                release["codename"],
                ("stable",),
                data["containers_docker_key_url"].format(**release),
                data["containers_docker_key_fingerprint"],
                url_origin(data["containers_docker_repo_url"]),
            )
        )
    if data["containers_toolkit_source"] == "nvidia":
        found.append(
            AptRepository(
                "nvidia-container-toolkit",
                data["containers_toolkit_repo_url"].format(**release),
                "/",  # a flat repository: no dists/, no components
                (),
                data["containers_toolkit_key_url"].format(**release),
                data["containers_toolkit_key_fingerprint"],
                url_origin(data["containers_toolkit_repo_url"]),
            )
        )
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
    return rendering.render(
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
        return line[len("URIs:") :].split()
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
    return sorted(
        {
            path
            for path, line in entries
            if path != repo.sources_file and any(same_origin(uri, repo) for uri in source_uris(line))
        }
    )


# The key is fetched on the host, its primary fingerprint checked and only that key kept.
FETCH_KEY = rendering.script("containers/fetch-key.sh")


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
    yield StringCommand(
        "sh",
        "-c",
        QuoteString(FETCH_KEY),
        "fetch-key",
        QuoteString(url),
        QuoteString(fingerprint),
        QuoteString(keyring),
    )
