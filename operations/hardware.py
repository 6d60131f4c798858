"""
Hardware profiles: what each kind of box is, as data.

A profile names the CPU architecture, the GPU's compute capability and the
``TORCH_CUDA_ARCH_LIST`` that builds for it. Hosts pick one with
``hardware_profile``; the table itself is a setting, so a fleet can add its own
kind of box without touching code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .settings import Setting, one_of_keys

ARCHES = ("aarch64", "x86_64")
PROFILE_FIELDS = ("arch", "compute_capability", "torch_cuda_arch_list")
_CAPABILITY = re.compile(r"^\d+\.\d+$")
_ARCH_LIST = re.compile(r"^\d+\.\d+[af]?(\+PTX)?([ ;]\d+\.\d+[af]?(\+PTX)?)*$")

DEFAULT_PROFILES = {
    # DGX Spark / GB10: Grace CPU, Blackwell GPU sm_121 (12.1a enables its arch-specific features).
    "gb10": {"arch": "aarch64", "compute_capability": "12.1", "torch_cuda_arch_list": "12.1a"},
    # RTX 50xx workstations (seed 004's 5070 Ti): x86_64, sm_120.
    "rtx50": {"arch": "x86_64", "compute_capability": "12.0", "torch_cuda_arch_list": "12.0"},
    # Hopper H100/H200 boxes, as on the lent test machine: x86_64, sm_90.
    "hopper": {"arch": "x86_64", "compute_capability": "9.0", "torch_cuda_arch_list": "9.0"},
}


def profiles_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        "a mapping of profile names to {arch: aarch64|x86_64, compute_capability: 'MAJOR.MINOR', "
        "torch_cuda_arch_list: e.g. '12.1a' or '9.0;12.0+PTX'}"
    )
    if not isinstance(value, Mapping) or not value:
        return allowed
    for name, profile in value.items():
        ok = (
            isinstance(name, str)
            and isinstance(profile, Mapping)
            and set(profile) == set(PROFILE_FIELDS)
            and profile["arch"] in ARCHES
            and isinstance(profile["compute_capability"], str)
            and _CAPABILITY.match(profile["compute_capability"])
            and isinstance(profile["torch_cuda_arch_list"], str)
            and _ARCH_LIST.match(profile["torch_cuda_arch_list"])
        )
        if not ok:
            return f"{allowed} (bad profile: {name!r})"
    return None


SETTINGS = (
    Setting(
        "hardware_profile",
        "gb10",
        "Which profile of hardware_profiles describes the host.",
        one_of_keys("hardware_profiles"),
    ),
    Setting(
        "hardware_profiles",
        DEFAULT_PROFILES,
        "The known kinds of box: CPU architecture, GPU compute capability, TORCH_CUDA_ARCH_LIST.",
        profiles_check,
    ),
)
