"""A STAND-IN fwupd for a lab host: root's ``fwupdmgr`` in /usr/local/bin (first on sudo's
PATH) printing a fixed ``get-devices`` JSON document, so that a test decides what devices a
host's fwupd reports. The lab's real fwupd shows no firmware device (a container has none).

:data:`HOSTILE_DEVICES` is what a device or a fwupd plugin may put in a name: a NUL, an
escape sequence that retitles and recolours the operator's terminal, a C1 control, a byte
that is not UTF-8 (fwupd's JSON carries it as U+FFFD). Unit tests read the same document
through the real Firmware fact (tests/unit/operations/test_host_strings.py).
"""

from __future__ import annotations

import json
import shlex

from .fleet import run_ssh

STAND_IN = "/usr/local/bin/fwupdmgr"

HOSTILE_DEVICES = json.dumps(
    {
        "Devices": [
            {
                "Name": "System\u0000Firmware",
                "DeviceId": "0123456789abcdef0123456789abcdef01234567",
                "Guid": ["12345678-1234-1234-1234-123456789abc"],
                "Version": "2.91",
                "Vendor": "NVIDIA\u009b31m",
                "Plugin": "standin",
                "Flags": ["internal"],
                "UpdateState": "needs-reboot",
            },
            {
                "Name": "NIC \u001b]0;pwned\u0007\u001b[31mred\r\n  lab-deb13: forged",
                "DeviceId": "1123456789abcdef0123456789abcdef01234567",
                "Guid": ["12345678-1234-1234-1234-123456789abd"],
                "Version": "28.45.1200",
                "Vendor": "Mellanox \ufffd",
                "Plugin": "standin",
                "Flags": [],
            },
        ]
    }
)

# What fwupd's get-updates offers: a newer release for the device whose name holds ESC (so
# that the deploy's operation, with ``updates_firmware = "apply"``, names it).
HOSTILE_UPDATES = json.dumps(
    {
        "Devices": [
            {
                **json.loads(HOSTILE_DEVICES)["Devices"][1],
                "Releases": [{"Version": "28.46.1000"}],
            }
        ]
    }
)


def stand_in_script(devices: str = HOSTILE_DEVICES, updates: str = HOSTILE_UPDATES) -> str:
    """The STAND-IN ``fwupdmgr``: ``get-devices --json`` prints ``devices``, ``get-updates
    --json`` prints ``updates``; any other command (an update) does nothing and succeeds."""
    return (
        "#!/bin/sh\n"
        "# STAND-IN fwupdmgr (lab/fwupd.py): the devices a test chose, not this host's.\n"
        'case "$1" in\n'
        f'get-devices) printf "%s\\n" {shlex.quote(devices)} ;;\n'
        f'get-updates) printf "%s\\n" {shlex.quote(updates)} ;;\n'
        "*) true ;;\n"
        "esac\n"
    )


def install(host_name: str, devices: str = HOSTILE_DEVICES, updates: str = HOSTILE_UPDATES) -> None:
    """Put the STAND-IN fwupdmgr on lab host ``host_name`` (root's, 0755)."""
    script = stand_in_script(devices, updates)
    run_ssh(
        host_name,
        f"sudo install -d -m 0755 /usr/local/bin && sudo tee {STAND_IN} >/dev/null && sudo chmod 0755 {STAND_IN}",
        input=script,
    )


def remove(host_name: str) -> None:
    """Take the STAND-IN away: the host's real fwupdmgr answers again."""
    run_ssh(host_name, f"sudo rm -f {STAND_IN}")
