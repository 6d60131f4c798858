"""
One deploy at a time changes a host: the first command that would change it takes the host's lock.

Two deploys at once on one host would share temporary names (``.NAME.sparkrig-new``,
staging directories) and interleave their writes. So before a run's first changing
command on a host, root takes ``flock`` on :data:`LOCK` and hands it to a small holder
process that lives as long as the run's SSH connection (its sshd session process); a
second run finds the lock taken and that host fails, naming the first run. A run that
changes nothing never takes it (no extra remote command); one that ends, crashes or is
cut off releases it within a second (when its sshd session process exits).
"""

from __future__ import annotations

import weakref

from pyinfra.api import QuoteString, StringCommand
from pyinfra.api.state import BaseStateCallback

from . import rendering

LOCK = "/run/sparkrig-deploy.lock"
# How long a second run waits for the lock: long enough for the holder of a run that has
# just ended to notice (it looks once a second), short enough to fail a busy host at once.
WAIT_S = 5

# sh, as root: $1 the lock file, $2 seconds to wait. Takes the lock on fd 9, writes who holds
# it into the file and leaves fd 9 to a holder (its own session: no terminal's hangup reaches
# it; no stdout/stderr: the SSH channel closes) that exits when the process it watches
# does: the first sshd / sshd-session above this shell (the run's SSH connection), else
# (pyinfra's @local) the first ancestor that is not a shell or sudo. The start time read
# from /proc/PID/stat guards against a reused pid. Only root can create or open the file
# (/run is root's; mode 600), so no other user can take the lock, forge what it says or
# kill its holder.
TAKE = rendering.script("sparkrig/take-lock.sh")


class _TakeLock(StringCommand):
    """The command that takes the lock; its success marks this host's lock as held."""

    def execute(self, state, host, connector_arguments):
        status, output = super().execute(state, host, connector_arguments)
        if status:
            _held.add(host)
        return status, output


_held: weakref.WeakSet = weakref.WeakSet()


def take_lock(sudo: bool = True) -> StringCommand:
    """The command that takes this host's deploy lock, as root: through sudo, unless the
    operation runs without it (a run that connects as root, such as ``@local`` on a box
    without sudo)."""
    return _TakeLock("sh", "-c", QuoteString(TAKE), "sh", LOCK, str(WAIT_S), _sudo=sudo)


class DeployLock(BaseStateCallback):
    """
    Puts :func:`take_lock` before the first command a host's run executes.

    The lock is taken where pyinfra executes, not where sparkrig writes: pyinfra's own
    operations (apt, systemd) write too, so wrapping ``atomic`` would miss them. An
    operation's commands are known only as its generator yields them (and
    ``operation_host_start`` fires for every operation, changing or not), so the callback
    wraps the host's generator: the lock goes in front of the first command actually
    yielded, and a run that yields none (no change) sends nothing more.
    """

    @staticmethod
    def operation_host_start(state, host, op_hash):
        op_data = state.ops[host].get(op_hash)
        if op_data is None or getattr(op_data.command_generator, "sparkrig_locked", False):
            return
        commands = op_data.command_generator
        sudo = bool(op_data.global_arguments.get("_sudo"))

        def locked():
            inner = commands()
            try:
                for command in inner:
                    if host not in _held:
                        yield take_lock(sudo)
                        if host not in _held:  # refused (an operation with _continue_on_error)
                            return
                    yield command
            finally:
                inner.close()

        locked.sparkrig_locked = True
        op_data.command_generator = locked


def lock_on(state) -> None:
    """Take each host's deploy lock before this run's first command that changes it
    (called from config.py, before pyinfra initialises the state, which is where its
    callback handlers start)."""
    init = state.init

    def init_then_lock(*args, **kwargs):
        init(*args, **kwargs)
        state.add_callback_handler(DeployLock())

    state.init = init_then_lock
