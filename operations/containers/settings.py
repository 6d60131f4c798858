"""Containers: the Docker engine and the NVIDIA container toolkit, wired together:
the settings, declared once, and their checks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkrig.settings import IMAGE_REFERENCE, USER_NAME, Setting, boolean, declare, defaults, one_of

DOCKER_SOURCES = ("auto", "docker-ce", "distro", "preinstalled")


TOOLKIT_SOURCES = ("auto", "nvidia", "preinstalled")


# The placeholders a repository or key URL may hold, filled in from the host.
URL_FIELDS = ("os", "codename", "arch")


_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%/{}-]*)?")


_FINGERPRINT = re.compile(r"[0-9A-F]{40}")


_PACKAGE = re.compile(r"[a-z0-9][a-z0-9.+-]+")


def url_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        "an http:// or https:// URL without quotes, spaces or query, whose only placeholders "
        "are {os}, {codename} and {arch}"
    )
    if not isinstance(value, str) or not _URL.fullmatch(value):
        return allowed
    try:
        value.format(**{field: "x" for field in URL_FIELDS})
    except (KeyError, IndexError, ValueError):
        return allowed
    return None


def fingerprint_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and _FINGERPRINT.fullmatch(value)
    return None if ok else "an OpenPGP v4 fingerprint: 40 upper-case hex digits, no spaces"


def packages_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, (list, tuple)) and value and all(isinstance(p, str) and _PACKAGE.fullmatch(p) for p in value)
    return None if ok else "a non-empty list of Debian package names"


def users_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, (list, tuple)) and all(isinstance(u, str) and USER_NAME.fullmatch(u) for u in value)
    return None if ok else "a list of user names ([a-z_][a-z0-9_-]*, at most 32 characters)"


def image_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and IMAGE_REFERENCE.fullmatch(value)
    return None if ok else "a docker image reference such as 'ubuntu:24.04' or 'registry:5000/team/image:tag'"


SETTINGS = (
    Setting(
        "containers_docker_source",
        "auto",
        'Where Docker comes from: "auto" keeps an installed Docker (DGX OS ships one: it is wired '
        "up, never reinstalled) and otherwise installs the packages below from a source the host "
        "already has, or else from Docker's apt repository (below), which is never added where a "
        'file already names that origin. "docker-ce" (Docker\'s repository), "distro" (the '
        "distribution's docker.io, and docker-cli where the client is packaged apart, as on Debian"
        ' 13) or "preinstalled" (sparkrig only checks that dockerd is there and wires it up) '
        "choose one way for every host.",
        one_of(*DOCKER_SOURCES),
    ),
    Setting(
        "containers_docker_repo_url",
        "https://download.docker.com/linux/{os}",
        "Docker's apt repository, or your mirror of it, with its layout (dists/CODENAME/ stable). "
        "{os} is the host's /etc/os-release ID (ubuntu, debian), {codename} its VERSION_CODENAME "
        "and {arch} its dpkg architecture (arm64 on a Spark, amd64).",
        url_check,
    ),
    Setting(
        "containers_docker_key_url",
        "https://download.docker.com/linux/{os}/gpg",
        "Where the host downloads the key that signs that repository (same placeholders).",
        url_check,
    ),
    Setting(
        "containers_docker_key_fingerprint",
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
        "The primary fingerprint that key must have (Docker's release key). A key with another "
        "fingerprint is refused; only this key goes into the repository's keyring.",
        fingerprint_check,
    ),
    Setting(
        "containers_docker_ce_packages",
        ["docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin", "docker-compose-plugin"],
        'The packages installed from Docker\'s repository (source "docker-ce").',
        packages_check,
    ),
    Setting(
        "containers_toolkit_source",
        "auto",
        'Where the NVIDIA container toolkit comes from: "auto" keeps an installed toolkit (DGX OS '
        "ships one) and otherwise installs it from a source the host already has (NVIDIA's CUDA "
        'repository carries it too), or else from NVIDIA\'s apt repository (below); "nvidia" (that '
        'repository) or "preinstalled" (checked: nvidia-container-runtime exists) choose one way '
        "for every host.",
        one_of(*TOOLKIT_SOURCES),
    ),
    Setting(
        "containers_toolkit_repo_url",
        "https://nvidia.github.io/libnvidia-container/stable/deb/{arch}",
        'NVIDIA\'s flat apt repository of the toolkit (suite "/"), or your mirror of it.',
        url_check,
    ),
    Setting(
        "containers_toolkit_key_url",
        "https://nvidia.github.io/libnvidia-container/gpgkey",
        "Where the host downloads the key that signs it.",
        url_check,
    ),
    Setting(
        "containers_toolkit_key_fingerprint",
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
        "The primary fingerprint that key must have (NVIDIA's libnvidia-container key).",
        fingerprint_check,
    ),
    Setting(
        "containers_toolkit_packages",
        ["nvidia-container-toolkit"],
        'The packages installed from NVIDIA\'s repository (toolkit source "nvidia").',
        packages_check,
    ),
    Setting(
        "containers_nvidia_default_runtime",
        False,
        'True: "nvidia" becomes Docker\'s default runtime (every container gets the NVIDIA hook '
        "without --gpus or --runtime). False: it is not the default (a default-runtime of your own"
        " is kept). The runtime is registered either way.",
        boolean,
    ),
    Setting(
        "containers_docker_users",
        [],
        'Users added to the docker group, e.g. ["spark"]. Opt-in: membership is root-equivalent (a'
        " member can start a privileged container that mounts /). The users must exist; nobody is "
        "ever removed from the group.",
        users_check,
    ),
    Setting(
        "containers_check_image",
        "ubuntu:24.04",
        "The image the compliance suite runs: `docker run --rm IMAGE true`, and on a host with a "
        "GPU `docker run --rm --gpus all IMAGE nvidia-smi -L` (the toolkit mounts nvidia-smi into "
        "any image). It must be present or pullable on the host.",
        image_check,
    ),
)


declare(__name__, SETTINGS)

# The deploy's data_defaults: its own settings (it reads no other concern's).
DEFAULTS = defaults(SETTINGS)
