"""Hardware profiles: what each kind of box is, as data, checked against the box:
the settings, declared once, and their checks."""

from __future__ import annotations

from sparkrig.profile import (
    DEFAULT_PROFILES,
    profile_name_check,
    profiles_check,
)
from sparkrig.settings import Setting, declare, defaults

SETTINGS = (
    Setting(
        "hardware_profile",
        "gb10",
        'Which entry of hardware_profiles describes the hosts, or "auto": the one profile whose '
        "architecture and compute capability match what the box reports (uname -m, nvidia-smi). "
        "Set it per group (group_data/<group>.py) on a mixed fleet. Either way the box is checked "
        "first: a host that contradicts its profile fails before anything changes on it. The lab "
        'inventory sets "rtx50" (x86_64 hosts); a Hopper box "hopper".',
        profile_name_check,
    ),
    Setting(
        "hardware_profiles",
        DEFAULT_PROFILES,
        "The kinds of box sparkrig knows: CPU architecture, the GPU's compute capability, and the "
        "TORCH_CUDA_ARCH_LIST that source builds target. Add your own kind here.",
        profiles_check,
    ),
)

DEFAULTS = defaults(SETTINGS)  # the settings this concern's deploy reads: its own

declare(__name__, SETTINGS)
