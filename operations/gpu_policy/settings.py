"""GPU policy: the settings, declared once, and their checks (types and ranges here; the
GPU's own limits once its state is read, :func:`out_of_range`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkrig.gpu import CLOCK_MIN_MHZ
from sparkrig.operations.hardware import settings as hardware_settings
from sparkrig.profile import profile_name_check
from sparkrig.settings import Setting, boolean, declare, defaults

# Wide bounds for any NVIDIA GPU; the GPU's own range is checked on the host (sparkrig.gpu.out_of_range).
CLOCK_MHZ = (CLOCK_MIN_MHZ, 5000)
POWER_W = (10, 2000)


def _number_or_none(value: Any, low: int, high: int) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high)


def per_profile(low: int, high: int, unit: str):
    """A check of None, an integer from ``low`` to ``high``, or a mapping of hardware profile
    names (of hardware_profiles) to either."""

    def check(value: Any, data: Mapping[str, Any]) -> str | None:
        allowed = (
            f"None (leave it alone), an integer from {low} to {high} ({unit}), or a mapping of "
            f"hardware profile names to either, such as {{'gb10': {min(max(low, 2100), high)}}}"
        )
        if isinstance(value, Mapping):
            for name, item in value.items():
                if profile_name_check(name, data) or name == "auto" or not _number_or_none(item, low, high):
                    return f"{allowed} (bad entry: {name!r}: {item!r})"
            return None
        return None if _number_or_none(value, low, high) else allowed

    return check


SETTINGS = (
    Setting(
        "gpu_persistence",
        False,
        "Turn the GPU's persistence mode on at every boot (nvidia-smi -pm 1): the driver stays "
        "initialised with no client, so a job's start does not pay for it and the clock cap and "
        "power limit below are not lost between clients. False leaves persistence as the driver "
        "or nvidia-persistenced has it.",
        boolean,
    ),
    Setting(
        "gpu_clock_max_mhz",
        None,
        "Cap the GPU's SM clock at this many MHz at every boot (nvidia-smi -lgc 0,MAX): less "
        "heat, and on GB10 fewer thermal shutdowns (a cap of 2100 took a heavy run from 91 to "
        "65 °C, open-gpu-kernel-modules issue 1358). At most the GPU's clocks.max.sm, checked on "
        "the host before any change. None leaves the clocks alone; a mapping gives each hardware "
        "profile its own ({'gb10': 2100}; a profile not named is left alone).",
        per_profile(*CLOCK_MHZ, "MHz"),
    ),
    Setting(
        "gpu_power_limit_w",
        None,
        "Set the GPU's power limit to this many watts at every boot (nvidia-smi -pl W): between "
        "the GPU's power.min_limit and power.max_limit, checked on the host before any change (a "
        "GPU that reports no range, [N/A], refuses any value). None leaves it alone; a mapping "
        "gives each hardware profile its own ({'hopper': 500}).",
        per_profile(*POWER_W, "watts"),
    ),
)

# The settings this concern's deploy reads: its own, and the hardware profile a value may depend on.
DEFAULTS = defaults((*SETTINGS, *hardware_settings.SETTINGS))

declare(__name__, SETTINGS)


def for_profile(value: Any, profile: str | None) -> int | None:
    """A setting's value for a host of hardware profile ``profile`` (None: not resolved)."""
    if isinstance(value, Mapping):
        return value.get(profile) if profile else None
    return value


def needs_profile(settings: Mapping[str, Any]) -> bool:
    """Whether a value differs per profile (then "auto" must have resolved one)."""
    return any(isinstance(settings[key], Mapping) for key in ("gpu_clock_max_mhz", "gpu_power_limit_w"))
