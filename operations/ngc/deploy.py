"""NGC training containers: the host's one reading and the deploy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra.api import deploy
from pyinfra.operations import files

from sparkrig import atomic, host_output, host_settings, messages, reading, service

from .facts import TOKEN_FILE, NgcHost
from .operations import (
    DOCKERFILE,
    JUPYTER_UNIT,
    JUPYTER_UNIT_FILE,
    JUPYTER_VALIDATOR,
    LAUNCHER,
    image_built,
    image_pulled,
    jupyter_token,
    recipe,
    render_dockerfile,
    render_jupyter_unit,
    render_launcher,
)
from .settings import DEFAULTS


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
    data_defaults=DEFAULTS,
)
def ngc():
    """
    Pull (or build) the pinned NGC image, install spark-container, and run JupyterLab
    on 127.0.0.1 when asked.

    Settings: ``ngc_*``, ``cuda_env_file`` (its portable variables are passed into
    containers) and the hardware profile's ``compute_capability`` (the Unsloth build's
    TORCH_CUDA_ARCH_LIST, as the Unsloth-on-Spark recipe builds xformers); see docs/settings.md.
    """
    data = host_settings.current()
    if not data.ngc_enabled:
        return
    profile = host_settings.profile_or_refuse(data, "ngc")
    if profile is None:
        return
    # The Unsloth-on-Spark recipe builds xformers for the GPU's own capability ("12.1" on GB10).
    dockerfile = render_dockerfile(data, profile["compute_capability"])
    launcher = render_launcher(data)
    jupyter = data.ngc_jupyter
    found_part, state_part = parts(data)
    found = reading.value(found_part)
    if host_output.fact_failed():  # unreadable: pyinfra has failed this host and said why
        return
    # No docker yet on a fresh host: the containers concern installs it in this run, and
    # image_pulled checks again (and fails the host if there is still none) when it runs.
    state = reading.value(state_part)
    image_ops = []

    if not found["pinned"]:
        image_ops.append(image_pulled(name="Pull the pinned base image (ngc_base_image)", image=data.ngc_base_image))
    if dockerfile:
        atomic.file_if_changed(
            name=f"Dockerfile of the ngc_build image ({DOCKERFILE})",
            dest=DOCKERFILE,
            content=dockerfile,
            current=state["files"].get(DOCKERFILE),
        )
        built = found["built"]
        if not built or built["recipe"] != recipe(dockerfile):
            image_ops.append(
                image_built(
                    name="Build ngc_image (ngc_build) on the pinned base",
                    tag=data.ngc_image,
                    dockerfile=DOCKERFILE,
                    recipe=recipe(dockerfile),
                )
            )

    launcher_op = atomic.file_if_changed(
        name=f"spark-container command ({LAUNCHER})",
        dest=LAUNCHER,
        current=state["files"].get(LAUNCHER),
        content=launcher,
        mode=0o755,
        validate=("bash", "-n"),
    )

    if not jupyter:
        service.stopped(JUPYTER_UNIT, state["units"], "ngc_jupyter is False")
        return
    user = found["user"]
    if user is None:
        messages.refused(
            name="The Jupyter user exists",
            message=f"ngc_jupyter_user {data.ngc_jupyter_user!r} has no account on this host",
        )
        return
    directory = data.ngc_jupyter_dir or user["home"]
    if data.ngc_jupyter_dir and not found["directory"]:
        files.directory(
            name="Jupyter's directory (ngc_jupyter_dir)",
            path=directory,
            user=str(user["uid"]),
            group=str(user["gid"]),
            mode="750",
        )
    token = found["token"]
    token_op = None
    if not (token and token["user"] == data.ngc_jupyter_user and token["mode"] == 0o600 and token["size"]):
        token_op = jupyter_token(
            name=f"Jupyter's token ({TOKEN_FILE}, 0600)", path=TOKEN_FILE, user=data.ngc_jupyter_user
        )
    unit_op = atomic.unit_file(
        name=f"Jupyter's unit ({JUPYTER_UNIT_FILE})",
        dest=JUPYTER_UNIT_FILE,
        content=render_jupyter_unit(data, directory),
        validate=JUPYTER_VALIDATOR,
        reload_name=f"Reload systemd: {JUPYTER_UNIT} changed",
        state=state["files"].get(JUPYTER_UNIT_FILE),
    )
    service.kept_running(
        JUPYTER_UNIT,
        state["units"],
        restart_on=[unit_op, token_op, launcher_op, *image_ops],
        why="its unit, token, launcher or image changed",
    )
