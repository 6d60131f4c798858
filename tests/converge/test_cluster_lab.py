"""
The lab's cluster: lab-deb12 and lab-deb13, linked by the ConnectX-7 STAND-IN (a veth pair
straight between their namespaces, lab/model.py). A link taken down fails spark-cluster-check
naming it, and one run brings it back (the deploy's own connection, on eth0, survives); a
node added to the cluster in the inventory is trusted after one run, and no longer once
removed.
"""

from __future__ import annotations

import pytest

import lab
from lab.config import CLUSTER_KEYS
from tests.conftest import LAB_INVENTORY
from tests.support import run_deploy

pytestmark = pytest.mark.lab

NODES = ("lab-deb12", "lab-deb13")
LINK = "cx7-standin"
APPLY = "Cluster | Apply the cluster link (its interfaces only), then prove a new SSH connection"


def _limit(*hosts: str) -> list[str]:
    """pyinfra's --limit for these hosts (one option each: a comma is no list there)."""
    return [arg for host in hosts for arg in ("--limit", host)]


def _check(name: str):
    return lab.run_ssh(name, "sudo spark-cluster-check", check=False)


def _ssh_as_spark(name: str, address: str):
    """The cluster user on ``name`` logs in to ``address`` without a prompt (exit status, output)."""
    probe = f"ssh -n -o BatchMode=yes -o ConnectTimeout=5 {address} hostname"
    return lab.run_ssh(name, f"{probe} 2>&1; echo exit=$?", check=False).stdout


def test_a_link_taken_down_fails_the_check_naming_it_and_one_run_brings_it_back(first_converge):
    assert first_converge.returncode == 0, first_converge.log[-3000:]
    for name in NODES:
        assert _check(name).returncode == 0, _check(name).stdout
    lab.run_ssh("lab-deb12", f"sudo ip link set {LINK} down")
    try:
        for name in NODES:  # the far end loses its carrier too
            result = _check(name)
            assert result.returncode & 4, result.stdout
            assert f"FAIL link {LINK}: {LINK} is " in result.stdout, result.stdout
    finally:
        restored = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert restored.returncode == 0, restored.log[-3000:]
    assert restored.changed() == {"lab-deb12": [APPLY]}, restored.changed()
    for name in NODES:
        result = _check(name)
        assert result.returncode == 0 and f"OK link {LINK}: up" in result.stdout, result.stdout
    again = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert again.returncode == 0 and again.changed() == {}, again.changed()


def test_a_run_that_leaves_out_a_node_changes_nothing_of_the_cluster(first_converge):
    assert first_converge.returncode == 0
    result = run_deploy(LAB_INVENTORY, "--limit", "lab-deb12", "--data", "cluster_mtu=1500")
    assert result.returncode == 0, result.log[-3000:]
    assert "cluster lab: lab-deb13 not in this run (--limit): nothing of the cluster is changed" in result.log
    assert result.changed() == {}, result.changed()


def test_a_node_added_is_trusted_after_one_run_and_no_longer_once_removed(first_converge, tmp_path):
    assert first_converge.returncode == 0
    added, link = "lab-deb13-b", "cx7-standin2"
    inventory = tmp_path / "three.py"
    # lab-deb13-b joins through a second stand-in link to lab-deb12 (a star: lab-deb13 and
    # lab-deb13-b share no link, and need none to trust each other).
    inventory.write_text(
        "import copy\n"
        "from inventory.lab import lab as _lab\n"
        "lab = [(name, copy.deepcopy(data)) for name, data in _lab]\n"
        "_hub = dict(lab)['lab-deb12']\n"
        f"_hub['cluster_interfaces']['{link}'] = '192.168.101.11/24'\n"
        f"_new = dict(lab)['{added}']\n"
        "_new.update({k: v for k, v in _hub.items() if k in ('cluster_name', 'cluster_user', 'cluster_key_dir')})\n"
        f"_new['cluster_interfaces'] = {{'{link}': '192.168.101.13/24'}}\n"
    )
    hosts = _limit(*NODES, added)
    lab.link("lab-deb12", added, link)
    try:
        joined = run_deploy(str(inventory), *hosts)
        assert joined.returncode == 0, joined.log[-3000:]
        assert _ssh_as_spark(added, "192.168.101.11") == "lab-deb12\nexit=0\n"
        assert _ssh_as_spark("lab-deb12", "192.168.101.13") == f"{added}\nexit=0\n"
        pinned = lab.run_ssh("lab-deb13", "cat /etc/sparkrig/cluster/known_hosts").stdout
        assert "192.168.101.13 ssh-ed25519 " in pinned
        assert _check(added).returncode == 0, _check(added).stdout

        removed = run_deploy(LAB_INVENTORY, *hosts)
        assert removed.returncode == 0, removed.log[-3000:]
        assert "192.168.101.13" not in lab.run_ssh("lab-deb12", "cat /etc/sparkrig/cluster/known_hosts").stdout
        left = lab.run_ssh(added, "sudo ls /etc/sparkrig/cluster; grep -c sparkrig-cluster: ~/.ssh/authorized_keys",
                           check=False).stdout
        assert left.split() == ["0"], f"{added} keeps cluster files or trust: {left}"
        # Even with a copy of the cluster key and its old address, the removed node is refused.
        for name, address in (("lab-deb12", "192.168.101.11/24"), (added, "192.168.101.13/24")):
            lab.run_ssh(name, f"sudo ip addr replace {address} dev {link} && sudo ip link set {link} up")
        lab.run_ssh(added, "umask 077 && cat > /tmp/cluster-key", input=(CLUSTER_KEYS / "lab" / "id_ed25519").read_text())
        said = lab.run_ssh(added, "ssh -n -i /tmp/cluster-key -o IdentitiesOnly=yes -o BatchMode=yes "
                                  "-o UserKnownHostsFile=/tmp/kh -o StrictHostKeyChecking=accept-new "
                                  "192.168.101.11 true 2>&1; echo exit=$?; rm -f /tmp/cluster-key /tmp/kh",
                           check=False).stdout
        assert said.endswith("exit=255\n") and "Permission denied (publickey" in said, said
    finally:
        lab.unlink("lab-deb12", link)
    assert _check("lab-deb12").returncode == 0, _check("lab-deb12").stdout
    settled = run_deploy(LAB_INVENTORY, *hosts)
    assert settled.returncode == 0 and settled.changed() == {}, settled.changed()
