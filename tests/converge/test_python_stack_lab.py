"""
Python stack in the lab: hand-installed packages are synced away (a changed pin: see
test_python_lock_lab.py), uv upgrades with its pin (and a wrong hash leaves the old uv working), and a
directory that is not a venv is refused, never wiped.

Each test restores what it changed, so the fleet stays converged for the compliance suite.
"""

import json
import shlex

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import run_deploy

pytestmark = pytest.mark.lab
VENV = "/opt/sparkrig/venv"
# uv 0.13.8's manylinux x86_64 wheel on PyPI (the lab hosts are x86_64).
UV_0138_SHA256 = "e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984"


def _venv_op(result, host: str) -> list[str]:
    return [name for name in result.changed().get(host, []) if " | Virtualenv " in name]


def _installed(host: str) -> dict[str, str]:
    script = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
    )
    out = lab.run_ssh(host, f"sudo {VENV}/bin/python -c {shlex.quote(script)}").stdout
    return json.loads(out)


def _uv_version(host: str) -> str:
    return lab.run_ssh(host, "/usr/local/bin/uv --version").stdout.split()[1]


def test_a_hand_installed_package_is_synced_away(first_converge):
    """A package installed into the venv by hand (as owners do with CUDA 13 builds PyPI lacks,
    which the next `uv sync` of a project then silently replaces): the venv holds the
    manifest, and the drift is reported and undone by the next converge."""
    assert first_converge.returncode == 0, first_converge.log
    host = "lab-deb12"
    lab.run_ssh(
        host,
        f"sudo env UV_SYSTEM_CERTS=1 UV_CACHE_DIR=/var/cache/sparkrig/uv /opt/sparkrig/uv/bin/uv "
        f"pip install --quiet --python {VENV}/bin/python six==1.17.0",
    )
    assert "six" in _installed(host)
    result = run_deploy(LAB_INVENTORY, "--limit", host)
    assert result.returncode == 0, result.log
    assert result.changed() == {host: _venv_op(result, host)} and _venv_op(result, host), result.changed()
    assert "six" not in _installed(host)


def test_uv_follows_its_pin_and_a_wrong_hash_keeps_the_old_uv(first_converge):
    assert first_converge.returncode == 0, first_converge.log
    host = "lab-deb13"
    assert _uv_version(host) == "0.13.9"
    # 0.13.8 with 0.13.9's hashes: pip refuses the download, the old uv stays.
    wrong = run_deploy(LAB_INVENTORY, "--limit", host, "--data", "python_uv_version=0.13.8")
    assert wrong.returncode != 0
    assert "HASHES" in wrong.log.upper() or "hash" in wrong.log, wrong.log[-2000:]
    assert _uv_version(host) == "0.13.9"

    older = run_deploy(
        LAB_INVENTORY,
        "--limit",
        host,
        "--data",
        "python_uv_version=0.13.8",
        "--data",
        f'python_uv_sha256=["{UV_0138_SHA256}"]',
    )
    assert older.returncode == 0, older.log
    assert _uv_version(host) == "0.13.8"
    assert all(name.startswith("Python stack | uv ") for name in older.changed()[host]), older.changed()

    back = run_deploy(LAB_INVENTORY, "--limit", host)
    assert back.returncode == 0, back.log
    assert _uv_version(host) == "0.13.9"
    again = run_deploy(LAB_INVENTORY, "--limit", host)
    assert again.changed() == {}, again.log


def test_a_directory_that_is_not_a_venv_is_refused_and_kept(first_converge):
    assert first_converge.returncode == 0, first_converge.log
    host = "lab-deb12"
    path = "/srv/sparkrig-not-a-venv"
    lab.run_ssh(host, f"sudo mkdir -p {path} && echo precious | sudo tee {path}/data >/dev/null")
    try:
        result = run_deploy(LAB_INVENTORY, "--limit", host, "--data", f"python_venv_path={path}")
        assert result.returncode != 0
        assert "is a non-empty directory but no virtualenv" in result.log, result.log[-2000:]
        assert lab.run_ssh(host, f"cat {path}/data").stdout == "precious\n"
    finally:
        lab.run_ssh(host, f"sudo rm -rf {path}")
    # The CUDA env file named that path (UV_PROJECT_ENVIRONMENT): converge back.
    back = run_deploy(LAB_INVENTORY, "--limit", host)
    assert back.returncode == 0, back.log
