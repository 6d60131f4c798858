"""
The compliance suite's own reads, played against: a venv owner
who plants a program where the suite runs the venv's Python, and a cluster user whose
authorized_keys is a FIFO, then a link to a root-only file. The suite runs as a user runs
it (``sparkrig check INVENTORY``); each test restores what it changed.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

import pytest

import lab
from sparkrig.tools import check
from tests.conftest import LAB_INVENTORY
from tests.support import REPO

pytestmark = pytest.mark.lab
HOST = "lab-deb13"  # its venv is an ordinary user's, and it is in the lab's cluster
VENV = "/opt/sparkrig/venv"
PLANTER = "sparkrig-planter"  # a venv owner without sudo


def _root_sh(host: str, script: str) -> str:
    return lab.run_ssh(host, f"sudo sh -c {shlex.quote(script)}").stdout


def _suite(tmp_path: Path, inventory: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        check.command(inventory, [HOST], extra=["-n", "0", "-q", "-rfs", "--tb=short", *args]),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_python_planted_in_the_venv_never_runs_as_root_nor_as_the_suites_sudo_user(native_converge, tmp_path):
    """The venv belongs to a user without sudo, who replaces its bin/python with a program
    that leaves a mark naming the uid it ran as. The suite's read-only Python controls run:
    no mark of root nor of the suite's login user (passwordless sudo) appears."""
    assert native_converge.returncode == 0, native_converge.log
    login_uid = lab.run_ssh(HOST, "id -u").stdout.strip()
    owner = _root_sh(HOST, f"stat -c %U {VENV}").strip()
    python = _root_sh(HOST, f"readlink {VENV}/bin/python").strip()
    planted = f'#!/bin/sh\ntouch /tmp/sparkrig-ran-as-$(id -u)\nexec {python} "$@"\n'
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        "import runpy\n"
        f"_lab = runpy.run_path({str(REPO / LAB_INVENTORY)!r})\n"
        f"lab = [(n, {{**d, 'python_venv_owner': {PLANTER!r}}} if n == {HOST!r} else d) for n, d in _lab['lab']]\n"
    )
    _root_sh(
        HOST, f"useradd -M -s /bin/sh {PLANTER} 2>/dev/null; chown -R -h {PLANTER} {VENV}; rm -f /tmp/sparkrig-ran-as-*"
    )
    try:
        lab.run_ssh(
            HOST,
            f"sudo runuser -u {PLANTER} -- sh -c "
            f"{shlex.quote(f'rm {VENV}/bin/python && cat > {VENV}/bin/python && chmod 755 {VENV}/bin/python')}",
            input=planted,
        )
        # The plant works: the venv's Python, run, leaves its mark.
        _root_sh(HOST, f"runuser -u {PLANTER} -- {VENV}/bin/python -c pass")
        planter_uid = _root_sh(HOST, f"id -u {PLANTER}").strip()
        assert _root_sh(HOST, "ls /tmp/sparkrig-ran-as-* 2>/dev/null; true").split() == [
            f"/tmp/sparkrig-ran-as-{planter_uid}"
        ]
        _root_sh(HOST, "rm -f /tmp/sparkrig-ran-as-*")
        run = _suite(tmp_path, str(inventory), "-k", "python_stack or source_builds", "-m", "not action")
        assert "passed" in run.stdout or "failed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
        marks = _root_sh(HOST, "ls /tmp/sparkrig-ran-as-* 2>/dev/null; true").split()
        assert "/tmp/sparkrig-ran-as-0" not in marks, run.stdout[-2000:]
        assert f"/tmp/sparkrig-ran-as-{login_uid}" not in marks, run.stdout[-2000:]
    finally:
        _root_sh(
            HOST,
            f"rm -f {VENV}/bin/python /tmp/sparkrig-ran-as-*; ln -s {python} {VENV}/bin/python; "
            f"chown -R -h {owner} {VENV}; userdel {PLANTER}",
        )


CLUSTER_USER = "sparkrig-clusterer"  # not the lab's login user: its authorized_keys lets the suite in


def _as_cluster_user(tmp_path: Path) -> str:
    """An inventory in which the cluster's user is CLUSTER_USER (the same on every node, as the settings ask)."""
    inventory = tmp_path / "cluster-inventory.py"
    inventory.write_text(
        "import runpy\n"
        f"_lab = runpy.run_path({str(REPO / LAB_INVENTORY)!r})\n"
        f"lab = [(n, {{**d, 'cluster_user': {CLUSTER_USER!r}}} if d.get('cluster_name') else d) "
        "for n, d in _lab['lab']]\n"
    )
    return str(inventory)


@pytest.fixture
def authorized_keys():
    """CLUSTER_USER, made for the test (and removed after it), and its authorized_keys' path."""
    _root_sh(
        HOST,
        f"useradd -m -s /bin/sh {CLUSTER_USER} && runuser -u {CLUSTER_USER} -- mkdir -m 700 /home/{CLUSTER_USER}/.ssh",
    )
    yield f"/home/{CLUSTER_USER}/.ssh/authorized_keys", CLUSTER_USER
    _root_sh(HOST, f"userdel -r {CLUSTER_USER} 2>/dev/null; rm -f /root/sparkrig-secret")


def test_a_fifo_as_the_cluster_users_authorized_keys_fails_its_control_at_once(
    native_converge, tmp_path, authorized_keys
):
    """The cluster user makes its authorized_keys a FIFO: the suite neither hangs in its
    reading nor in the control; the control fails, saying the file could not be read."""
    assert native_converge.returncode == 0, native_converge.log
    path, user = authorized_keys
    _root_sh(HOST, f"runuser -u {user} -- sh -c {shlex.quote(f'rm -f {path} && mkfifo {path}')}")
    started = time.monotonic()
    run = _suite(tmp_path, _as_cluster_user(tmp_path), "-k", "authorized_keys", timeout=150)
    assert time.monotonic() - started < 100, run.stdout[-2000:]
    assert "1 failed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


def test_a_link_as_the_cluster_users_authorized_keys_sends_nothing_of_its_target(
    native_converge, tmp_path, authorized_keys
):
    """The cluster user links its authorized_keys to a root-only file whose line looks like
    a cluster key: the control fails without that line in its message, the run's output or
    its JUnit."""
    assert native_converge.returncode == 0, native_converge.log
    path, user = authorized_keys
    secret = "SPARKRIG-SECRET-LINE sparkrig-cluster:x"
    _root_sh(HOST, f"echo {shlex.quote(secret)} > /root/sparkrig-secret && chmod 600 /root/sparkrig-secret")
    _root_sh(HOST, f"runuser -u {user} -- sh -c {shlex.quote(f'rm -f {path} && ln -s /root/sparkrig-secret {path}')}")
    junit = tmp_path / "junit.xml"
    run = _suite(tmp_path, _as_cluster_user(tmp_path), "-k", "authorized_keys", f"--junitxml={junit}", timeout=300)
    assert "1 failed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    assert "SPARKRIG-SECRET-LINE" not in run.stdout + run.stderr + junit.read_text()
