"""
Hardware profiles: what each kind of box is, as data, checked against the box.

A profile names the CPU architecture, the GPU's compute capability and the
``TORCH_CUDA_ARCH_LIST`` that builds for it. Hosts pick one with
``hardware_profile`` (per host, or per group in ``group_data/<group>.py``), or
``"auto"`` to take the one profile that matches what the box reports; the table
itself is a setting, so a fleet can add its own kind of box without touching code.

``hardware()`` runs first in deploy.py: it fails that host, before anything changes on it,
when the box (``uname -m``, ``nvidia-smi``, in the host's first reading) contradicts its
profile (an RTX workstation given the gb10 profile would get aarch64 wheels and the wrong CUDA
arch list). Other hosts go on. The profiles, the box's identity and the choice for "auto" live
in sparkrig/profile.py; the host's settings (sparkrig/host_settings.py) carry the resolved
profile to every concern, so none needs hardware() to have run first.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["DOC", "SETTINGS", "hardware"]

DOC = "docs/fleets.md"  # profiles are what a mixed fleet is made of
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "hardware")
