"""
SSH guard: sshd keeps running under memory pressure, and SSH sessions stay killable.

sshd already protects its own listener (it sets its oom_score_adj to -1000) and, after
each fork, gives the session back the value it inherited from its unit. So the unit's
``OOMScoreAdjust`` must NOT be -1000, as hand-written guides set it: every SSH session,
and every training job started from one, would become unkillable. This concern writes
a drop-in for the unit that really runs sshd (``ssh.service``, also when ``ssh.socket``
starts it) that sets ``OOMScoreAdjust=0`` and reserves memory with ``MemoryMin``, plus
the matching reservation on ``system.slice`` without which ``MemoryMin`` has no effect.
Both are checked with ``systemd-analyze verify`` before they take effect; sshd is
restarted only when they changed and only after ``sshd -t`` passes, and a new SSH
connection is proven to work before the deploy goes on.
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand, deploy, operation

from sparkrig import atomic, reading
from sparkrig.connection import prove_new_connection
from sparkrig.settings import ALL_DEFAULTS

from .settings import _SIZE, SETTINGS, _size_check, _slice_check, size_bytes  # noqa: F401 (re-exported)

DROPIN_NAME = "zz-sparkrig.conf"  # read last: wins over earlier drop-ins such as the guides' oom.conf
SLICE = "system.slice"










class SshdUnit(FactBase):
    """
    Returns which unit runs sshd and how it is started, or ``None`` without an sshd unit.

    ``service`` is the unit that runs the listening sshd (``ssh.service`` on Debian and
    Ubuntu, also when ``ssh.socket`` starts it; ``sshd.service`` elsewhere);
    ``per_connection`` is True when the socket starts one sshd per connection
    (``Accept=yes``), in which case no sshd listens. ``restart_pending`` is True when
    an earlier run changed the drop-ins but could not restart sshd.

    .. code:: python

        {"service": "ssh.service", "socket": "ssh.socket", "per_connection": False,
         "active": True, "main_pid": 78, "restart_pending": False}
    """

    def command(self) -> str:
        return (
            "systemctl show -p Id,LoadState,ActiveState,UnitFileState,Accept,Triggers,MainPID "
            f"ssh.socket sshd.service ssh.service; [ -e {RESTART_PENDING} ] && printf '\\nRestartPending=yes\\n'; true"
        )

    @atomic.parses
    def process(self, output: list[str]):
        blocks, block = [], {}
        for line in [*output, ""]:
            if not line.strip():
                if block:
                    blocks.append(block)
                block = {}
                continue
            key, _, value = line.partition("=")
            block[key] = value
        units = {b.get("Id"): b for b in blocks if b.get("LoadState") == "loaded"}
        pending = any(b.get("RestartPending") == "yes" for b in blocks)

        socket = units.get("ssh.socket")
        socket_used = bool(socket) and (
            socket.get("ActiveState") == "active" or socket.get("UnitFileState") == "enabled"
        )
        if socket_used and socket.get("Accept") == "yes":
            return {"service": "ssh@.service", "socket": "ssh.socket", "per_connection": True,
                    "active": False, "main_pid": 0, "restart_pending": False}
        if socket_used and socket.get("Triggers"):
            name = socket["Triggers"].split()[0]
        else:
            # sshd.service is an alias of ssh.service on Debian and Ubuntu: its Id is the real name.
            name = next((n for n in ("ssh.service", "sshd.service") if n in units), None)
        service = units.get(name)
        if service is None:
            return None
        return {
            "service": service["Id"],
            "socket": "ssh.socket" if socket_used else None,
            "per_connection": False,
            "active": service.get("ActiveState") == "active",
            "main_pid": int(service.get("MainPID") or 0),
            "restart_pending": pending,
        }


# Checks a drop-in the way systemd will read it, before it takes effect: the unit's own
# file and the new drop-in in a scratch directory, `systemd-analyze verify` on it, and
# any diagnostic about the drop-in (unknown key, bad value: which systemd only warns
# about and ignores) rejects it. $1: the unit, $2: the new drop-in.
VERIFY_DROPIN = r"""
unit=$1 new=$2
command -v systemd-analyze >/dev/null || exit 0
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
fragment=$(systemctl show -P FragmentPath "$unit")
if [ -n "$fragment" ]; then cp "$fragment" "$dir/$unit"; else printf '[Unit]\n' >"$dir/$unit"; fi
mkdir "$dir/$unit.d" && cp "$new" "$dir/$unit.d/sparkrig.conf" || exit 1
out=$(systemd-analyze verify --man=no "$dir/$unit" 2>&1); rc=$?
if [ $rc -ne 0 ] || printf '%s\n' "$out" | grep -q "$unit.d/sparkrig.conf"; then
    printf 'sparkrig: systemd-analyze verify rejects the %s drop-in:\n%s\n' "$unit" "$out" >&2
    exit 1
