"""
CUDA environment: one KEY=VALUE file that login shells and systemd units both read.

``cuda_env_file`` (default ``/etc/sparkrig/cuda.env``) is the single source of
truth. ``/etc/profile.d/sparkrig-cuda.sh`` exports it into login shells, keeping
what PATH and LD_LIBRARY_PATH already held after the file's entries; systemd
units read the same file with ``EnvironmentFile=``. ``CUDA_HOME`` is read from
the host: the target of ``/usr/local/cuda`` (followed through every link),
else the newest ``/usr/local/cuda-X.Y``, else ``cuda_env_default_home``.

The file also makes ``uv run`` in a user's project use the managed venv
(``UV_PROJECT_ENVIRONMENT``, the venv's path) as it is (``UV_NO_SYNC=1``: no lock,
no sync, nothing the deploy installed is replaced), and names the shared model
cache (``jobs_model_cache``) as ``HF_HOME``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, deploy

from sparkrig import atomic, reading
from sparkrig.profile import host_profile
from sparkrig.settings import ALL_DEFAULTS

from .settings import MANAGED, SETTINGS, _extra_check  # noqa: F401 (re-exported)

PROFILE_SCRIPT = "/etc/profile.d/sparkrig-cuda.sh"
CUDA_LINK = "/usr/local/cuda"
# systemd's default PATH: what a unit would have had without the env file.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TOOLKIT = re.compile(r"/cuda-(\d+)(?:\.(\d+))?\Z")






class CudaToolkits(FactBase):
    """
    Returns where ``/usr/local/cuda`` leads (every link followed; ``None`` when it is
    missing or dangling) and the ``/usr/local/cuda-*`` toolkit directories.

    .. code:: python

        {"link": "/usr/local/cuda-13.0", "toolkits": ["/usr/local/cuda-12.8", "/usr/local/cuda-13.0"]}
    """

    def command(self) -> str:
        return (
            f"if [ -e {CUDA_LINK} ]; then echo link $(readlink -f {CUDA_LINK}); fi; "
            f"for d in {CUDA_LINK}-*/; do [ -d \"$d\" ] && echo toolkit \"${{d%/}}\"; done; true"
        )

    @atomic.parses
    def process(self, output: list[str]) -> dict:
        link, toolkits = None, []
        for line in output:
            kind, _, path = line.partition(" ")
            if kind == "link" and path:
                link = path
            elif kind == "toolkit" and path:
                toolkits.append(path)
        return {"link": link, "toolkits": sorted(toolkits, key=toolkit_version)}

    @staticmethod
    def default() -> dict:
        return {"link": None, "toolkits": []}


def toolkit_version(path: str) -> tuple[int, int]:
    """(major, minor) of a ``/usr/local/cuda-X.Y`` path, minor -1 for ``cuda-X``
    (Ubuntu's per-major alternative); (-1, -1) when the name holds no version."""
    match = _TOOLKIT.search(path)
    if not match:
        return (-1, -1)
    return (int(match[1]), int(match[2]) if match[2] else -1)


def resolve_cuda_home(toolkits: Mapping[str, Any], default: str) -> str:
    """The link's target, else the newest versioned toolkit, else ``default``."""
    if toolkits.get("link"):
        return toolkits["link"]
    versioned = [p for p in toolkits.get("toolkits", []) if toolkit_version(p) >= (0, 0)]
    if versioned:
        return max(versioned, key=toolkit_version)
    return default


def env_variables(
    cuda_home: str, torch_cuda_arch_list: str, extra: Mapping[str, str], venv: str = "/opt/sparkrig/venv"
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
    return atomic.render(
        "cuda_env/cuda.env.j2",
        lines=[f"{name}={atomic.quote_literal(value)}" for name, value in variables],
    )


def render_profile_script(env_file: str) -> str:
    return atomic.render("cuda_env/profile.sh.j2", env_file=env_file)


# What the concern decides from, in the host's one reading.
TOOLKITS = reading.part(CudaToolkits)


def files_part(env_file: str) -> reading.Part:
    return reading.part(atomic.HostState, paths=(env_file, PROFILE_SCRIPT))


@reading.planner
def reads(settings):
    return [TOOLKITS, files_part(settings["cuda_env_file"])]


@deploy("CUDA environment", data_defaults=ALL_DEFAULTS)
def cuda_env():
    """
    Write the CUDA env file and make login shells read it.

    Settings: ``cuda_env_file``, ``cuda_env_default_home``, ``cuda_env_extra``,
    ``hardware_profile`` (for ``TORCH_CUDA_ARCH_LIST``), ``python_venv_path`` (for
    ``UV_PROJECT_ENVIRONMENT``); see docs/settings.md.
    """
    cuda_home = resolve_cuda_home(reading.value(TOOLKITS), host.data.cuda_env_default_home)
    profile = host_profile()
    venv = host.data.python_venv_path
    extra = dict(host.data.cuda_env_extra)
    if host.data.jobs_model_cache:  # the shared model cache (jobs_model_cache) is every user's HF_HOME
        extra["HF_HOME"] = host.data.jobs_model_cache
    variables = env_variables(cuda_home, profile["torch_cuda_arch_list"], extra, venv)

    files = {
        host.data.cuda_env_file: ("CUDA env file (cuda_env_file)", render_env_file(variables)),
        PROFILE_SCRIPT: (
            f"Login shells read the CUDA env file ({PROFILE_SCRIPT})",
            render_profile_script(host.data.cuda_env_file),
        ),
    }
    state = reading.value(files_part(host.data.cuda_env_file))["files"]
    # host.loop: each file keeps its place (and its row in pyinfra's table) on every host.
    for dest, (name, content) in host.loop(files.items()):
        if not atomic.up_to_date(state.get(dest), content):
            atomic.file(name=name, dest=dest, content=content, mode=0o644, validate=("sh", "-n"),
                        current=state.get(dest))
