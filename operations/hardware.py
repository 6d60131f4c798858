"""
Hardware profiles: what each kind of box is, as data, checked against the box.

A profile names the CPU architecture, the GPU's compute capability and the
``TORCH_CUDA_ARCH_LIST`` that builds for it. Hosts pick one with
``hardware_profile`` (per host, or per group in ``group_data/<group>.py``), or
``"auto"`` to take the one profile that matches what the box reports; the table
itself is a setting, so a fleet can add its own kind of box without touching code.

``hardware()`` runs first in deploy.py: it reads the box (``uname -m``,
``nvidia-smi``) and fails that host, before anything changes on it, when the box
contradicts its profile (an RTX workstation given the gb10 profile would get
aarch64 wheels and the wrong CUDA arch list). Other hosts go on. The profiles, the box's
identity and the choice for "auto" live in sparkrig/profile.py, which every concern that needs
the profile asks (``host_profile()``).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from sparkrig.atomic import refused
from sparkrig import reading
from sparkrig.settings import ALL_DEFAULTS, Setting, declare

from sparkrig.profile import (
    AUTO, DEFAULT_PROFILES, IDENTITY, _resolve_auto, contradiction, profile_name_check, profiles_check,
)

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
declare(__name__, SETTINGS)
DOC = "docs/fleets.md"  # profiles are what a mixed fleet is made of


@deploy("Hardware profile", data_defaults=ALL_DEFAULTS)
def hardware():
    """
    Check that the box is the kind its ``hardware_profile`` says, or choose its profile
    for ``"auto"``: a contradiction fails this host before anything changes on it.

    Settings: ``hardware_profile``, ``hardware_profiles``; see docs/settings.md.
    """
    identity = reading.value(IDENTITY)
    name = host.data.hardware_profile
    if name == AUTO:
        problem = _resolve_auto(identity)
    else:
        problem = contradiction(name, host.data.hardware_profiles[name], identity)
    if problem:
        refused(name="The box is the hardware its profile says", message=problem)
