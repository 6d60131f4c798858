"""
Helpers shared by the lab tests: run the real pyinfra CLI, read its JSON report,
and turn a pyinfra inventory into testinfra targets with the same SSH settings; and
:func:`unavailable`, the one way a test says a program or a network it needs is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

# The repository and the pyinfra CLI of this environment: the same for the deploy side.
from sparkrig.settings import all_settings, defaults
from sparkrig.tools.rollout import PYINFRA, REPO, limit_hosts, load_inventory


def unavailable(why: str) -> NoReturn:
    """A test that cannot run here for want of a program or a network (``why`` names it and
    how to get it): skipped, saying so; under CI (``CI=true``, as .ci/run and CI services set
    it, and .ci/install provides them all) it fails instead: a skip there proves nothing."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"CI provides it, yet {why}")
    pytest.skip(why)


@dataclass
class DeployResult:
    """One `pyinfra --json` run: exit code, its report, and its log (stderr)."""

    returncode: int
    report: dict[str, Any] | None
    log: str

    def operations(self) -> list[dict[str, Any]]:
        return ((self.report or {}).get("results") or {}).get("operations", [])

    def _by_host(self, outcome: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for op in self.operations():
            for host in op[outcome]:
                found.setdefault(host, []).append(op["name"])
        return found

    def changed(self) -> dict[str, list[str]]:
        """host -> names of the operations that changed something on it."""
        return self._by_host("success")

    def errors(self) -> dict[str, list[str]]:
        """host -> names of the operations that failed on it."""
        return self._by_host("error")

    def hosts(self) -> set[str]:
        return {h for op in self.operations() for h in op["success"] + op["error"] + op["no_change"]}


def run_deploy(
    inventory: str,
    *args: str,
    timeout: int = 1800,
    deploy: str = "deploy.py",
    env: dict[str, str] | None = None,
) -> DeployResult:
    """Run ``pyinfra -y --json INVENTORY DEPLOY`` from the repository, as a user would
    (``env``: added to the environment)."""
    result = subprocess.run(
        [PYINFRA, "-y", "--json", *args, inventory, deploy],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        report = None
    return DeployResult(result.returncode, report, result.stderr + result.stdout * (report is None))


def inventory_host_data(inventory: str, limit: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Every host of a pyinfra inventory with its merged data (group_data included) over
    sparkrig's defaults, restricted as pyinfra's ``--limit`` restricts a deploy (see
    :func:`limit_hosts`).

    Read in this process by pyinfra's own loader, as ``debug-inventory`` reads it
    (:func:`sparkrig.tools.rollout.load_inventory`).
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
