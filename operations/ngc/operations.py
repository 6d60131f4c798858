"""NGC training containers: the Dockerfile, the launcher and Jupyter's unit as rendered, and the
operations that pull or build the image and make Jupyter's token."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import atomic, messages, rendering
from sparkrig.settings import USER_NAME
from sparkrig.units import JOB_DRAIN, JOB_UNIT_PREFIX, SPARK_RUN

from .facts import RECIPE_LABEL, TOKEN_FILE, NgcHost

# Words systemd and the container pass on as they are: no quotes, blanks inside a word or '$'.
_WORD = "[A-Za-z0-9._/:=@,+-]"
LAUNCHER = "/usr/local/bin/spark-container"
BUILD_DIR = "/etc/sparkrig/ngc"
DOCKERFILE = f"{BUILD_DIR}/Dockerfile"
BUILD_UNIT = "sparkrig-ngc-build"
JUPYTER_UNIT = "sparkrig-jupyter.service"
JUPYTER_UNIT_FILE = f"/etc/systemd/system/{JUPYTER_UNIT}"
JUPYTER_CONTAINER = "sparkrig-jupyter"
JUPYTER_DESCRIPTION = "JupyterLab in the NGC container (sparkrig)"
# Unsloth's DGX Spark recipe, its pins checked on a Spark.
TRITON_COMMIT = "c5d671f91d90f40900027382f98b17a3e04045f6"
XFORMERS_VERSION = "v0.0.33"


def run_image(data: Any) -> str:
    """The image spark-container runs: the built one, or the pinned base."""
    return data.ngc_image if data.ngc_build != "none" else data.ngc_base_image


def render_dockerfile(data: Any, torch_cuda_arch_list: str) -> str | None:
    """The Dockerfile of ``ngc_build``, ``None`` for 'none'."""
    if data.ngc_build == "none":
        return None
    return rendering.render(
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


def render_launcher(data: Any, drain: str = JOB_DRAIN) -> str:
    q = rendering.quote_literal
    return rendering.render(
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
        drain=q(drain),
        outputs=q(data.ngc_outputs) if data.ngc_outputs else "",
        cuda_env_file=q(data.cuda_env_file),
        users=" ".join(data.ngc_users),
        secrets=" ".join(data.ngc_secrets),
    )


def jupyter_command(command: str, port: int, project_mount: str) -> str:
    return command.replace("{port}", str(port)).replace("{project}", project_mount)


def render_jupyter_unit(data: Any, directory: str) -> str:
    return rendering.render(
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
        yield messages.refuse("ngc_enabled needs Docker (the containers concern): there is no docker command")
        return
    if found["pinned"]:
        host.noop(f"{image} is present")
        return
    messages.detail(f"pulling {image}")
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
    messages.detail(f"building {tag} from {dockerfile}")
    yield StringCommand(
        "systemd-run",
        "--quiet",
        "--wait",
        "--collect",
        "--pipe",
        f"--unit={BUILD_UNIT}",
        "--",
        "docker",
        "build",
        "--label",
        QuoteString(f"{RECIPE_LABEL}={recipe}"),
        "--tag",
        QuoteString(tag),
        "--file",
        QuoteString(dockerfile),
        QuoteString(context),
    )


# An existing token is kept, a new one written by its owner: see the script.
TOKEN_SCRIPT = rendering.script("ngc/jupyter-token.sh")


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
    yield StringCommand(
        "sh",
        "-c",
        QuoteString(TOKEN_SCRIPT),
        "jupyter-token",
        QuoteString(directory),
        QuoteString(path),
        QuoteString(user),
    )
