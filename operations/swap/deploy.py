"""Swap: the deploy, and the part of the host's one reading it decides from."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from sparkrig import host_settings, reading

from .facts import SwapSources
from .operations import disabled
from .settings import DEFAULTS


@reading.planner
def reads(settings):
    # disabled() reads SwapSources: from the host's one reading.
    return [reading.part(SwapSources)] if settings["swap_disable"] else []


@deploy("Swap off", data_defaults=DEFAULTS)
def swap():
    """
    Turn swap off now and keep it off across reboots (see :func:`disabled`).

    Settings: ``swap_disable``, ``swap_remove_files``; see docs/settings.md.
    """
    settings = host_settings.current()
    if not settings.swap_disable:
        host.noop("swap_disable is False: swap is left as it is")
        return
    disabled(
        name="Swap off now and at every boot (fstab entries, swap and zram units)",
        remove_files=settings.swap_remove_files,
    )
