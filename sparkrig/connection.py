"""
The deploy's connection: every command runs from ``/``; after a change that could cut SSH
off (sshd restarted, a link reconfigured), a brand-new connection is proven before the
deploy goes on.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import StringCommand
from pyinfra.connectors.ssh import SSHConnector


def prove_new_connection(state, host, after: str = "restarting sshd") -> bool:
    """Open a brand-new SSH connection to the host and run ``true`` through it (a
    ``FunctionCommand``: ``after`` says what it follows, in the error)."""
    if not isinstance(host.connector, SSHConnector):
        return True
    fresh = SSHConnector(state, host)
    try:
        fresh.connect()
        ok, output = fresh.run_shell_command(StringCommand("true"))
    except Exception as error:  # noqa: BLE001 - any failure means users may be locked out
        ok, output = False, error
    finally:
        client = getattr(fresh, "client", None)
        if client is not None:
            client.close()
    if not ok:
        logger.error(
            f"{host.print_prefix}sparkrig: a NEW SSH connection failed after {after} "
            f"({output}); this deploy's connection is still open: fix it before it closes",
        )
    return bool(ok)


# Neither pyinfra nor sudo changes directory: a command run as root starts in the login
# user's home, which a Python started there puts first on sys.path (a planted json.py runs
# as root). Host data is where pyinfra takes a global argument's default from, for facts
# and operations alike, so every command of every host starts with `cd /`.
WORKING_DIRECTORY = "/"


def from_slash(hosts) -> None:
    """Make every command pyinfra runs on ``hosts`` start in ``/`` (pyinfra's ``_chdir``)."""
    for host in hosts:
        host.data._chdir = WORKING_DIRECTORY


def from_slash_on(state) -> None:
    """:func:`from_slash` for every host of the run, once pyinfra has initialised the state
    (called from config.py, before the first connection)."""
    init = state.init

    def init_then_from_slash(*args, **kwargs):
        init(*args, **kwargs)
        from_slash(state.inventory)

    state.init = init_then_from_slash
