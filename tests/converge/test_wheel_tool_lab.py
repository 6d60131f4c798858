"""
sparkrig as a tool you install: the wheel `uv build` makes, in a fresh venv outside the
checkout, runs `sparkrig check` and `sparkrig rollout` for a user's own project (an inventory, a
config.py and a deploy.py of its own, in a directory of its own) against a lab host, with the
outcomes the checkout's own commands have on the same host: the same controls with the same
outcome, the same exit statuses; the rollout pushes each proven host's outcome where its
metrics collector serves it (--metrics-push).

The user's inventory names the first lab host with the data the lab's inventory gives it (the
lab's stand-in repositories among them), so that each control asks what it asks of the lab; its
deploy converges one concern (swap), after the checkout's deploy converged the host whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lab
from sparkrig.operations.metrics.deploy import COMPLIANCE_FILE
from sparkrig.tools import check
from tests.conftest import LAB_INVENTORY
from tests.support import REPO, build_wheel, host_table, install_wheel, inventory_host_data

pytestmark = pytest.mark.lab

DEPLOY = "from sparkrig.operations.swap import swap\n\nswap()\n"
CONFIG = 'from sparkrig.operations import install\n\ninstall("swap")\n'


@pytest.fixture(scope="module")
def host(first_converge) -> str:
    assert first_converge.returncode == 0, first_converge.log[-3000:]
    return next(iter(inventory_host_data(LAB_INVENTORY)))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv outside the checkout holding the built wheel; its bin/."""
    root = tmp_path_factory.mktemp("wheel-tool")
    return install_wheel(build_wheel(root / "dist"), root / "venv")


@pytest.fixture(scope="module")
def project(host, tmp_path_factory) -> Path:
    """The user's own project: inventory.py (the lab host, its data as the lab gives it),
    config.py and deploy.py."""
    root = tmp_path_factory.mktemp("user-project")
    # One host of the lab's cluster alone is no cluster: the user's inventory leaves it out.
    data = {k: v for k, v in inventory_host_data(LAB_INVENTORY, [host])[host].items() if not k.startswith("cluster_")}
    (root / "inventory.py").write_text(f"hosts = [({host!r}, {data!r})]\n")
    (root / "config.py").write_text(CONFIG)
    (root / "deploy.py").write_text(DEPLOY)
    return root


def outcomes(results: Path) -> dict[str, str]:
    """Each control's outcome in the one document of a --results DIR."""
    (document,) = [json.loads(p.read_text()) for p in results.glob("*.json")]
    return {c["id"]: c["outcome"] for h in document["hosts"].values() for c in h["controls"]}


def table(output: str) -> list[str]:
    """The per-host table the suite ends with (without where its results went and pytest's timing line)."""
    return [line for line in host_table(output) if not line.startswith(("=", "results: "))]


def run(argv: list[str], cwd: Path, bin_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"} if bin_dir else {})}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=1500, env=env)


def test_check_from_the_wheel_finds_what_the_checkouts_finds(installed, project, tmp_path):
    """The same controls, each with the same outcome, the same table and exit status: the
    wheel's `sparkrig check` in the user's directory, and the checkout's in the checkout."""
    ours = run(check.command(str(project / "inventory.py"), extra=["--results", str(tmp_path / "checkout")]), REPO)
    theirs = run(
        [str(installed / "sparkrig"), "check", "inventory.py", "--results", str(tmp_path / "wheel")],
        project,
        installed,
    )
    # The wheel's own suite ran (pytest's -ra lines name the skipped controls' files), not the checkout's.
    assert "/site-packages/sparkrig/compliance/test_" in theirs.stdout and str(REPO) not in theirs.stdout
    assert theirs.returncode == ours.returncode, (theirs.stdout[-3000:], ours.stdout[-3000:])
    found = outcomes(tmp_path / "wheel")
    assert found == outcomes(tmp_path / "checkout")
    assert table(theirs.stdout) == table(ours.stdout), theirs.stdout[-3000:]
    assert {o for c, o in found.items() if c.startswith("test_swap.py::")} == {"passed"}, found


def test_rollout_from_the_wheel_deploys_the_users_file_and_proves_it_as_the_checkouts(
    installed, project, host, tmp_path
):
    """The wheel's `sparkrig rollout` runs the user's deploy.py in the user's directory and proves
    the batch with the wheel's `sparkrig check`, ending as the checkout's rollout of the same
    file ends; with --metrics-push the host's compliance file is the run's, root's, 0644."""
    lab.run_ssh(host, f"sudo rm -f {COMPLIANCE_FILE}")
    ours = run(
        [
            sys.executable,
            "-m",
            "sparkrig.tools",
            "rollout",
            str(project / "inventory.py"),
            "--deploy",
            str(project / "deploy.py"),
            "--state",
            str(tmp_path / "checkout.json"),
        ],
        REPO,
    )
    theirs = run(
        [str(installed / "sparkrig"), "rollout", "inventory.py", "--state", str(tmp_path / "w.json"), "--metrics-push"],
        project,
        installed,
    )
    assert theirs.returncode == ours.returncode, (theirs.stderr[-3000:], ours.stderr[-3000:])
    assert "Bytecode compiled" not in theirs.stderr
    for result in (ours, theirs):
        assert f"rollout: batch 1/1: {host}" in result.stderr and "running the compliance suite" in result.stderr
    said = [line for line in theirs.stderr.splitlines() if line.startswith(f"  {host} (batch 1)")]
    assert said == [line for line in ours.stderr.splitlines() if line.startswith(f"  {host} (batch 1)")]
    pushed = lab.run_ssh(host, f"sudo stat -c '%U %a' {COMPLIANCE_FILE} && sudo cat {COMPLIANCE_FILE}").stdout
    assert pushed.splitlines()[0] == "root 644", pushed
    assert any(line.startswith("swap ") and line.split()[2] == "0" for line in pushed.splitlines()), pushed
    assert f"metrics-push: {host}: {COMPLIANCE_FILE}" in theirs.stderr, theirs.stderr[-3000:]
