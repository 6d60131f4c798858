"""
Two rails per node in the lab: lab-deb12 and lab-deb13, linked by the ConnectX-7 STAND-IN
(cx7-standin), get a second STAND-IN veth pair (lab.link) as a second listed rail, each on its
own subnet. A veth has no PCI device and no RDMA device: no twin is found, and each node's
cluster.env says it has no RDMA device (no NCCL_IB_HCA); spark-cluster-check pings each peer
through each rail and skips --bandwidth on each, saying why; a second converge changes nothing.
Afterwards the second rail is unplugged and the lab's own inventory converged again.
"""

from __future__ import annotations

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import run_deploy

pytestmark = pytest.mark.lab

NODES = ("lab-deb12", "lab-deb13")
RAIL2 = "cx7-rail2"
ADDRESSES = {"lab-deb12": "192.168.110.11/24", "lab-deb13": "192.168.110.12/24"}
DEPLOY = "tests/converge/cluster_deploy.py"


def _limit() -> list[str]:
    return [arg for host in NODES for arg in ("--limit", host)]


def _inventory(tmp_path) -> str:
    inventory = tmp_path / "rails.py"
    inventory.write_text(
        "import copy\n"
        "from inventory.lab import lab as _lab\n"
        "lab = [(name, copy.deepcopy(data)) for name, data in _lab]\n"
        "for _name, _data in lab:\n"
        f"    if _name in {ADDRESSES!r}:\n"
        f"        _data['cluster_interfaces'][{RAIL2!r}] = {ADDRESSES!r}[_name]\n"
    )
    return str(inventory)


def test_two_rails_per_node_without_rdma_converge_check_and_say_so(lab_hosts, native_converge, tmp_path):
    if not set(NODES) <= {h.name for h in lab_hosts}:
        pytest.skip(f"the lab's cluster pair {NODES} is not up")
    assert native_converge.returncode == 0, native_converge.log[-3000:]  # the fleet converged: then a second rail
    inventory = _inventory(tmp_path)
    lab.link(*NODES, RAIL2)
    try:
        first = run_deploy(inventory, *_limit(), deploy=DEPLOY)
        assert first.returncode == 0, first.log[-3000:]
        for name in NODES:
            env = lab.run_ssh(name, "cat /etc/sparkrig/cluster.env").stdout
            assert (
                f"# no RDMA device behind cx7-standin, {RAIL2} (/sys/class/infiniband names none): "
                "NCCL_IB_HCA is not set and NCCL moves data over TCP sockets."
            ) in env, env
            assert (
                f"NCCL_SOCKET_IFNAME='cx7-standin,{RAIL2}'" in env or f"NCCL_SOCKET_IFNAME=cx7-standin,{RAIL2}" in env
            )
            assert "\nNCCL_IB_HCA=" not in env
            shown = lab.run_ssh(name, f"ip -4 -o addr show dev {RAIL2}").stdout
            assert ADDRESSES[name] in shown, shown
        assert "no RDMA device behind cx7-standin, cx7-rail2" in first.log, first.log[-3000:]
        check = lab.run_ssh("lab-deb12", "sudo spark-cluster-check --bandwidth", check=False)
        assert check.returncode == 0, check.stdout
        for line in (
            f"OK ping lab-deb13: 8972 bytes to 192.168.110.12 through {RAIL2}, not fragmented",
            "OK ping lab-deb13: 8972 bytes to 192.168.100.12 through cx7-standin, not fragmented",
            f"SKIP bandwidth {RAIL2} lab-deb13: no RDMA device behind {RAIL2} (a veth, as in sparkrig's lab",
            "SKIP bandwidth cx7-standin lab-deb13: no RDMA device behind cx7-standin",
        ):
            assert any(shown.startswith(line) for shown in check.stdout.splitlines()), (line, check.stdout)
        again = run_deploy(inventory, *_limit(), deploy=DEPLOY)
        assert again.returncode == 0 and again.changed() == {}, again.changed()
    finally:
        lab.unlink("lab-deb12", RAIL2)
        restored = run_deploy(LAB_INVENTORY, *_limit(), deploy=DEPLOY)
    assert restored.returncode == 0, restored.log[-3000:]
    assert RAIL2 not in lab.run_ssh("lab-deb13", "cat /etc/sparkrig/cluster.env").stdout
