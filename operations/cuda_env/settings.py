"""CUDA environment: one KEY=VALUE file that login shells and systemd units both read:
the settings, declared once, and their checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkrig import stack_locks
from sparkrig.operations.hardware import settings as hardware_settings
from sparkrig.operations.jobs import settings as jobs_settings
from sparkrig.settings import Setting, absolute_path, declare, defaults, env_mapping_except

MANAGED = (
    "CUDA_HOME",
    "PATH",
    "LD_LIBRARY_PATH",
    "TORCH_CUDA_ARCH_LIST",
    "TRITON_PTXAS_PATH",
    "TRITON_PTXAS_BLACKWELL_PATH",
    "UV_NO_SYNC",
    "UV_PROJECT_ENVIRONMENT",
)


def _extra_check(value: Any, data: Mapping[str, Any]) -> str | None:
    allowed = env_mapping_except(MANAGED)(value, data)
    if allowed:
        return allowed
    if "HF_HOME" in value and data.get("jobs_model_cache"):  # jobs' setting
        return "variables other than HF_HOME while jobs_model_cache is set (it is HF_HOME)"
    return None


SETTINGS = (
    Setting(
        "cuda_env_file",
        "/etc/sparkrig/cuda.env",
        "The single KEY=VALUE file holding CUDA_HOME, PATH, LD_LIBRARY_PATH, TORCH_CUDA_ARCH_LIST,"
        " TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH and UV_NO_SYNC=1 and "
        "UV_PROJECT_ENVIRONMENT (python_venv_path: `uv run` in a project uses the managed venv as "
        "it is). Login shells read it through /etc/profile.d/sparkrig-cuda.sh; systemd units read "
        "it with EnvironmentFile=. HF_HOME too when jobs_model_cache is set.",
        absolute_path,
    ),
    Setting(
        "cuda_env_default_home",
        "/usr/local/cuda",
        "CUDA_HOME when the host has no /usr/local/cuda link and no /usr/local/cuda-X.Y directory "
        "(the link's target, else the newest X.Y, wins when present).",
        absolute_path,
    ),
    Setting(
        "cuda_env_extra",
        {},
        'Extra variables for the same file, e.g. {"HF_HOME": "/data/hf"}. Names must be valid '
        "variable names other than the managed ones above; values are literal strings without "
        "single quotes or newlines.",
        _extra_check,
    ),
)


declare(__name__, SETTINGS)

# The deploy's data_defaults: its own settings, the hardware profile (TORCH_CUDA_ARCH_LIST),
# jobs_model_cache (HF_HOME) and python_stack's python_venv_path (UV_PROJECT_ENVIRONMENT).
DEFAULTS = defaults((*SETTINGS, *hardware_settings.SETTINGS, *jobs_settings.SETTINGS, *stack_locks.SETTINGS))
