"""SSH guard: which unit runs sshd, how it is started, and whether a restart is pending."""

from __future__ import annotations

from pyinfra.api import FactBase

from sparkrig import host_output

# Present from the moment the drop-ins change until sshd has restarted: a run that
# failed in between restarts sshd on the next run although the files already match.
# In /run, so a reboot (which restarts sshd anyway) clears it.
RESTART_PENDING = "/run/sparkrig/sshd-restart-pending"


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

    @host_output.parses
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
            return {
                "service": "ssh@.service",
                "socket": "ssh.socket",
                "per_connection": True,
                "active": False,
                "main_pid": 0,
                "restart_pending": False,
            }
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
