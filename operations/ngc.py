"""
NGC training containers (seeds 000 and 004): NVIDIA's PyTorch image pinned by
digest, an optional image built on it, the ``spark-container`` launcher, and
JupyterLab as a systemd-managed container bound to 127.0.0.1. Off by default.

- The base image is pulled by digest (``name[:tag]@sha256:…``), never by a moving
  tag, and only when ``docker image inspect`` does not find it at that digest.
- ``ngc_build`` ``packages`` or ``unsloth`` renders ``/etc/sparkrig/ngc/Dockerfile``
  (``FROM`` the pinned base) and builds it as ``ngc_image``, labelled with the sha256
  of the Dockerfile: it is rebuilt only when the Dockerfile (base digest included)
  changed. The build runs as a transient systemd unit, so it survives a dropped SSH
  session.
- ``/usr/local/bin/spark-container`` runs a command (default: bash) as its caller in
  the image with ``--gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864``,
  the project, the Hugging Face cache and the outputs mounted, the CUDA env file's
  portable variables, and secrets as read-only 0600 files exported inside the
  container only (never ``--env`` values, which ``docker inspect`` shows).
  ``--publish PORT`` binds to 127.0.0.1 (``--publish-all-interfaces`` for every
  interface), ``ngc_home_mounts`` are mounted read-only, ``jobs_model_cache`` (when
  set) replaces ``ngc_hf_cache``, and ``--detach NAME`` hands the same launch to
  ``spark-run --detach`` (the job wrappers concern), so ``spark-jobs`` sees it.
- ``ngc_jupyter``: ``sparkrig-jupyter.service`` runs JupyterLab through the launcher,
  on the host network bound to 127.0.0.1, with its token read from a 0600 file
  generated on the host (``JUPYTER_TOKEN`` inside the container), ``Restart=always``.

The concern reads the host with two facts (:class:`NgcHost` for Docker's images, the
users and the token; :class:`atomic.HostState` for its files and unit): one remote
command each, and no operation on a converged host. Turned off, it reads nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from sparkrig.python_wheels import REFUSED, normalise
from sparkrig import atomic, reading
from sparkrig.units import JOB_UNIT_PREFIX, SPARK_RUN
from sparkrig.settings import ALL_DEFAULTS, ENV_NAME, IMAGE_REFERENCE, USER_NAME, Setting, absolute_path, boolean, int_range, one_of, declare

BUILDS = ("none", "packages", "unsloth")
JUPYTER_COMMAND = "jupyter lab --ip=127.0.0.1 --port={port} --no-browser --ServerApp.root_dir={project}"
# Words systemd and the container pass on as they are: no quotes, blanks inside a word or '$'.
_WORD = "[A-Za-z0-9._/:=@,+-]"
_COMMAND_WORD = re.compile(r"[A-Za-z0-9._/:=@,+{}-]+")


def jupyter_command_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = (
        isinstance(value, str)
        and all(_COMMAND_WORD.fullmatch(word) for word in value.split(" "))
        and not value.startswith("-")
        and "127.0.0.1" in value
        and "0.0.0.0" not in value
    )
    return None if ok else (
        "a command of words of letters, digits and ._/:=@,+- (and {port}, {project}) separated by "
        "single blanks, binding 127.0.0.1 (never 0.0.0.0)"
    )
LAUNCHER = "/usr/local/bin/spark-container"
BUILD_DIR = "/etc/sparkrig/ngc"
DOCKERFILE = f"{BUILD_DIR}/Dockerfile"
RECIPE_LABEL = "sparkrig.recipe"
BUILD_UNIT = "sparkrig-ngc-build"
JUPYTER_UNIT = "sparkrig-jupyter.service"
JUPYTER_UNIT_FILE = f"/etc/systemd/system/{JUPYTER_UNIT}"
JUPYTER_CONTAINER = "sparkrig-jupyter"
JUPYTER_DESCRIPTION = "JupyterLab in the NGC container (sparkrig)"
TOKEN_DIR = "/var/lib/sparkrig/jupyter"
TOKEN_FILE = f"{TOKEN_DIR}/token"
# Seed 000's Unsloth-on-Spark recipe, as spark-facts checked it.
TRITON_COMMIT = "c5d671f91d90f40900027382f98b17a3e04045f6"
XFORMERS_VERSION = "v0.0.33"
# Unsloth with the pins seed 000 was checked with; unsloth and unsloth_zoo at the newest
# release that resolves with them (uv pip compile, Python 3.12, aarch64, 2026-11-23).
UNSLOTH_PACKAGES = [
    "unsloth==2025.10.1", "unsloth_zoo==2025.10.1", "bitsandbytes==0.48.0", "transformers==4.56.2", "trl==0.22.2",
]


# Settings ------------------------------------------------------------------

_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+")
_HOME_PATH = re.compile(r"~(/[A-Za-z0-9._-]+)+")
_MOUNT_POINT = re.compile(r"/[A-Za-z0-9._/-]*")


def pinned_image_check(value: Any, data: Mapping[str, Any]) -> str | None:
    if value == "" and not data.get("ngc_enabled"):
        return None
    ok = isinstance(value, str) and IMAGE_REFERENCE.fullmatch(value) and "@sha256:" in value
    return None if ok else (
        "an image reference pinned by digest, such as "
        "'nvcr.io/nvidia/pytorch:25.09-py3@sha256:<64 hex digits>' (required when ngc_enabled)"
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
    docker_users = data.get("containers_docker_users")
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
        isinstance(value, str) and _MOUNT_POINT.fullmatch(value) and absolute_path(value, data) is None
        and value != "/" and not value.startswith(("/cache/", "/run/"))
    )
    return None if ok else (
        "a normalised absolute path in the container of letters, digits and ._-/ "
        "(no spaces or ':') other than /, /cache/… and /run/…"
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
    Setting("ngc_enabled", False, "Set up the container workflow of seeds 000 and 004 at all: the "
                                  "pinned image, spark-container, and (with ngc_jupyter) "
                                  "JupyterLab. Off by default; it needs Docker from the containers"
                                  " concern.", boolean),
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
        'or "unsloth" (seed 000\'s Unsloth-on-Spark recipe: Triton at a fixed commit, xformers '
        "v0.0.33 for the profile's compute capability, and ngc_unsloth_packages; plus "
        "ngc_pip_packages). Built on the host from /etc/sparkrig/ngc/Dockerfile, again only when "
        "it changes.",
        one_of(*BUILDS),
    ),
    Setting("ngc_pip_packages", [], 'Pinned pip requirements ("name==version") installed into the '
                                    "image's own Python (never a venv: it would hide the image's "
                                    "CUDA builds). No flash-attn.", requirements_check),
    Setting("ngc_unsloth_packages", UNSLOTH_PACKAGES,
            'The "unsloth" recipe\'s pip requirements, every one pinned ("name==version"), so hosts'
            " built on different days get the same image; the image's recipe label (the "
            "Dockerfile's sha256) changes with them. Unsloth's pins as seed 000 checked them; "
            "unsloth and unsloth_zoo at the newest release that resolves with them.",
            requirements_check),
    Setting("ngc_image", "sparkrig/ngc:local", "The name the built image gets (ngc_build other "
                                               'than "none").',
            local_image_check),
    Setting("ngc_memlock_unlimited", True,
            "Run containers with --ulimit memlock=-1, as NVIDIA's PyTorch containers want (pinned "
            "memory for CUDA). False only where the host cannot grant it: the lab's hosts are "
            'nspawn containers without CAP_SYS_RESOURCE ("error setting rlimit type 8").', boolean),
    Setting("ngc_users", [], 'Users who may run spark-container, e.g. ["spark"]. Launching needs '
                             "Docker, so each must also be in containers_docker_users "
                             "(root-equivalent). Root always may.",
            launch_users_check),
    Setting("ngc_project_mount", "/workspace/project",
            "Where the project (spark-container's current directory, or --project) is mounted in "
            "the container; it is also the working directory.", mount_point_check),
    Setting("ngc_hf_cache", "~/.cache/huggingface",
            'The Hugging Face cache on the host, "~/" being the caller\'s home, mounted at '
            "/cache/huggingface with HF_HOME pointing there: models are downloaded once. "
            "jobs_model_cache, when set, is mounted instead (one cache for all users).",
            home_path_check),
    Setting("ngc_home_mounts", [],
            'Directories of the caller\'s home mounted read-only into the container at its HOME '
            '(/tmp), where present, e.g. ["~/.aws", "~/.wandb"]: credentials and settings the '
            "tools inside read. A link is not mounted.", home_mounts_check),
    Setting("ngc_outputs", "", "A host directory mounted over the project's outputs/ (checkpoints "
                               'on a bigger disk, e.g. "/data/outputs" or "~/outputs"). "": '
                               "outputs stay in the project.", optional_home_path_check),
    Setting("ngc_secrets", ["HF_TOKEN", "WANDB_API_KEY"],
            "Secrets spark-container passes in, by variable name: from the caller's environment, "
            "else from ~/.config/sparkrig/secrets/NAME (the caller's, mode 0600). Each is mounted "
            "read-only as a 0600 file and exported inside the container only, never given as --env"
            " (docker inspect would show it).",
            secrets_check),
    Setting("ngc_jupyter", False, "Run JupyterLab as sparkrig-jupyter.service: the image's Jupyter"
                                  " and Python, on the host network bound to 127.0.0.1 only (reach"
                                  " it with `ssh -L 8888:127.0.0.1:8888`), its token in "
                                  "/var/lib/sparkrig/jupyter/token (mode 0600), Restart=always.", boolean),
    Setting("ngc_jupyter_user", "", "The user Jupyter runs as: one of ngc_users; owns the token "
                                    "file. Required when ngc_jupyter.",
            jupyter_user_check),
    Setting("ngc_jupyter_dir", "", 'The directory Jupyter serves (mounted as the project). "": the'
                                   " user's home.", optional_absolute_path),
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


# Rendering -----------------------------------------------------------------


def run_image(data: Any) -> str:
    """The image spark-container runs: the built one, or the pinned base."""
    return data.ngc_image if data.ngc_build != "none" else data.ngc_base_image


def render_dockerfile(data: Any, torch_cuda_arch_list: str) -> str | None:
    """The Dockerfile of ``ngc_build``, ``None`` for 'none'."""
    if data.ngc_build == "none":
        return None
    return atomic.render(
        f"ngc/{data.ngc_build}.Dockerfile.j2",
        base_image=data.ngc_base_image,
        packages=" ".join(data.ngc_pip_packages),
        torch_cuda_arch_list=torch_cuda_arch_list,
        triton_commit=TRITON_COMMIT,
        xformers_version=XFORMERS_VERSION,
        unsloth_packages=" ".join(data.ngc_unsloth_packages),
    )


def recipe(dockerfile: str) -> str:
    return hashlib.sha256(dockerfile.encode()).hexdigest()


def render_launcher(data: Any) -> str:
    q = atomic.quote_literal
    return atomic.render(
        "ngc/spark-container.sh.j2",
        image=q(run_image(data)),
        memlock="--ulimit memlock=-1" if data.ngc_memlock_unlimited else "",
        project_mount=q(data.ngc_project_mount),
        hf_cache=q(data.jobs_model_cache or data.ngc_hf_cache),
        home_mounts=" ".join(q(m) for m in data.ngc_home_mounts),
        job_env=" ".join(q(f"{k}={v}") for k, v in sorted(data.jobs_env.items())),
        spark_run=q(SPARK_RUN),
        launcher=q(LAUNCHER),
        job_prefix=q(JOB_UNIT_PREFIX),
        outputs=q(data.ngc_outputs) if data.ngc_outputs else "",
        cuda_env_file=q(data.cuda_env_file),
        users=" ".join(data.ngc_users),
        secrets=" ".join(data.ngc_secrets),
    )


def jupyter_command(command: str, port: int, project_mount: str) -> str:
    return command.replace("{port}", str(port)).replace("{project}", project_mount)


def render_jupyter_unit(data: Any, directory: str) -> str:
    return atomic.render(
        "ngc/jupyter.service.j2",
        description=JUPYTER_DESCRIPTION,
        server_note=f"The notebook server: ngc_jupyter_command ({data.ngc_jupyter_command.split()[0]}).",
        user=data.ngc_jupyter_user,
        directory=directory,
        container=JUPYTER_CONTAINER,
        token_file=TOKEN_FILE,
        command=jupyter_command(data.ngc_jupyter_command, data.ngc_jupyter_port, data.ngc_project_mount),
    )


JUPYTER_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Service", "Install"],
    {
        "Description": re.escape(JUPYTER_DESCRIPTION),
        "After": "docker.service network-online.target",
        "Requires": "docker.service",
        "User": USER_NAME.pattern,
        "WorkingDirectory": "/[A-Za-z0-9._/-]*",
        "ExecStartPre": f"-/usr/bin/docker rm --force {JUPYTER_CONTAINER}",
        "ExecStart": (
            f"{LAUNCHER} --name {JUPYTER_CONTAINER} --network host --secret JUPYTER_TOKEN={TOKEN_FILE} -- "
            f"({_WORD}+ )*{_WORD}*127\\.0\\.0\\.1{_WORD}*( {_WORD}+)*"
        ),
        "ExecStop": f"/usr/bin/docker stop --time 20 {JUPYTER_CONTAINER}",
        "Restart": "always",
        "RestartSec": "[0-9]+",
        "WantedBy": "multi-user.target",
    },
)


# Facts ---------------------------------------------------------------------


class NgcHost(FactBase):
    """
    Returns, in one command, what the NGC concern decides from: whether Docker's CLI
    is there, the pinned image's ID (``None``: not present at that digest), the built
    image's ID and recipe label, a user's ``uid:gid`` and home, whether a directory
    exists, and the Jupyter token file's owner, mode and size (``None``: no file).

    .. code:: python

        {"docker": True, "pinned": "sha256:f93e…", "built": {"id": "sha256:1c2d…",
         "recipe": "9f86…"}, "user": {"uid": 1000, "gid": 1000, "home": "/home/spark"},
         "directory": True, "token": {"user": "spark", "mode": 0o600, "size": 64}}
    """

    def command(self, pinned: str = "", built: str = "", user: str = "", directory: str = "",
                token: str = TOKEN_FILE) -> StringCommand:
        bits: list = ["command -v docker >/dev/null && echo docker=1;"]
        if pinned:
            bits += ["docker image inspect --format", QuoteString("pinned={{.Id}}"), QuoteString(pinned),
                     "2>/dev/null;"]
        if built:
            label = '{{index .Config.Labels "' + RECIPE_LABEL + '"}}'
            bits += ["docker image inspect --format", QuoteString(f"built={{{{.Id}}}} {label}"),
                     QuoteString(built), "2>/dev/null;"]
        if user:
            bits += ["echo user=$(getent passwd", QuoteString(user), "| cut -d: -f3,4,6);"]
        if directory:
            bits += ["[ -d", QuoteString(directory), "] && echo directory=1;"]
        bits += ["[ -f", QuoteString(token), "] && echo token=$(stat -c '%U %a %s'", QuoteString(token), ");",
                 "true"]
        return StringCommand(*bits)

    @atomic.parses
    def process(self, output: list[str]):
        values = {}
        for line in output:
            key, _, value = line.partition("=")
            values[key] = value.strip()
        built = values.get("built", "").split()
        user = values.get("user", "").split(":")
        token = values.get("token", "").split()
        return {
            "docker": values.get("docker") == "1",
            "pinned": values.get("pinned") or None,
            "built": {"id": built[0], "recipe": built[1] if len(built) > 1 else ""} if built else None,
            "user": {"uid": int(user[0]), "gid": int(user[1]), "home": user[2]} if len(user) == 3 else None,
            "directory": values.get("directory") == "1",
            "token": {"user": token[0], "mode": int(token[1], 8), "size": int(token[2])} if len(token) == 3
            else None,
        }


# Operations ----------------------------------------------------------------


@operation()
def image_pulled(image: str):
    """
    Pull an image by its digest unless Docker already has it at that digest.

    + image: a reference pinned by digest (``name[:tag]@sha256:…``)

    **Example:**

    .. code:: python

        ngc.image_pulled(image="nvcr.io/nvidia/pytorch:25.09-py3@sha256:…")
    """
    found = host.get_fact(NgcHost, pinned=image)
    if not found["docker"]:
        yield atomic.refuse("ngc_enabled needs Docker (the containers concern): there is no docker command")
        return
    if found["pinned"]:
        host.noop(f"{image} is present")
        return
    atomic.detail(f"pulling {image}")
    yield StringCommand("docker", "pull", "--quiet", QuoteString(image))


@operation()
def image_built(tag: str, dockerfile: str, recipe: str, context: str = BUILD_DIR):
    """
    Build an image from a Dockerfile on the host unless ``tag`` already carries its recipe.

    + tag: the image's name
    + dockerfile: the Dockerfile's path on the host
    + recipe: the recipe label (the Dockerfile's sha256); an image labelled so is current
    + context: the build context directory

    The build runs as the transient unit ``sparkrig-ngc-build``, so a dropped SSH
    session does not stop it.

    **Example:**

    .. code:: python

        ngc.image_built(tag="sparkrig/ngc:local", dockerfile="/etc/sparkrig/ngc/Dockerfile",
                        recipe="9f86d08…")
    """
    built = host.get_fact(NgcHost, built=tag)["built"]
    if built and built["recipe"] == recipe:
        host.noop(f"{tag} is built from this recipe")
        return
    atomic.detail(f"building {tag} from {dockerfile}")
    yield StringCommand(
        "systemd-run", "--quiet", "--wait", "--collect", "--pipe", f"--unit={BUILD_UNIT}", "--",
        "docker", "build", "--label", QuoteString(f"{RECIPE_LABEL}={recipe}"), "--tag", QuoteString(tag),
        "--file", QuoteString(dockerfile), QuoteString(context),
    )


# An existing token is kept (not rotated); a new one is 32 random bytes in hex. The directory
# is made by root in root's /var/lib/sparkrig; what is inside it is written by its owner
# (runuser), so root never follows a link the owner planted there.
# $1 directory, $2 token file, $3 owner.
TOKEN_SCRIPT = (
    'install -d -m 700 -o "$3" -g "$(id -gn "$3")" "$1" && runuser -u "$3" -- sh -c '
    '\'[ -s "$1" ] && [ ! -L "$1" ] || { rm -f "$1" && (umask 077; od -An -N32 -tx1 /dev/urandom '
    '| tr -d " \\n" > "$1.new") && mv -f "$1.new" "$1"; } && chmod 600 "$1"\' token "$2"'
)


@operation()
def jupyter_token(path: str, user: str):
    """
    Generate Jupyter's token on the host, a 0600 file of ``user`` (an existing token is kept).

    + path: the token file; its directory becomes ``user``'s, mode 0700
    + user: who owns the token (Jupyter runs as this user)

    **Example:**

    .. code:: python

        ngc.jupyter_token(path="/var/lib/sparkrig/jupyter/token", user="spark")
    """
    token = host.get_fact(NgcHost, token=path)["token"]
    if token and token["user"] == user and token["mode"] == 0o600 and token["size"] > 0:
        host.noop(f"{path} is {user}'s, mode 0600")
        return
    directory = path.rsplit("/", 1)[0]
    yield StringCommand("sh", "-c", QuoteString(TOKEN_SCRIPT), "jupyter-token",
                        QuoteString(directory), QuoteString(path), QuoteString(user))


# The deploy ----------------------------------------------------------------


def parts(settings: Mapping[str, Any]) -> tuple[reading.Part, reading.Part]:
    """The host's images, Jupyter user and token (:class:`NgcHost`), and the concern's
    files and unit (:class:`atomic.HostState`), as these settings need them."""
    build = settings["ngc_build"] != "none"
    jupyter = settings["ngc_jupyter"]
    found = reading.part(
        NgcHost,
        pinned=settings["ngc_base_image"],
        built=settings["ngc_image"] if build else "",
        user=settings["ngc_jupyter_user"] if jupyter else "",
        directory=settings["ngc_jupyter_dir"] if jupyter else "",
    )
    paths = [LAUNCHER, *([DOCKERFILE] if build else []), JUPYTER_UNIT_FILE]
    return found, reading.part(atomic.HostState, paths=paths, units=(JUPYTER_UNIT,))


@reading.planner
def reads(settings):
    return list(parts(settings)) if settings["ngc_enabled"] else []


@deploy(
    "NGC training containers",
    data_defaults=ALL_DEFAULTS,
)
def ngc():
    """
    Pull (or build) the pinned NGC image, install spark-container, and run JupyterLab
    on 127.0.0.1 when asked.

    Settings: ``ngc_*``, ``cuda_env_file`` (its portable variables are passed into
    containers) and the hardware profile's ``compute_capability`` (the Unsloth build's
    TORCH_CUDA_ARCH_LIST, as seed 000 builds xformers); see docs/settings.md.
    """
    data = host.data
    if not data.ngc_enabled:
        return
    profile = data.hardware_profiles[data.hardware_profile]
    # Seed 000 builds xformers for the GPU's own capability ("12.1" on GB10).
    dockerfile = render_dockerfile(data, profile["compute_capability"])
    launcher = render_launcher(data)
    jupyter = data.ngc_jupyter
    found_part, state_part = parts({s.key: getattr(data, s.key) for s in SETTINGS})
    found = reading.value(found_part)
    if atomic.fact_failed():  # unreadable: pyinfra has failed this host and said why
        return
    # No docker yet on a fresh host: the containers concern installs it in this run, and
    # image_pulled checks again (and fails the host if there is still none) when it runs.
    state = reading.value(state_part)
    image_ops = []

    if not found["pinned"]:
        image_ops.append(image_pulled(name="Pull the pinned base image (ngc_base_image)",
                                      image=data.ngc_base_image))
    if dockerfile:
        if not atomic.up_to_date(state["files"].get(DOCKERFILE), dockerfile):
            atomic.file(name=f"Dockerfile of the ngc_build image ({DOCKERFILE})",
                        dest=DOCKERFILE, content=dockerfile, mode=0o644,
                        current=state["files"].get(DOCKERFILE))
        built = found["built"]
        if not built or built["recipe"] != recipe(dockerfile):
            image_ops.append(image_built(
                name="Build ngc_image (ngc_build) on the pinned base",
                tag=data.ngc_image, dockerfile=DOCKERFILE, recipe=recipe(dockerfile),
            ))

    launcher_op = None
    if not atomic.up_to_date(state["files"].get(LAUNCHER), launcher, mode=0o755):
        launcher_op = atomic.file(name=f"spark-container command ({LAUNCHER})", dest=LAUNCHER,
                                  current=state["files"].get(LAUNCHER),
                                  content=launcher, mode=0o755, validate=("bash", "-n"))

    unit = state["units"].get(JUPYTER_UNIT) or {}
    if not jupyter:
        if unit.get("active") == "active" or unit.get("enabled") == "enabled":
            systemd.service(name=f"{JUPYTER_UNIT} is off (ngc_jupyter is False)", service=JUPYTER_UNIT,
                            running=False, enabled=False)
        return
    user = found["user"]
    if user is None:
        atomic.refused(name="The Jupyter user exists",
                       message=f"ngc_jupyter_user {data.ngc_jupyter_user!r} has no account on this host")
        return
    directory = data.ngc_jupyter_dir or user["home"]
    if data.ngc_jupyter_dir and not found["directory"]:
        files.directory(name="Jupyter's directory (ngc_jupyter_dir)", path=directory,
                        user=str(user["uid"]), group=str(user["gid"]), mode="750")
    token = found["token"]
    token_op = None
    if not (token and token["user"] == data.ngc_jupyter_user and token["mode"] == 0o600 and token["size"]):
        token_op = jupyter_token(name=f"Jupyter's token ({TOKEN_FILE}, 0600)", path=TOKEN_FILE,
                                 user=data.ngc_jupyter_user)
    unit_op = atomic.unit_file(
        name=f"Jupyter's unit ({JUPYTER_UNIT_FILE})",
        dest=JUPYTER_UNIT_FILE,
        content=render_jupyter_unit(data, directory),
        validate=JUPYTER_VALIDATOR,
        reload_name=f"Reload systemd: {JUPYTER_UNIT} changed",
        state=state["files"].get(JUPYTER_UNIT_FILE),
    )
    if unit.get("active") != "active" or unit.get("enabled") != "enabled":
        systemd.service(name=f"{JUPYTER_UNIT} is enabled and running", service=JUPYTER_UNIT,
                        running=True, enabled=True)
        return
    changed = [op for op in (unit_op, token_op, launcher_op, *image_ops) if op is not None]
    if changed:
        systemd.service(name=f"Restart {JUPYTER_UNIT}: its unit, token, launcher or image changed",
                        service=JUPYTER_UNIT, running=True, restarted=True, _if=any_changed(*changed))
