"""
The deploy's connection: after a change that could cut SSH off (sshd restarted, a link
reconfigured), a brand-new connection is proven before the deploy goes on.
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
