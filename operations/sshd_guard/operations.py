"""SSH guard: the drop-ins, validated before they take effect, and sshd's checked restart."""

from __future__ import annotations

import posixpath

from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation

from sparkrig import atomic, messages, rendering
from sparkrig.connection import prove_new_connection

from .facts import RESTART_PENDING

DROPIN_NAME = "zz-sparkrig.conf"  # read last: wins over earlier drop-ins such as the guides' oom.conf
SLICE = "system.slice"
# For `sh -c SCRIPT NAME UNIT NEW` and `sh -c SCRIPT NAME UNIT`.
VERIFY_DROPIN = rendering.script("sshd_guard/verify-dropin.sh")
CHECK_SSHD = rendering.script("sshd_guard/check-sshd.sh")


def dropin_path(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.d/{DROPIN_NAME}"


def dropin_contents(unit: str, memory_min: str, slice_memory_min: str) -> dict[str, str]:
    """The drop-in of the sshd unit and of system.slice, by unit."""
    return {
        unit: rendering.render("sshd_guard/service.conf.j2", memory_min=memory_min),
        SLICE: rendering.render("sshd_guard/slice.conf.j2", memory_min=slice_memory_min),
    }


def _verified_dropin(unit: str, content: str):
    return atomic.file_commands(
        dest=dropin_path(unit),
        content=content,
        mode=0o644,
        validate=("sh", "-c", VERIFY_DROPIN, "sparkrig-verify", unit),
    )


@operation()
def guard(unit: str, memory_min: str, slice_memory_min: str, active: bool = True, restart_pending: bool = False):
    """
    Protect the unit running sshd from memory pressure without making sessions unkillable.

    + unit: the unit that runs the listening sshd, e.g. ``ssh.service``
    + memory_min: the unit's ``MemoryMin=`` reservation, e.g. ``128M``
    + slice_memory_min: ``system.slice``'s ``MemoryMin=`` (caps what its units may reserve)
    + active: whether the unit runs now (it is restarted only then)
    + restart_pending: an earlier run changed the drop-ins but did not restart sshd

    **Example:**

    .. code:: python

        sshd_guard.guard(unit="ssh.service", memory_min="128M", slice_memory_min="512M")
    """
    dropins = dropin_contents(unit, memory_min, slice_memory_min)
    changes = [*_verified_dropin(unit, dropins[unit]), *_verified_dropin(SLICE, dropins[SLICE])]
    if not changes and not restart_pending:
        return
    messages.detail(f"sshd runs as {unit}")
    if active:
        yield StringCommand("sh", "-c", QuoteString(CHECK_SSHD), "sparkrig-check", QuoteString(unit))
    if changes:
        yield StringCommand("mkdir", "-p", posixpath.dirname(RESTART_PENDING), "&& touch", RESTART_PENDING)
        yield from changes
        yield "systemctl daemon-reload"
    if active:
        yield StringCommand("systemctl", "restart", QuoteString(unit))
    yield StringCommand("rm", "-f", RESTART_PENDING)
    if active:
        yield FunctionCommand(prove_new_connection, (), {})
