"""
NCCL alike across the lab's cluster (lab-deb12 and lab-deb13). The lab has no NCCL: each
libnccl.so.2 here is a STAND-IN, a small file carrying NCCL's version line, placed where the
real ones live: the venv's nvidia-nccl-cu13 wheel (its .dist-info and
site-packages/nvidia/nccl/lib/libnccl.so.2, written as the venv's owner) and the system's
(/usr/lib/<multiarch>/libnccl.so.2, root's). The compliance suite's NCCL controls, run for real
over SSH against both nodes, pass while the nodes are alike, fail on both naming the node and
both builds once one node's build differs, and where the venv's owner replaced the library by a
link, fail that node naming why and its peer naming the node it depends on; `sparkrig report`
marks the cluster whose nodes differ.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import REPO

pytestmark = pytest.mark.lab

NODES = ("lab-deb12", "lab-deb13")
OWNERS = {"lab-deb12": "root", "lab-deb13": "spark"}  # the lab's python_venv_owner of each
VENV = "/opt/sparkrig/venv"  # python_venv_path's default, the lab's
CONTROL = "test_cluster.py::test_nccl_is_one_build_on_every_node"
STAND_IN = "STAND-IN for libnccl.so.2 (the lab has no NCCL), build {build}"


def _stand_in(build: str) -> str:
    """printf's format of a stand-in library: a NUL, NCCL's version line, a NUL, its build."""
    return f"\\177ELF {STAND_IN.format(build=build)}\\000NCCL version 2.27.7+cuda13.0\\000{build}\\000"


def _place(name: str, venv_build: str, system_build: str) -> None:
    """The stand-ins on ``name``: the venv's as its owner, the system's as root."""
    owner = OWNERS[name]
    site = f"{VENV}/lib/python3/site-packages"
    venv = (
        f"mkdir -p {site}/nvidia_nccl_cu13-2.27.7.dist-info {site}/nvidia/nccl/lib && "
        f"rm -f {site}/nvidia/nccl/lib/libnccl.so.2 && "
        f"printf '{_stand_in(venv_build)}' > {site}/nvidia/nccl/lib/libnccl.so.2"
    )
    system = (
        'd=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo "$(uname -m)-linux-gnu"); '
        f'mkdir -p "$d" && printf \'{_stand_in(system_build)}\' > "$d/libnccl.so.2"'
    )
    lab.run_ssh(
        name,
        f"sudo mkdir -p {VENV} && sudo chown {owner} {VENV} && "
        f"sudo runuser -u {owner} -- sh -c {shlex.quote(venv)} && sudo sh -c {shlex.quote(system)}",
    )


def _controls() -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/compliance/test_cluster.py",
            "-k",
            "nccl_is_one_build or one_nccl_version",  # not the env file's control: this lab is not converged
            "--inventory",
            LAB_INVENTORY,
            *[arg for name in NODES for arg in ("--limit", name)],
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "-n",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def stand_ins(lab_hosts):
    running = {host.name for host in lab_hosts}
    if not set(NODES) <= running:
        pytest.skip(f"the lab's cluster needs {' and '.join(NODES)} up")
    yield
    for name in NODES:
        lab.run_ssh(
            name,
            f"sudo rm -rf {VENV}/lib/python3 /usr/lib/*-linux-gnu/libnccl.so.2",
            check=False,
        )


def test_alike_passes_and_a_node_that_differs_fails_naming_it_and_both_builds(stand_ins):
    for name in NODES:
        _place(name, "one", "one")
    alike = _controls()
    assert alike.returncode == 0 and "4 passed" in alike.stdout, alike.stdout[-3000:] + alike.stderr[-2000:]

    _place("lab-deb13", "one", "two")  # the system's libnccl2: one version, another build
    differ = _controls()
    said = differ.stdout
    assert differ.returncode == 1, said[-3000:]
    for name in NODES:
        line = next(line for line in said.splitlines() if f"{name}: {CONTROL}" in line)
        assert "cluster lab: NCCL differs across its nodes: system libnccl2:" in line, line
        assert "lab-deb13 has NCCL version 2.27.7+cuda13.0 (sha256 " in line and "lab-deb12 has NCCL version" in line
    # On lab-deb13 itself, the venv's and the system's are one version in two builds: the env
    # file sets no loader variable, so a warning (the control passes).
    assert "one NCCL version, two builds" in said, said[-3000:]
    # sparkrig report reads the same builds in its one command per host, and marks the cluster.
    shown = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "report", LAB_INVENTORY, *[a for n in NODES for a in ("--limit", n)]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for name in NODES:
        assert f"{name}: cluster lab: NCCL differs across its nodes: system libnccl2: lab-deb13 has" in shown, shown
    assert "lab-deb13: one NCCL version, two builds: system libnccl2 is NCCL version 2.27.7+cuda13.0" in shown

    _place("lab-deb13", "one", "one")
    owner = OWNERS["lab-deb13"]
    lib = f"{VENV}/lib/python3/site-packages/nvidia/nccl/lib/libnccl.so.2"
    lab.run_ssh(
        "lab-deb13",
        f"sudo runuser -u {owner} -- sh -c {shlex.quote(f'rm -f {lib} && ln -s /etc/shadow {lib}')}",
    )
    linked = _controls().stdout
    for name, why in (("lab-deb13", "not a regular file (symbolic link)"), ("lab-deb12", "depends on lab-deb13")):
        line = next(line for line in linked.splitlines() if f"{name}: {CONTROL}" in line)
        assert why in line, line
