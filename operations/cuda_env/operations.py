"""CUDA environment: CUDA_HOME chosen from the host's toolkits, the env file and the login shells' script."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkrig import rendering, stack_locks

from .facts import toolkit_version
from .settings import MANAGED

PROFILE_SCRIPT = "/etc/profile.d/sparkrig-cuda.sh"
# systemd's default PATH: what a unit would have had without the env file.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def resolve_cuda_home(toolkits: Mapping[str, Any], default: str) -> str:
    """The link's target, else the newest versioned toolkit, else ``default``."""
    if toolkits.get("link"):
        return toolkits["link"]
    versioned = [p for p in toolkits.get("toolkits", []) if toolkit_version(p) >= (0, 0)]
    if versioned:
        return max(versioned, key=toolkit_version)
    return default


def env_variables(
    cuda_home: str, torch_cuda_arch_list: str, extra: Mapping[str, str], venv: str = stack_locks.VENV_PATH
) -> list[tuple[str, str]]:
    """The env file's variables, managed ones first in a fixed order, then extras sorted."""
    managed = {
        "CUDA_HOME": cuda_home,
        "PATH": f"{cuda_home}/bin:{BASE_PATH}",
        "LD_LIBRARY_PATH": f"{cuda_home}/lib64",
        "TORCH_CUDA_ARCH_LIST": torch_cuda_arch_list,
        "TRITON_PTXAS_PATH": f"{cuda_home}/bin/ptxas",
        "TRITON_PTXAS_BLACKWELL_PATH": f"{cuda_home}/bin/ptxas",
        "UV_NO_SYNC": "1",
        "UV_PROJECT_ENVIRONMENT": venv,
    }
    return [(name, managed[name]) for name in MANAGED] + sorted(extra.items())


def render_env_file(variables: list[tuple[str, str]]) -> str:
    return rendering.render(
        "cuda_env/cuda.env.j2",
        lines=[f"{name}={rendering.quote_literal(value)}" for name, value in variables],
    )


def render_profile_script(env_file: str) -> str:
    return rendering.render("cuda_env/profile.sh.j2", env_file=env_file)
