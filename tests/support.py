"""
Helpers shared by the lab tests: run the real pyinfra CLI, read its JSON report,
and turn a pyinfra inventory into testinfra targets with the same SSH settings; and
:func:`unavailable`, the one way a test says a program or a network it needs is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

# The repository and the pyinfra CLI of this environment: the same for the deploy side.
from sparkrig.tools import check
from sparkrig.tools.inventory import PYINFRA, REPO

# The suite's reading of an inventory, for the lab tests too.
from tests.compliance.targets import inventory_host_data, ssh_config_for

__all__ = [
    "PYINFRA",
    "REPO",
    "DeployResult",
    "build_wheel",
    "install_wheel",
    "inventory_host_data",
    "run_deploy",
    "ssh_config_for",
    "unavailable",
]


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


def run_check(
    inventory: str, limit: list[str], *pytest_options: str, timeout: int = 600
) -> subprocess.CompletedProcess:
    """The compliance suite on ``limit``'s hosts, run by the command a rollout proves a batch
    with (:func:`sparkrig.tools.check.command`), quiet; ``pytest_options`` select controls."""
    return subprocess.run(
        check.command(inventory, limit, extra=["-q", *pytest_options]),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def build_wheel(out: Path) -> Path:
    """The wheel `uv build` makes of this checkout, into ``out``."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH (.ci/install puts it there)")
    subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(REPO)], check=True, capture_output=True, timeout=600
    )
    return next(out.glob("sparkrig-*.whl"))


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A fresh venv at ``venv`` (outside the checkout) holding ``wheel``, installed offline: its
    dependencies as uv.lock pins them, from uv's cache where the checkout's own `uv sync` put them
    (a resolving `uv pip install --offline` would need the index's pages, which a sync never
    fetches), then the wheel alone. Its bin/ directory."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH (.ci/install puts it there)")
    sync = ["sync", "--locked", "--offline", "--no-dev", "--no-install-project", "--quiet", "--python", sys.executable]
    subprocess.run(
        [uv, *sync],
        cwd=REPO,
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)},
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    python = str(venv / "bin" / "python")
    subprocess.run(
        [uv, "pip", "install", "--offline", "--no-deps", "--quiet", "--python", python, str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return venv / "bin"
