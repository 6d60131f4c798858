"""
sparkrig as a package: the wheel `uv build` makes, installed into a fresh venv outside the
checkout, deploys one concern from a user's own three-line deploy to a lab host.

The user's project holds a deploy.py (import swap, call it), a config.py (sparkrig's one
call: validation, the deploy lock, the summary line) and an inventory naming lab-deb13 as
the lab reaches it. A swap line is put back into the host's fstab first, so that the run has
something to change; the second run changes nothing; a bad value is refused before any host
is touched, in one line naming the host and the key. Nothing of the checkout is on the
venv's path: a missing file in the wheel fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import REPO, inventory_host_data

pytestmark = pytest.mark.lab

HOST = "lab-deb13"
SWAP_LINE = "/swap.img none swap sw 0 0"

DEPLOY = """from sparkrig.operations.swap import swap

swap()
"""
CONFIG = """from sparkrig.operations import install

install("swap")
"""


@pytest.fixture(scope="module")
def user_project(tmp_path_factory, first_converge):
    """A venv holding the built wheel and a user's deploy beside it, both outside the checkout."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH (the README's install puts it there)")
    root = tmp_path_factory.mktemp("user-deploy")
    subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(root / "dist"), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wheel = next((root / "dist").glob("sparkrig-*.whl"))
    venv = root / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    data = inventory_host_data(LAB_INVENTORY, [HOST])[HOST]
    connection = {k: v for k, v in data.items() if k.startswith("ssh_") or k.startswith("_")}
    project = root / "project"
    project.mkdir()
    (project / "deploy.py").write_text(DEPLOY)
    (project / "config.py").write_text(CONFIG)
    (project / "inventory.py").write_text(f"hosts = [({HOST!r}, {connection!r})]\n")
    return venv / "bin" / "pyinfra", project


def run(project, *args: str) -> subprocess.CompletedProcess:
    pyinfra, cwd = project
    return subprocess.run(
        [str(pyinfra), "-y", *args, "inventory.py", "deploy.py"], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_the_wheel_has_no_checkout_on_its_path(user_project):
    pyinfra, cwd = user_project
    python = pyinfra.parent / "python"
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import sparkrig, sparkrig.operations.swap as s; print(s.__file__); print(*sparkrig.__path__)",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(REPO) not in found and "site-packages/sparkrig" in found, found


def test_a_users_deploy_converges_one_concern_then_changes_nothing(user_project):
    lab.run_ssh(HOST, f"echo '{SWAP_LINE}' | sudo tee -a /etc/fstab >/dev/null")
    first = run(user_project)
    assert first.returncode == 0, first.stderr[-3000:]
    assert re.search(r"--> 1 host, [0-9]+ changes? on 1 host", first.stderr + first.stdout), first.stderr[-3000:]
    fstab = lab.run_ssh(HOST, "cat /etc/fstab").stdout
    assert SWAP_LINE not in fstab.splitlines(), fstab
    second = run(user_project)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "--> 1 host, no changes" in second.stderr + second.stdout, second.stderr[-3000:]


def test_a_bad_value_is_refused_naming_the_host_and_the_key(user_project):
    refused = run(user_project, "--data", "swap_disable=maybe")
    output = refused.stderr + refused.stdout
    assert refused.returncode != 0, output[-3000:]
    assert f"host {HOST!r}: swap_disable = 'maybe': allowed is True or False" in output, output[-3000:]
    assert "Connecting" not in output and "[lab-deb13] Connected" not in output, output[-3000:]
