"""SSH guard: the deploy, deciding from the one reading whether sshd's drop-ins need writing."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from sparkrig import atomic, host_settings, reading

from .facts import SshdUnit
from .operations import SLICE, dropin_contents, dropin_path, guard
from .settings import DEFAULTS

# What the concern decides from, in the host's one reading: the unit, and the drop-ins of
# either name sshd's unit has (ssh.service on Debian and Ubuntu, sshd.service elsewhere).
UNIT = reading.part(SshdUnit)
DROPINS = reading.part(atomic.HostState, paths=tuple(dropin_path(u) for u in ("ssh.service", "sshd.service", SLICE)))


@reading.planner
def reads(_settings):
    return [UNIT, DROPINS]


@deploy("SSH guard", data_defaults=DEFAULTS)
def sshd_guard():
    """
    Reserve memory for sshd and keep its sessions killable (see the module docstring).

    Settings: ``sshd_guard_memory_min``, ``sshd_guard_system_slice_memory_min``.
    """
    settings = host_settings.current()
    unit = reading.value(UNIT)
    if unit is None:
        host.noop("no sshd unit on this host: nothing to guard")
        return
    if unit["per_connection"]:
        host.noop("ssh.socket starts one sshd per connection (Accept=yes): no sshd listener to guard")
        return
    dropins = dropin_contents(
        unit["service"], settings.sshd_guard_memory_min, settings.sshd_guard_system_slice_memory_min
    )
    files = reading.value(DROPINS)["files"]
    converged = all(atomic.up_to_date(files.get(dropin_path(u)), text) for u, text in dropins.items())
    if converged and not unit["restart_pending"]:
        return
    guard(
        name="Reserve memory for sshd, keep its sessions killable",
        unit=unit["service"],
        memory_min=settings.sshd_guard_memory_min,
        slice_memory_min=settings.sshd_guard_system_slice_memory_min,
        active=unit["active"],
        restart_pending=unit["restart_pending"],
    )
