"""
Helpers shared by the lab tests: run the real pyinfra CLI, read its JSON report,
and turn a pyinfra inventory into testinfra targets with the same SSH settings; and
:func:`unavailable`, the one way a test says a program or a network it needs is missing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
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
    "RunningDeploy",
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
    # The runs a result merged from several is made of (:meth:`merged`), each with its own
    # summary line; empty for one run.
    runs: tuple[DeployResult, ...] = field(default=())

    @classmethod
    def merged(cls, runs: list[DeployResult]) -> DeployResult:
        """One result of runs over disjoint hosts of one inventory and deploy: each operation
        (pyinfra's op_hash: where the deploy calls it) with every run's hosts and names, the
        first failing run's exit status, the logs one after the other."""
        operations: dict[str, dict[str, Any]] = {}
        for run in runs:
            for op in run.operations():
                into = operations.setdefault(
                    op["op_hash"], {**op, "names": [], "success": [], "error": [], "no_change": []}
                )
                for key in ("success", "error", "no_change"):
                    into[key] = sorted(into[key] + op[key])
                into["names"] = sorted(set(into["names"]) | set(op["names"]))
        returncode = next((run.returncode for run in runs if run.returncode != 0), 0)
        report = {"results": {"operations": list(operations.values())}}
        return cls(returncode, report, "".join(run.log for run in runs), tuple(runs))

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
    return RunningDeploy(inventory, *args, deploy=deploy, env=env).result(timeout)


class RunningDeploy:
    """:func:`run_deploy` started, not waited for: :meth:`result` waits (a run beside others)."""

    def __init__(self, inventory: str, *args: str, deploy: str = "deploy.py", env: dict[str, str] | None = None):
        # Into files, read once it ended: a pipe nobody reads would stop it.
        self._stdout = tempfile.TemporaryFile()
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [PYINFRA, "-y", "--json", *args, inventory, deploy],
            cwd=REPO,
            stdout=self._stdout,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )

    def result(self, timeout: float = 1800) -> DeployResult:
        """Its result once it ended (killed when it outlasts ``timeout``: TimeoutExpired)."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        stdout, stderr = (self._read(handle) for handle in (self._stdout, self._stderr))
        try:
            report = json.loads(stdout)
        except json.JSONDecodeError:
            report = None
        return DeployResult(self.process.returncode, report, stderr + stdout * (report is None))

    def stop(self) -> None:
        """Kill it if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @staticmethod
    def _read(handle) -> str:
        handle.seek(0)
        # As subprocess's text mode reads a pipe (universal newlines); closed once read.
        with io.TextIOWrapper(handle, errors="replace") as text:
            return text.read()


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


TABLE_TITLE = "sparkrig compliance, per host"


def host_table(output: str, context: str = "") -> list[str]:
    """The lines after the title of the per-host table a compliance run ends with: the column
    heads, a row per host, a line per failed control, then pytest's own. Fails showing the
    end of ``output`` (and of ``context``: the run's stderr) where there is no table."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if TABLE_TITLE in line), None)
    assert start is not None, f"no per-host table:\n{output[-3000:]}\n{context[-2000:]}"
    return lines[start + 1 :]


def check_on_local(tmp_path: Path, probe: str, *pytest_options: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``sparkrig check`` (the installed tool's entry point) on an inventory of ``@local`` alone,
    from ``tmp_path``, with ``probe`` (a pytest plugin's source, loaded as ``-p probe``) and
    ``pytest_options``; the suite's private directory under ``tmp_path``. The probe writes to
    the file named by ``$PROBE``: the run and that file."""
    (tmp_path / "probe.py").write_text(probe)
    (tmp_path / "inv.py").write_text('here = [("@local", {})]\n')
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=f"{REPO}:{tmp_path}", XDG_RUNTIME_DIR=str(runtime), PROBE=str(tmp_path / "probe"))
    run = subprocess.run(
        check.command(str(tmp_path / "inv.py"), extra=["-p", "probe", *pytest_options]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return run, tmp_path / "probe"


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
