"""
The deploy's connection: every command runs from ``/``; after a change that could cut SSH
off (sshd restarted, a link reconfigured), a brand-new connection is proven before the
deploy goes on.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import StringCommand
from pyinfra.connectors.ssh import SSHConnector

# The operation's own privilege arguments (sudo, su, doas...) go to the new connection's command.
_AUTH = (
    "_sudo",
    "_sudo_user",
    "_use_sudo_login",
    "_sudo_password",
    "_preserve_sudo_env",
    "_su_user",
    "_use_su_login",
    "_preserve_su_env",
    "_su_shell",
    "_su_password",
    "_doas",
    "_doas_user",
)


def run_on_new_connection(state, host, command: str, timeout: int = 10) -> tuple[bool, list[str] | Exception]:
    """Run ``command`` (sh, with the running operation's sudo or su) through a brand-new SSH
    connection, waiting ``timeout`` seconds at most for it: (ok, its output lines, or the
    error). Another connector (@local, @docker) runs it through its own connection."""
    arguments = {k: v for k, v in (host.current_op_global_arguments or {}).items() if k in _AUTH}
    fresh = SSHConnector(state, host) if isinstance(host.connector, SSHConnector) else None
    try:
        if fresh is not None:
            fresh.connect()
        ok, output = (fresh or host.connector).run_shell_command(StringCommand(command), _timeout=timeout, **arguments)
        return bool(ok), (output.stdout_lines if ok else [*output.stdout_lines, *output.stderr_lines])
    except Exception as error:  # noqa: BLE001 - any failure means no new connection works
        return False, error
    finally:
        client = getattr(fresh, "client", None)
        if client is not None:
            client.close()


def prove_new_connection(state, host, after: str = "restarting sshd") -> bool:
    """Open a brand-new SSH connection to the host and run ``true`` through it (a
    ``FunctionCommand``: ``after`` says what it follows, in the error)."""
    if not isinstance(host.connector, SSHConnector):
        return True
    ok, output = run_on_new_connection(state, host, "true")
    if not ok:
        logger.error(
            f"{host.print_prefix}sparkrig: a NEW SSH connection failed after {after} "
            f"({output}); this deploy's connection is still open: fix it before it closes",
        )
    return bool(ok)


# Neither pyinfra nor sudo changes directory: a command run as root starts in the login
# user's home, which a Python started there puts first on sys.path (a planted json.py runs
# as root). pyinfra takes a global argument's default (``_chdir``) only from host data, for
# facts and operations alike: the inventory's override layer (where ``pyinfra --data`` puts
# its values) gives it to every host, so every command starts with `cd /`. No module writes
# into a host's own data (tests/repo/test_values.py).
WORKING_DIRECTORY = "/"


def from_slash(inventory) -> None:
    """Make every command pyinfra runs on the hosts of ``inventory`` start in ``/``."""
    inventory.get_override_data()["_chdir"] = WORKING_DIRECTORY


def from_slash_on(state) -> None:
    """:func:`from_slash` for every host of the run, once pyinfra has initialised the state
    (called from config.py, before the first connection)."""
    init = state.init

    def init_then_from_slash(*args, **kwargs):
        init(*args, **kwargs)
        from_slash(state.inventory)

    state.init = init_then_from_slash
