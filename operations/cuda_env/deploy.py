"""CUDA environment: the host's one reading and the deploy."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from sparkrig import atomic, host_settings, reading

from .facts import CudaToolkits
from .operations import PROFILE_SCRIPT, env_variables, render_env_file, render_profile_script, resolve_cuda_home
from .settings import DEFAULTS

# What the concern decides from, in the host's one reading.
TOOLKITS = reading.part(CudaToolkits)


def files_part(env_file: str) -> reading.Part:
    return reading.part(atomic.HostState, paths=(env_file, PROFILE_SCRIPT))


@reading.planner
def reads(settings):
    return [TOOLKITS, files_part(settings["cuda_env_file"])]


@deploy("CUDA environment", data_defaults=DEFAULTS)
def cuda_env():
    """
    Write the CUDA env file and make login shells read it.

    Settings: ``cuda_env_file``, ``cuda_env_default_home``, ``cuda_env_extra``,
    ``hardware_profile`` (for ``TORCH_CUDA_ARCH_LIST``), ``python_venv_path`` (for
    ``UV_PROJECT_ENVIRONMENT``); see docs/settings.md.
    """
    settings = host_settings.current()
    profile = host_settings.profile_or_refuse(settings, "cuda_env")
    if profile is None:
        return
    cuda_home = resolve_cuda_home(reading.value(TOOLKITS), settings.cuda_env_default_home)
    venv = settings.python_venv_path  # python_stack's setting
    extra = dict(settings.cuda_env_extra)
    if settings.jobs_model_cache:  # the shared model cache (jobs_model_cache) is every user's HF_HOME
        extra["HF_HOME"] = settings.jobs_model_cache
    variables = env_variables(cuda_home, profile["torch_cuda_arch_list"], extra, venv)

    files = {
        settings.cuda_env_file: ("CUDA env file (cuda_env_file)", render_env_file(variables)),
        PROFILE_SCRIPT: (
            f"Login shells read the CUDA env file ({PROFILE_SCRIPT})",
            render_profile_script(settings.cuda_env_file),
        ),
    }
    state = reading.value(files_part(settings.cuda_env_file))["files"]
    # host.loop: each file keeps its place (and its row in pyinfra's table) on every host.
    for dest, (name, content) in host.loop(files.items()):
        atomic.file_if_changed(name=name, dest=dest, content=content, validate=("sh", "-n"), current=state.get(dest))
