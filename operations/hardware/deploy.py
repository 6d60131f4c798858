"""The hardware profile's deploy: the box checked against its profile before anything changes."""

from __future__ import annotations

from pyinfra.api import deploy

from sparkrig import host_settings, reading
from sparkrig.messages import refused
from sparkrig.profile import IDENTITY, contradiction

from .settings import DEFAULTS


@deploy("Hardware profile", data_defaults=DEFAULTS)
def hardware():
    """
    Check that the box is the kind its ``hardware_profile`` says, or that ``"auto"`` found the
    one profile it is: either failing fails this host before anything changes on it.

    Settings: ``hardware_profile``, ``hardware_profiles``; see docs/settings.md.
    """
    settings = host_settings.current()
    if settings.profile is None:  # "auto", and no single profile matches the box
        problem = settings.profile_problem
    else:
        problem = contradiction(settings.hardware_profile, settings.profile, reading.value(IDENTITY))
    if problem:
        refused(name="The box is the hardware its profile says", message=problem)
