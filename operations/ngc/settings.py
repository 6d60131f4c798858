"""NGC training containers (seeds 000 and 004): the settings, declared once, and their checks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkrig.operations.containers import settings as containers_settings
from sparkrig.operations.cuda_env import settings as cuda_env_settings
from sparkrig.operations.hardware import settings as hardware_settings
from sparkrig.operations.jobs import settings as jobs_settings
from sparkrig.python_wheels import REFUSED, normalise
from sparkrig.settings import (
    ENV_NAME,
    IMAGE_REFERENCE,
    USER_NAME,
    Setting,
    absolute_path,
    boolean,
    declare,
    defaults,
    int_range,
    one_of,
)

BUILDS = ("none", "packages", "unsloth")


JUPYTER_COMMAND = "jupyter lab --ip=127.0.0.1 --port={port} --no-browser --ServerApp.root_dir={project}"


_COMMAND_WORD = re.compile(r"[A-Za-z0-9._/:=@,+{}-]+")


def jupyter_command_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = (
        isinstance(value, str)
        and all(_COMMAND_WORD.fullmatch(word) for word in value.split(" "))
        and not value.startswith("-")
        and "127.0.0.1" in value
        and "0.0.0.0" not in value
    )
    return (
        None
        if ok
        else (
            "a command of words of letters, digits and ._/:=@,+- (and {port}, {project}) separated by "
            "single blanks, binding 127.0.0.1 (never 0.0.0.0)"
        )
    )


# Unsloth with the pins its Spark recipe was checked with; unsloth and unsloth_zoo at the newest
# release that resolves with them (uv pip compile, Python 3.12, aarch64, 2026-11-23).
UNSLOTH_PACKAGES = [
    "unsloth==2025.10.1",
    "unsloth_zoo==2025.10.1",
    "bitsandbytes==0.48.0",
    "transformers==4.56.2",
    "trl==0.22.2",
]


_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+")


_HOME_PATH = re.compile(r"~(/[A-Za-z0-9._-]+)+")


_MOUNT_POINT = re.compile(r"/[A-Za-z0-9._/-]*")


def pinned_image_check(value: Any, data: Mapping[str, Any]) -> str | None:
    if value == "" and not data.get("ngc_enabled"):
        return None
    ok = isinstance(value, str) and IMAGE_REFERENCE.fullmatch(value) and "@sha256:" in value
    return (
        None
        if ok
        else (
            "an image reference pinned by digest, such as "
            "'nvcr.io/nvidia/pytorch:25.09-py3@sha256:<64 hex digits>' (required when ngc_enabled)"
        )
    )


def local_image_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, str) and IMAGE_REFERENCE.fullmatch(value) and "@" not in value
    return None if ok else "a local image name with an optional tag, such as 'sparkrig/ngc:local' (no digest)"


def requirements_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, (list, tuple)) and all(isinstance(r, str) and _REQUIREMENT.fullmatch(r) for r in value)
    if not ok:
        return "a list of pinned requirements 'name==version' (extras allowed: 'name[extra]==version')"
    if any(normalise(re.split(r"[\[=]", r)[0]) in REFUSED for r in value):
        return "a list without flash-attn (no sm_121 kernels, CUDA 12 only: use PyTorch SDPA)"
    return None


def launch_users_check(value: Any, data: Mapping[str, Any]) -> str | None:
    allowed = "a list of user names, each also in containers_docker_users (launching needs Docker access)"
    if not isinstance(value, (list, tuple)) or not all(isinstance(u, str) and USER_NAME.fullmatch(u) for u in value):
        return allowed
    docker_users = data.get("containers_docker_users")  # containers' setting
    if docker_users is not None and any(u not in docker_users for u in value):
        return allowed
    return None


def home_path_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    if isinstance(value, str) and _HOME_PATH.fullmatch(value):
        return None
    if absolute_path(value, _data) is None and value != "/":
        return None
    return "an absolute path, or one below the caller's home written '~/dir'"


def optional_home_path_check(value: Any, data: Mapping[str, Any]) -> str | None:
    return None if value == "" else home_path_check(value, data)


def home_mounts_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, (list, tuple)) and all(isinstance(m, str) and _HOME_PATH.fullmatch(m) for m in value)
    return None if ok else "a list of directories below the caller's home, each written '~/dir' (e.g. '~/.aws')"


def mount_point_check(value: Any, data: Mapping[str, Any]) -> str | None:
    # One word wherever it goes: the unit's ExecStart (split at blanks) and docker's --volume (':').
    ok = (
        isinstance(value, str)
        and _MOUNT_POINT.fullmatch(value)
        and absolute_path(value, data) is None
        and value != "/"
        and not value.startswith(("/cache/", "/run/"))
    )
    return (
        None
        if ok
        else (
            "a normalised absolute path in the container of letters, digits and ._-/ "
            "(no spaces or ':') other than /, /cache/… and /run/…"
        )
    )


def secrets_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, (list, tuple)) and all(isinstance(s, str) and ENV_NAME.fullmatch(s) for s in value)
    return None if ok else "a list of environment variable names ([A-Za-z_][A-Za-z0-9_]*)"


def jupyter_user_check(value: Any, data: Mapping[str, Any]) -> str | None:
    if value == "" and not data.get("ngc_jupyter"):
        return None
    ok = isinstance(value, str) and USER_NAME.fullmatch(value) and value in (data.get("ngc_users") or [])
    return None if ok else "one of ngc_users (required when ngc_jupyter)"


def optional_absolute_path(value: Any, data: Mapping[str, Any]) -> str | None:
    return None if value == "" else absolute_path(value, data)


SETTINGS = (
    Setting(
        "ngc_enabled",
        False,
        "Set up the container workflow of seeds 000 and 004 at all: the "
        "pinned image, spark-container, and (with ngc_jupyter) "
        "JupyterLab. Off by default; it needs Docker from the containers"
        " concern.",
        boolean,
    ),
    Setting(
        "ngc_base_image",
        "",
        "The base image, pinned by digest, never by a moving tag alone, e.g. "
        '"nvcr.io/nvidia/pytorch:25.09-py3@sha256:<64 hex digits>" (read the digest with `docker '
        "buildx imagetools inspect nvcr.io/nvidia/pytorch:25.09-py3`). Pulled when Docker does not"
        " have it at that digest, never otherwise. Required when ngc_enabled.",
        pinned_image_check,
    ),
    Setting(
        "ngc_build",
        "none",
        'What runs: "none" (the base image as it is), "packages" (the base plus ngc_pip_packages) '
        'or "unsloth" (the Unsloth-on-Spark recipe: Triton at a fixed commit, xformers '
        "v0.0.33 for the profile's compute capability, and ngc_unsloth_packages; plus "
        "ngc_pip_packages). Built on the host from /etc/sparkrig/ngc/Dockerfile, again only when "
        "it changes.",
        one_of(*BUILDS),
    ),
    Setting(
        "ngc_pip_packages",
        [],
        'Pinned pip requirements ("name==version") installed into the '
        "image's own Python (never a venv: it would hide the image's "
        "CUDA builds). No flash-attn.",
        requirements_check,
    ),
    Setting(
        "ngc_unsloth_packages",
        UNSLOTH_PACKAGES,
        'The "unsloth" recipe\'s pip requirements, every one pinned ("name==version"), so hosts'
        " built on different days get the same image; the image's recipe label (the "
        "Dockerfile's sha256) changes with them. Unsloth's pins as its Spark recipe checked them; "
        "unsloth and unsloth_zoo at the newest release that resolves with them.",
        requirements_check,
    ),
    Setting(
        "ngc_image",
        "sparkrig/ngc:local",
        'The name the built image gets (ngc_build other than "none").',
        local_image_check,
    ),
    Setting(
        "ngc_memlock_unlimited",
        True,
        "Run containers with --ulimit memlock=-1, as NVIDIA's PyTorch containers want (pinned "
        "memory for CUDA). False only where the host cannot grant it: the lab's hosts are "
        'nspawn containers without CAP_SYS_RESOURCE ("error setting rlimit type 8").',
        boolean,
    ),
    Setting(
        "ngc_users",
        [],
        'Users who may run spark-container, e.g. ["spark"]. Launching needs '
        "Docker, so each must also be in containers_docker_users "
        "(root-equivalent). Root always may.",
        launch_users_check,
    ),
    Setting(
        "ngc_project_mount",
        "/workspace/project",
        "Where the project (spark-container's current directory, or --project) is mounted in "
        "the container; it is also the working directory.",
        mount_point_check,
    ),
    Setting(
        "ngc_hf_cache",
        "~/.cache/huggingface",
        'The Hugging Face cache on the host, "~/" being the caller\'s home, mounted at '
        "/cache/huggingface with HF_HOME pointing there: models are downloaded once. "
        "jobs_model_cache, when set, is mounted instead (one cache for all users).",
        home_path_check,
    ),
    Setting(
        "ngc_home_mounts",
        [],
        "Directories of the caller's home mounted read-only into the container at its HOME "
        '(/tmp), where present, e.g. ["~/.aws", "~/.wandb"]: credentials and settings the '
        "tools inside read. A link is not mounted.",
        home_mounts_check,
    ),
    Setting(
        "ngc_outputs",
        "",
        "A host directory mounted over the project's outputs/ (checkpoints "
        'on a bigger disk, e.g. "/data/outputs" or "~/outputs"). "": '
        "outputs stay in the project.",
        optional_home_path_check,
    ),
    Setting(
        "ngc_secrets",
        ["HF_TOKEN", "WANDB_API_KEY"],
        "Secrets spark-container passes in, by variable name: from the caller's environment, "
        "else from ~/.config/sparkrig/secrets/NAME (the caller's, mode 0600). Each is mounted "
        "read-only as a 0600 file and exported inside the container only, never given as --env"
        " (docker inspect would show it).",
        secrets_check,
    ),
    Setting(
        "ngc_jupyter",
        False,
        "Run JupyterLab as sparkrig-jupyter.service: the image's Jupyter"
        " and Python, on the host network bound to 127.0.0.1 only (reach"
        " it with `ssh -L 8888:127.0.0.1:8888`), its token in "
        "/var/lib/sparkrig/jupyter/token (mode 0600), Restart=always.",
        boolean,
    ),
    Setting(
        "ngc_jupyter_user",
        "",
        "The user Jupyter runs as: one of ngc_users; owns the token file. Required when ngc_jupyter.",
        jupyter_user_check,
    ),
    Setting(
        "ngc_jupyter_dir",
        "",
        'The directory Jupyter serves (mounted as the project). "": the user\'s home.',
        optional_absolute_path,
    ),
    Setting("ngc_jupyter_port", 8888, "Jupyter's port on 127.0.0.1.", int_range(1024, 65535, "a TCP port")),
    Setting(
        "ngc_jupyter_command",
        JUPYTER_COMMAND,
        "The notebook server the Jupyter unit runs in the image, {port} and {project} standing "
        "for ngc_jupyter_port and ngc_project_mount: the image's JupyterLab by default. It must "
        "bind 127.0.0.1 (never 0.0.0.0): reach it through an SSH tunnel.",
        jupyter_command_check,
    ),
)


declare(__name__, SETTINGS)

# The deploy's data_defaults: its own settings and those it reads of hardware (the profile's
# compute capability), jobs (jobs_model_cache, jobs_env), cuda_env (cuda_env_file) and
# containers (containers_docker_users, which ngc_users must be in).
DEFAULTS = defaults(
    (
        *SETTINGS,
        *hardware_settings.SETTINGS,
        *jobs_settings.SETTINGS,
        *cuda_env_settings.SETTINGS,
        *containers_settings.SETTINGS,
    )
)