fi
"""

# sshd is restarted only if its configuration is valid: a broken sshd_config (whoever
# broke it) would otherwise lock every user out at the restart. Checked before anything
# changes, so a refusal leaves the host as it was. $1: the unit.
CHECK_SSHD = r"""
if ! out=$(sshd -t 2>&1); then
    printf 'sparkrig: refusing to restart %s: sshd -t fails, fix the sshd configuration first:\n%s\n' "$1" "$out" >&2
    exit 1
fi
"""

# Present from the moment the drop-ins change until sshd has restarted: a run that
# failed in between restarts sshd on the next run although the files already match.
# In /run, so a reboot (which restarts sshd anyway) clears it.
RESTART_PENDING = "/run/sparkrig/sshd-restart-pending"


def dropin_path(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.d/{DROPIN_NAME}"


def dropin_contents(unit: str, memory_min: str, slice_memory_min: str) -> dict[str, str]:
    """The drop-in of the sshd unit and of system.slice, by unit."""
    return {
        unit: atomic.render("sshd_guard/service.conf.j2", memory_min=memory_min),
        SLICE: atomic.render("sshd_guard/slice.conf.j2", memory_min=slice_memory_min),
    }


def _verified_dropin(unit: str, content: str):
    return atomic.file._inner(
        dest=dropin_path(unit),
        content=content,
        mode=0o644,
        validate=("sh", "-c", VERIFY_DROPIN, "sparkrig-verify", unit),
    )


@operation()
def guard(
    unit: str, memory_min: str, slice_memory_min: str, active: bool = True, restart_pending: bool = False
):
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
    atomic.detail(f"sshd runs as {unit}")
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


# What the concern decides from, in the host's one reading: the unit, and the drop-ins of
# either name sshd's unit has (ssh.service on Debian and Ubuntu, sshd.service elsewhere).
UNIT = reading.part(SshdUnit)
DROPINS = reading.part(atomic.HostState, paths=tuple(dropin_path(u) for u in ("ssh.service", "sshd.service", SLICE)))


@reading.planner
def reads(_settings):
    return [UNIT, DROPINS]


@deploy("SSH guard", data_defaults=ALL_DEFAULTS)
def sshd_guard():
    """
    Reserve memory for sshd and keep its sessions killable (see the module docstring).

    Settings: ``sshd_guard_memory_min``, ``sshd_guard_system_slice_memory_min``.
    """
    unit = reading.value(UNIT)
    if unit is None:
        host.noop("no sshd unit on this host: nothing to guard")
        return
    if unit["per_connection"]:
        host.noop("ssh.socket starts one sshd per connection (Accept=yes): no sshd listener to guard")
        return
    dropins = dropin_contents(
        unit["service"], host.data.sshd_guard_memory_min, host.data.sshd_guard_system_slice_memory_min
    )
    files = reading.value(DROPINS)["files"]
    converged = all(atomic.up_to_date(files.get(dropin_path(u)), text) for u, text in dropins.items())
    if converged and not unit["restart_pending"]:
        return
    guard(
        name="Reserve memory for sshd, keep its sessions killable",
        unit=unit["service"],
        memory_min=host.data.sshd_guard_memory_min,
        slice_memory_min=host.data.sshd_guard_system_slice_memory_min,
        active=unit["active"],
        restart_pending=unit["restart_pending"],
    )
