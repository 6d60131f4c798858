"""Containers: the host's one reading and the deploy."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from pyinfra.api import deploy
from pyinfra.operations import systemd

from sparkrig import atomic, host_output, host_settings, reading
from sparkrig.messages import refused
from sparkrig.packages import installed as install_packages

from .facts import (
    CDI_REFRESH,
    CDI_STATIC_SPEC,
    DAEMON_JSON,
    GROUP,
    SERVICE,
    SOURCES,
    ContainerHost,
    SparkrigAptRepositories,
)
from .operations import daemon_config, daemon_json_change, group_members, static_cdi_spec
from .repositories import (
    HOST_SOURCE,
    KEY_TOOLS,
    foreign_sources,
    in_slots,
    render_sources,
    repositories,
    repository_key,
    resolve_sources,
    vendor_package,
)
from .settings import DEFAULTS, URL_FIELDS

DISTRO_PACKAGES = ("docker.io",)
# Debian 13 ships the docker client apart from the engine, as a recommendation of docker.io.
DISTRO_CLI = "docker-cli"


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
    candidates = [(src.program, vendor_package(settings, src.key)) for src in SOURCES if settings[src.key] == "auto"]
    return reading.part(
        ContainerHost,
        packages=(
            *dict.fromkeys(
                [
                    *settings["containers_docker_ce_packages"],
                    *DISTRO_PACKAGES,
                    *settings["containers_toolkit_packages"],
                    *KEY_TOOLS,
                    *([DISTRO_CLI] if distro else []),
                ]
            ),
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


@deploy("Docker and the NVIDIA container toolkit", data_defaults=DEFAULTS)
def containers():
    """
    Install (or verify) Docker and the NVIDIA container toolkit, register the nvidia
    runtime in daemon.json, keep Docker running, set up CDI and the docker group.

    Settings: ``containers_*``; see docs/settings.md. The host's one reading holds
    :class:`ContainerHost` and :class:`SparkrigAptRepositories`; an operation is added
    only where that reading shows work to do, and it reads its own state again when it runs.
    """
    data = settings = host_settings.current()
    distro = data.containers_docker_source == "distro"
    found = reading.value(host_part(settings))
    if host_output.fact_failed():  # unreadable: pyinfra has failed this host and said why
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
            message="containers_toolkit_source is 'preinstalled' but this host has no nvidia-container-runtime",
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
