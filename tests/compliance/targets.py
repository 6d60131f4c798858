"""
What the compliance suite checks: the hosts of a pyinfra inventory with their data, the SSH
config that reaches them, and, in a checkout only, the local lab.

The suite is the package's ``sparkrig.compliance`` (``sparkrig check``, from the wheel or a
checkout) and the checkout's ``tests/compliance`` (``pytest tests/compliance``), one folder
under two names: its modules import each other relatively, so one process holds it under one
name, and what they need of the checkout (the lab, its inventory) is reached through here
only, when the suite has no inventory and targets the lab.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkrig.operations import load
from sparkrig.settings import all_settings, defaults
from sparkrig.tools.inventory import REPO, in_checkout, limit_hosts, load_inventory

__all__ = ["LAB_INVENTORY", "REPO", "inventory_host_data", "lab", "lab_says", "ssh_config_for"]

LAB_INVENTORY = "inventory/lab.py"

# Every concern imported, so that every setting is declared: each host is checked against the
# settings its deploy would resolve (a checkout's tests import them anyway; the wheel's suite
# has only this).
load()


def inventory_host_data(inventory: str, limit=()) -> dict[str, dict[str, Any]]:
    """Every host of a pyinfra inventory with its merged data (group_data included) over
    sparkrig's defaults, restricted as pyinfra's ``--limit`` restricts a deploy (see
    :func:`limit_hosts`).

    Read in this process by pyinfra's own loader, as ``debug-inventory`` reads it
    (:func:`sparkrig.tools.inventory.load_inventory`).
    """
    hosts = load_inventory(inventory)
    chosen = limit_hosts({host["name"]: host["groups"] for host in hosts}, limit)
    base = defaults(all_settings())
    return {host["name"]: {**base, **host["data"]} for host in hosts if host["name"] in chosen}


_SSH_OPTIONS = {
    "ssh_hostname": "HostName",
    "ssh_user": "User",
    "ssh_port": "Port",
    "ssh_key": "IdentityFile",
    "ssh_known_hosts_file": "UserKnownHostsFile",
    "ssh_strict_host_key_checking": "StrictHostKeyChecking",
}


def ssh_config_for(hosts: dict[str, dict[str, Any]]) -> str:
    """An OpenSSH client config that reaches each host as pyinfra's data says to."""
    lines = []
    for name, data in hosts.items():
        lines.append(f"Host {name}")
        for key, option in _SSH_OPTIONS.items():
            if data.get(key) is not None:
                lines.append(f"  {option} {data[key]}")
        lines.append("  BatchMode yes")
    if (Path.home() / ".ssh" / "config").exists():
        lines += ["Match all", "  Include ~/.ssh/config"]
    return "\n".join(lines) + "\n"


class _CheckoutLab:
    """The checkout's ``lab`` package, imported when first used: the suite without an
    inventory checks the lab, which a wheel does not carry (it says so, as a usage error)."""

    def __getattr__(self, name: str):
        if not in_checkout():
            raise pytest.UsageError(
                "no --inventory: the suite would check the local lab, which only a sparkrig checkout has; "
                "name an inventory (sparkrig check INVENTORY)"
            )
        import lab  # noqa: PLC0415 - the checkout's, never the wheel's

        return getattr(lab, name)


lab = _CheckoutLab()


def lab_says(config, message: str) -> None:
    """The lab fixtures' one line on the terminal (tests/conftest.py's, in a checkout)."""
    from tests.conftest import lab_says as says  # noqa: PLC0415 - the checkout's, as lab is

    says(config, message)
