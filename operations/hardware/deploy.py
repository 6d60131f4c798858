"""The hardware profile's deploy: the box checked against its profile before anything changes."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from sparkrig import reading
from sparkrig.messages import refused
from sparkrig.profile import (
    AUTO,
    IDENTITY,
    _resolve_auto,
    contradiction,
)

from .settings import DEFAULTS


@deploy("Hardware profile", data_defaults=DEFAULTS)
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
