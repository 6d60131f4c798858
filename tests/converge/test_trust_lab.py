"""
Trust boundaries in the lab, playing a local user against the deploy's root:
Python planted in the login user's home, a predictable upload path taken first, FIFOs and
links where root reads a user's files. Each test restores what it changed.
"""

from __future__ import annotations

import hashlib
import shlex

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import run_deploy

pytestmark = pytest.mark.lab
PLANTED = ("ensurepip", "json", "venv")


def _root_sh(host: str, script: str) -> str:
    return lab.run_ssh(host, f"sudo sh -c {shlex.quote(script)}").stdout


def _plant(host: str) -> None:
    """A json.py, venv.py and ensurepip.py in the login user's home (where sudo leaves root's
    working directory), each leaving a mark in /root when imported as root."""
    for name in PLANTED:
        code = f'import os\nif os.getuid() == 0:\n    open("/root/sparkrig-planted-{name}", "w").write("ran\\n")\n'
        lab.run_ssh(host, f"cat > ~/{name}.py", input=code)


def _marks(host: str) -> list[str]:
    return _root_sh(host, "cd /root && ls sparkrig-planted-* 2>/dev/null; true").split()


@pytest.mark.parametrize("host", ["lab-deb12", "lab-deb13"])
def test_python_planted_in_the_login_users_home_never_runs_as_root(first_converge, host):
    assert first_converge.returncode == 0, first_converge.log
    _plant(host)
    try:
        # The plant works: a Python root starts there without -I runs it.
        lab.run_ssh(host, "sudo python3 -c 'import json'")
        assert _marks(host) == ["sparkrig-planted-json"]
        _root_sh(host, "rm -f /root/sparkrig-planted-*")
        # A deploy's reading runs the python stack's fact (python3 as root) on every run.
        result = run_deploy(LAB_INVENTORY, "--limit", host, "--dry")
        assert result.returncode == 0, result.log[-3000:]
        # uv's tool environment is rebuilt (python3 -m venv, its pip) when uv changes.
        again = run_deploy(
            LAB_INVENTORY,
            "--limit",
            host,
            "--data",
            "python_uv_version=0.13.8",
            "--data",
            'python_uv_sha256=["e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984"]',
        )
        assert again.returncode == 0, again.log[-3000:]
        assert _marks(host) == []
    finally:
        lab.run_ssh(host, "rm -f " + " ".join(f"~/{name}.py" for name in PLANTED))
        _root_sh(host, "rm -f /root/sparkrig-planted-*")
        assert run_deploy(LAB_INVENTORY, "--limit", host).returncode == 0


def test_a_predictable_upload_path_taken_first_blocks_no_root_update(first_converge):
    """Another local user (nobody) creates, first, the path pyinfra would upload a root file
    through (/tmp/pyinfra-<sha1 of the file's temporary name>): the update still lands,
    with its content."""
    assert first_converge.returncode == 0, first_converge.log
    host, dest = "lab-deb12", "/etc/default/earlyoom"
    taken = f"/tmp/pyinfra-{hashlib.sha1(b'/etc/default/.earlyoom.sparkrig-new').hexdigest()}"
    _root_sh(host, f"rm -f {taken}; runuser -u nobody -- sh -c 'echo taken > {taken}'")
    try:
        result = run_deploy(LAB_INVENTORY, "--limit", host, "--data", "watchdog_report_interval_s=0")
        assert result.returncode == 0, result.log[-3000:]
        assert " -r 0 " in _root_sh(host, f"cat {dest}"), _root_sh(host, f"cat {dest}")
        assert _root_sh(host, f"cat {taken}") == "taken\n"  # untouched: not the path used
    finally:
        _root_sh(host, f"rm -f {taken}")
        assert run_deploy(LAB_INVENTORY, "--limit", host).returncode == 0


def test_a_fifo_and_a_link_where_root_reads_the_venv_neither_hang_nor_leak(first_converge):
    """The venv's owner makes its lock a FIFO, then a link to a large root-only file: each
    deploy ends (the lock read as missing), and sends nothing of the file."""
    assert first_converge.returncode == 0, first_converge.log
    host, lock = "lab-deb13", "/opt/sparkrig/venv/sparkrig/requirements.lock"
    owner = _root_sh(host, "stat -c %U /opt/sparkrig/venv").strip()
    _root_sh(host, "head -c 8000000 /dev/zero | tr '\\0' S > /root/big-secret && chmod 600 /root/big-secret")
    try:
        for swap in (f"rm -f {lock} && mkfifo {lock}", f"rm -f {lock} && ln -s /root/big-secret {lock}"):
            _root_sh(host, f"runuser -u {owner} -- sh -c {shlex.quote(swap)}")
            result = run_deploy(LAB_INVENTORY, "--limit", host, "--dry", timeout=600)
            assert result.returncode == 0, result.log[-3000:]
            assert "SSSSSSSS" not in result.log
    finally:
        _root_sh(host, f"rm -f {lock} /root/big-secret")
        assert run_deploy(LAB_INVENTORY, "--limit", host).returncode == 0
