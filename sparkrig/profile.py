"""
The hardware profile of a host (a concern takes it from sparkrig.host_settings): what each
kind of box is (a profile: CPU architecture, the GPU's compute capability, the
``TORCH_CUDA_ARCH_LIST`` that builds for it), what the box says it is
(:class:`HardwareIdentity`, in the host's one reading), and for ``hardware_profile = "auto"``
the one profile that matches it (:func:`choose_profile`, which sparkrig.host_settings asks
once per host: the host's settings carry the resolved profile). operations/hardware/ checks
the box against its profile.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api import FactBase, StringCommand

from . import host_output, reading

ARCHES = ("aarch64", "x86_64")
PROFILE_FIELDS = ("arch", "compute_capability", "torch_cuda_arch_list")
# Optional: CmaTotal of /proc/meminfo, in KiB, as a healthy box of the profile shows it (the CMA
# control compares it where a profile says it).
OPTIONAL_FIELDS = ("cma_total_kib",)
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_CAPABILITY = re.compile(r"\d+\.\d+")
_ARCH_LIST = re.compile(r"\d+\.\d+[af]?(\+PTX)?([ ;]\d+\.\d+[af]?(\+PTX)?)*")

DEFAULT_PROFILES = {
    # DGX Spark / GB10: Grace CPU, Blackwell GPU sm_121 (12.1a enables its arch-specific features).
    "gb10": {"arch": "aarch64", "compute_capability": "12.1", "torch_cuda_arch_list": "12.1a"},
    # RTX 50xx workstations (a 5070 Ti, say): x86_64, sm_120.
    "rtx50": {"arch": "x86_64", "compute_capability": "12.0", "torch_cuda_arch_list": "12.0"},
    # Hopper H100/H200 boxes, as on the lent test machine: x86_64, sm_90.
    "hopper": {"arch": "x86_64", "compute_capability": "9.0", "torch_cuda_arch_list": "9.0"},
}


def profiles_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        "a mapping of profile names to {arch: aarch64|x86_64, compute_capability: 'MAJOR.MINOR', "
        "torch_cuda_arch_list: e.g. '12.1a' or '9.0;12.0+PTX', optionally cma_total_kib: CmaTotal "
        "of /proc/meminfo in KiB as a healthy box shows it}"
    )
    if not isinstance(value, Mapping) or not value:
        return allowed
    for name, profile in value.items():
        ok = (
            isinstance(name, str)
            and _PROFILE_NAME.fullmatch(name)
            and isinstance(profile, Mapping)
            and set(PROFILE_FIELDS) <= set(profile) <= {*PROFILE_FIELDS, *OPTIONAL_FIELDS}
            and (
                "cma_total_kib" not in profile
                or (type(profile["cma_total_kib"]) is int and 0 <= profile["cma_total_kib"] < 1 << 40)
            )
            and profile["arch"] in ARCHES
            and isinstance(profile["compute_capability"], str)
            and _CAPABILITY.fullmatch(profile["compute_capability"])
            and isinstance(profile["torch_cuda_arch_list"], str)
            and _ARCH_LIST.fullmatch(profile["torch_cuda_arch_list"])
        )
        if not ok:
            return f"{allowed} (bad profile: {name!r})"
    return None


AUTO = "auto"


def profile_name_check(value: Any, data: Mapping[str, Any]) -> str | None:
    table = data.get("hardware_profiles")
    # A bad table is reported by its own check; here it only offers no choices.
    choices = sorted(key for key in table if isinstance(key, str)) if isinstance(table, Mapping) else []
    if isinstance(value, str) and (value == AUTO or value in choices):
        return None
    return f"{AUTO!r} or one of the profiles in hardware_profiles: {', '.join(choices) or '(none defined)'}"


class HardwareIdentity(FactBase):
    """
    Returns what the box says it is: its CPU architecture and, where ``nvidia-smi``
    answers, each GPU's compute capability and name (an empty list without a GPU or driver).

    .. code:: python

        {"arch": "aarch64", "gpus": [{"compute_capability": "12.1", "name": "NVIDIA GB10"}]}
    """

    def command(self) -> StringCommand:
        return StringCommand(
            "uname -m; command -v nvidia-smi >/dev/null 2>&1 &&",
            "nvidia-smi --query-gpu=compute_cap,name --format=csv,noheader 2>/dev/null || true",
        )

    @staticmethod
    def default() -> dict[str, Any]:
        """A box that printed nothing: no architecture, which no profile matches."""
        return {"arch": "", "gpus": []}

    @host_output.parses
    def process(self, output: Sequence[str]) -> dict[str, Any]:
        lines = [line.strip() for line in output if line.strip()]
        gpus = []
        for line in lines[1:]:
            capability, _, name = (part.strip() for part in line.partition(","))
            if _CAPABILITY.fullmatch(capability):
                gpus.append({"compute_capability": capability, "name": name})
        return {"arch": lines[0] if lines else "", "gpus": gpus}


def describe(identity: Mapping[str, Any]) -> str:
    """The box in words: ``aarch64, GPU NVIDIA GB10 (12.1)`` or ``x86_64, no GPU visible``."""
    gpus = ", ".join(f"GPU {g['name']} ({g['compute_capability']})" for g in identity["gpus"])
    arch = identity["arch"] or "of no architecture (uname -m printed nothing)"
    return f"{arch}, {gpus or 'no GPU visible (no nvidia-smi, or no driver)'}"


def contradiction(name: str, profile: Mapping[str, Any], identity: Mapping[str, Any]) -> str | None:
    """Why the box is not what profile ``name`` says, or None. Without a visible GPU only
    the architecture can be checked."""
    wrong = []
    if identity["arch"] != profile["arch"]:
        wrong.append(f"architecture {profile['arch']}")
    capabilities = sorted({g["compute_capability"] for g in identity["gpus"]})
    if capabilities and capabilities != [profile["compute_capability"]]:
        wrong.append(f"compute capability {profile['compute_capability']}")
    if not wrong:
        return None
    return (
        f"hardware_profile {name!r} says {' and '.join(wrong)}, but the box is "
        f"{describe(identity)}: set hardware_profile for this host or its group "
        f'(or "auto"); nothing was changed on it'
    )


def choose_profile(
    profiles: Mapping[str, Mapping[str, Any]], identity: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """``hardware_profile = "auto"``: the one profile the box matches, as (name, None), or
    (None, why no single profile matches)."""
    matching = sorted(name for name, profile in profiles.items() if contradiction(name, profile, identity) is None)
    if len(matching) == 1:
        return matching[0], None
    if not matching:
        return None, (
            f'hardware_profile "auto": no profile in hardware_profiles matches the box '
            f"({describe(identity)}): add one, or set hardware_profile"
        )
    return None, (
        f'hardware_profile "auto" cannot choose between {", ".join(matching)} for the box '
        f"({describe(identity)}): set hardware_profile for this host or its group"
    )


# What the box reports, in the host's one reading (checked on every host, "auto" or not).
IDENTITY = reading.part(HardwareIdentity)


@reading.planner
def reads(_settings):
    return [IDENTITY]
