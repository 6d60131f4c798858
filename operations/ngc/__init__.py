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

from sparkrig import atomic, reading
from sparkrig.settings import (
    ALL_DEFAULTS,
    USER_NAME,
)
from sparkrig.units import JOB_UNIT_PREFIX, SPARK_RUN

from .settings import (  # noqa: F401 (re-exported)
    _COMMAND_WORD,
    _HOME_PATH,
    _MOUNT_POINT,
    _REQUIREMENT,
    BUILDS,
    JUPYTER_COMMAND,
    SETTINGS,
    UNSLOTH_PACKAGES,
    home_mounts_check,
    home_path_check,
    jupyter_command_check,
    jupyter_user_check,
    launch_users_check,
    local_image_check,
    mount_point_check,
    optional_absolute_path,
    optional_home_path_check,
    pinned_image_check,
    requirements_check,
    secrets_check,
)

# Words systemd and the container pass on as they are: no quotes, blanks inside a word or '$'.
_WORD = "[A-Za-z0-9._/:=@,+-]"


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


# Settings ------------------------------------------------------------------



























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
