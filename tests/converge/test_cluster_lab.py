"""
The lab's cluster: lab-deb12 and lab-deb13, linked by the ConnectX-7 STAND-IN (a veth pair
straight between their namespaces, lab/model.py). lab-deb13 runs DGX OS's network stack
(netplan, NetworkManager renders eth0, networkd off, NetworkManager's DHCP profile on the
port: flavour debian13-nm, lab/dgxos.py; no udev in a container: its STAND-INS there are a
read-only /sys for NetworkManager and networkd, and sparkrig's own hand-over in place of netplan's
udev rule), lab-deb12 systemd-networkd alone: each change of the link below goes through both
paths. A link taken down fails spark-cluster-check naming it, and
one run brings it back (the deploy's own connection, on eth0, survives); a node added to the
cluster in the inventory is trusted after one run, and no longer once removed; a node
reinstalled rejoins in one run, its old key refused.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import lab
from lab.config import HOSTS_DIR, KNOWN_HOSTS
from sparkrig.operations.cluster import link as cl_link
from tests.conftest import LAB_INVENTORY, write_stock_files
from tests.support import PYINFRA, REPO, host_table, run_check, run_deploy

pytestmark = pytest.mark.lab

NODES = ("lab-deb12", "lab-deb13")
NETPLAN_NODE = "lab-deb13"  # DGX OS's stack; lab-deb12 runs networkd alone
LINK = "cx7-standin"
APPLY = "Cluster | Cluster link: written, applied to its interfaces alone, kept once a new SSH connection confirms it"
LINK_FILES = {
    "lab-deb12": f"/etc/systemd/network/40-sparkrig-cluster-{LINK}.network",
    "lab-deb13": "/etc/netplan/40-sparkrig-cluster.yaml",
}
ADDRESSES = {"lab-deb12": "192.168.100.11", "lab-deb13": "192.168.100.12"}
KEY = "/etc/sparkrig/cluster/id_ed25519"
LINK_DIR = "/var/lib/sparkrig/cluster-link"
# Each file netplan's generator writes in /run (inode, change time): a rewritten file has
# another.
RUN_FILES = (
    "sudo find /run/systemd/network /run/NetworkManager/conf.d /run/NetworkManager/system-connections "
    "/run/udev/rules.d -type f \\( -name '*netplan*' -o -name 10-globally-managed-devices.conf \\) "
    "-printf '%p %i %C@\\n' 2>/dev/null | sort"
)


def _limit(*hosts: str) -> list[str]:
    """pyinfra's --limit for these hosts (one option each: a comma is no list there)."""
    return [arg for host in hosts for arg in ("--limit", host)]


def _check(name: str):
    return lab.run_ssh(name, "sudo spark-cluster-check", check=False)


def _moved(tmp_path, confirm_seconds: int) -> str:
    """The lab's inventory with the cluster moved to 192.168.77.0/24."""
    inventory = tmp_path / "moved.py"
    inventory.write_text(
        "import copy\n"
        "from inventory.lab import lab as _lab\n"
        "lab = [(name, copy.deepcopy(data)) for name, data in _lab]\n"
        "for _name, _data in lab:\n"
        "    if _data.get('cluster_name'):\n"
        f"        _data['cluster_interfaces'] = {{'{LINK}': {{'lab-deb12': '192.168.77.11/24', "
        "'lab-deb13': '192.168.77.12/24'}[_name]}\n"
        f"        _data['cluster_link_confirm_seconds'] = {confirm_seconds}\n"
    )
    return str(inventory)


def _rolled_back(before: dict) -> None:
    """Old files, old addresses, reachable (the fault's NAT gone, the route back), and a run
    of the lab's own inventory changes nothing."""
    for name in NODES:
        assert lab.run_ssh(name, f"sudo cat {LINK_FILES[name]}").stdout == before[name]
        shown = lab.run_ssh(name, f"ip -4 -o addr show dev {LINK}").stdout
        assert "192.168.77." not in shown and "192.168.100." in shown, shown
        assert _check(name).returncode == 0, _check(name).stdout
    again = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert again.returncode == 0 and again.changed() == {}, again.changed()


def _ssh_as_spark(name: str, address: str):
    """The cluster user on ``name`` logs in to ``address`` without a prompt (exit status, output)."""
    probe = f"ssh -n -o BatchMode=yes -o ConnectTimeout=5 {address} hostname"
    return lab.run_ssh(name, f"{probe} 2>&1; echo exit=$?", check=False).stdout


def _on_dgx_os_stack(name: str) -> None:
    """The cluster port of a node on DGX OS's stack is networkd's: netplan's file for it as
    netplan wrote it (networkd, running as systemd-network, reads it), NetworkManager lets go of
    it (its DHCP "Wired connection" no longer runs there) and networkd stays off for eth0."""
    said = lab.run_ssh(
        name,
        f"sudo stat -c '%a %U:%G' /run/systemd/network/10-netplan-{LINK}.network; "
        "nmcli -t -f DEVICE,STATE,CONNECTION device; networkctl list --no-legend",
    ).stdout
    assert "640 root:systemd-network\n" in said, said
    assert f"{LINK}:unmanaged:\n" in said and "eth0:connected:netplan-eth0\n" in said, said
    assert re.search(rf"{LINK} +ether +routable +configured", said), said
    assert re.search(r"eth0 +ether +\S+ +unmanaged", said), said


def test_a_link_taken_down_fails_the_check_naming_it_and_one_run_brings_it_back(native_converge):
    """On the node on DGX OS's stack: the run that brings the link back rewrites no file of
    another interface in /run (netplan's generator is never run
    over the real /etc/netplan, which `netplan generate`'s daemon-reload would do), and a second
    run changes nothing; a port NetworkManager took back is handed over again by one run."""
    assert native_converge.returncode == 0, native_converge.log[-3000:]
    for name in NODES:
        assert _check(name).returncode == 0, _check(name).stdout
    _on_dgx_os_stack(NETPLAN_NODE)
    lab.run_ssh(NETPLAN_NODE, f"sudo ip link set {LINK} down")
    others = lab.run_ssh(NETPLAN_NODE, RUN_FILES).stdout
    assert "/run/NetworkManager/system-connections/netplan-eth0.nmconnection " in others, others
    try:
        for name in NODES:  # the far end loses its carrier too
            result = _check(name)
            assert result.returncode & 4, result.stdout
            assert f"FAIL link {LINK}: {LINK} is " in result.stdout, result.stdout
    finally:
        restored = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert restored.returncode == 0, restored.log[-3000:]
    assert restored.changed() == {NETPLAN_NODE: [APPLY]}, restored.changed()
    for name in NODES:
        result = _check(name)
        assert result.returncode == 0 and f"OK link {LINK}: up" in result.stdout, result.stdout
    after = lab.run_ssh(NETPLAN_NODE, RUN_FILES).stdout
    port = f"/run/systemd/network/10-netplan-{LINK}."
    assert [f for f in after.splitlines() if not f.startswith(port)] == [
        f for f in others.splitlines() if not f.startswith(port)
    ], (others, after)
    _on_dgx_os_stack(NETPLAN_NODE)
    # A port keeps its address while its peer's is down (a peer rebooting): networkd's
    # ConfigureWithoutCarrier, netplan's ignore-carrier.
    for name in NODES:
        peer = next(n for n in NODES if n != name)
        lab.run_ssh(peer, f"sudo ip link set {LINK} down")
        try:
            shown = lab.run_ssh(name, f"sleep 1; ip -4 -o addr show dev {LINK}").stdout
            assert f" {ADDRESSES[name]}/24 " in shown, (name, shown)
        finally:
            lab.run_ssh(peer, f"sudo ip link set {LINK} up")
    again = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert again.returncode == 0 and again.changed() == {}, again.changed()
    # NetworkManager holding the port again, as it holds every port of DGX OS before the first
    # run (its DHCP profile would take the address off): one run hands it over at once.
    lab.run_ssh(NETPLAN_NODE, f"sudo nmcli device set {LINK} managed yes")
    taken = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert taken.returncode == 0 and taken.changed() == {NETPLAN_NODE: [APPLY]}, taken.changed()
    _on_dgx_os_stack(NETPLAN_NODE)


def _confirm(name: str, peers: bool) -> str:
    """The real confirm script, as the deploy runs it through a new connection: its answer."""
    settings = {"lab-deb12": "192.168.100.11/24", "lab-deb13": "192.168.100.12/24"}
    peer = [a for n, a in ADDRESSES.items() if n != name]
    script = cl_link.render_confirm([(LINK, settings[name], 9000, peer)], peers=peers)
    return lab.run_ssh(name, "sudo sh -s", input=script).stdout.strip()


def _arm(name: str, applied: int) -> None:
    """A change of the link armed by hand, as the deploy arms it: the rollback timer (its
    service records that it ran: the rollback itself is proven by the fault tests) and the
    apply's status."""
    lab.run_ssh(
        name,
        f"sudo sh -c 'set -e; d={LINK_DIR}; rm -rf $d; mkdir -m 700 $d; touch $d/armed; "
        f'echo "touch $d/rollback-ran" >$d/rollback.sh; echo apply-log-end >$d/apply.log; '
        f"echo {applied} >$d/applied; systemd-run --quiet --unit={cl_link.ROLLBACK_UNIT} "
        f"--on-active=300s /bin/sh $d/rollback.sh'",
    )


def _timer(name: str) -> str:
    return lab.run_ssh(name, f"systemctl is-active {cl_link.ROLLBACK_UNIT}.timer", check=False).stdout.strip()


def test_the_confirmation_keeps_a_change_only_when_it_applied_and_the_link_works(native_converge):
    """The confirm script itself, run on a node: it keeps the change (stops the rollback timer)
    only when the apply succeeded and the port is up with its address and MTU and reaches its
    peer; an apply that failed is rolled back at once; a port without its address, or (but
    on the first node of a run) with no peer answering, keeps the timer running."""
    assert native_converge.returncode == 0
    name, peer = "lab-deb12", "lab-deb13"
    try:
        _arm(name, applied=0)
        assert _confirm(name, peers=True) == "confirmed"
        assert _timer(name) == "inactive"
        assert lab.run_ssh(name, f"sudo ls {LINK_DIR}").stdout.split() == ["applied", "apply.log", "rollback.sh"]

        _arm(name, applied=1)
        assert _confirm(name, peers=True) == "failed: apply-log-end"
        assert _timer(name) == "inactive"
        lab.run_ssh(
            name, f"for i in $(seq 50); do sudo test -f {LINK_DIR}/rollback-ran && exit; sleep 0.1; done; exit 1"
        )

        _arm(name, applied=0)
        lab.run_ssh(name, f"sudo ip addr del 192.168.100.11/24 dev {LINK}")
        assert _confirm(name, peers=False) == f"link: {LINK}: no address 192.168.100.11/24"
        assert _timer(name) == "active"
        lab.run_ssh(name, f"sudo ip addr add 192.168.100.11/24 dev {LINK}")
        lab.run_ssh(name, f"sudo ip link set {LINK} mtu 1500")
        assert _confirm(name, peers=False) == f"link: {LINK}: MTU 1500, not 9000"
        lab.run_ssh(name, f"sudo ip link set {LINK} mtu 9000")
        lab.run_ssh(peer, f"sudo ip link set {LINK} down")
        assert _confirm(name, peers=True) == f"link: {LINK}: no answer from 192.168.100.12"
        assert _timer(name) == "active"
        assert _confirm(name, peers=False) == "confirmed"  # the first node: up, with its address
        assert _timer(name) == "inactive"
    finally:
        lab.run_ssh(name, f"sudo systemctl stop {cl_link.ROLLBACK_UNIT}.timer; sudo rm -rf {LINK_DIR}", check=False)
        lab.run_ssh(peer, f"sudo ip link set {LINK} up", check=False)
    settled = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert settled.returncode == 0 and set(settled.changed()) <= set(NODES), settled.log[-3000:]
    for node in NODES:
        assert _check(node).returncode == 0, _check(node).stdout


def test_a_node_whose_link_reaches_no_peer_rolls_back_by_itself(native_converge, tmp_path):
    """The cluster moved to 192.168.77.0/24 while no node answers a ping (a FAULT the lab
    makes: ICMP echo ignored): the first node changed is kept (up, with its address: its
    peer has not changed yet); the next cannot reach it, is not kept, rolls back by itself,
    and the run fails for it saying why. The lab's own inventory brings all back."""
    assert native_converge.returncode == 0
    before = {name: lab.run_ssh(name, f"sudo cat {LINK_FILES[name]}").stdout for name in NODES}
    for name in NODES:
        lab.run_ssh(name, "sudo sysctl -q -w net.ipv4.icmp_echo_ignore_all=1")
    try:
        moved = run_deploy(_moved(tmp_path, confirm_seconds=20), *_limit(*NODES))
    finally:
        for name in NODES:
            lab.run_ssh(name, "sudo sysctl -q -w net.ipv4.icmp_echo_ignore_all=0")
        back = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert moved.returncode != 0, moved.log[-3000:]
    kept = [name for name in NODES if APPLY in moved.changed().get(name, [])]
    found = re.search(
        r"\[(lab-deb1[23])\] +sparkrig: cluster lab: the link change was not confirmed \(the link is "
        rf"not up as configured: {LINK}: no answer from 192\.168\.77\.1[12]\)",
        moved.log,
    )
    assert found and len(kept) == 1 and found.group(1) != kept[0], (kept, moved.log[-3000:])
    rolled = found.group(1)
    assert re.search(rf"\[{rolled}\] +sparkrig: cluster lab: rolled back; a new SSH connection works again", moved.log)
    # The lab's inventory: the node kept on the moved subnet comes back, the rolled-back one
    # was back already.
    assert back.returncode == 0, back.log[-3000:]
    assert set(back.changed()) == set(kept) and APPLY in back.changed()[kept[0]], back.changed()
    _rolled_back(before)


def test_a_rebooted_cluster_comes_up_as_it_was_left(native_converge):
    """Both nodes rebooted (the lab restarts them): the link comes up from the files alone
    (on DGX OS's stack, netplan's boot generator and NetworkManager's setting), the check
    passes, and a run changes nothing."""
    assert native_converge.returncode == 0
    for name in NODES:
        lab.restart(name)
    for name in NODES:
        result = _check(name)
        assert result.returncode == 0 and f"OK link {LINK}: up" in result.stdout, result.stdout
    _on_dgx_os_stack(NETPLAN_NODE)
    again = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert again.returncode == 0 and again.changed() == {}, again.changed()


def test_a_run_that_leaves_out_a_node_changes_nothing_of_the_cluster(native_converge):
    assert native_converge.returncode == 0
    result = run_deploy(LAB_INVENTORY, "--limit", "lab-deb12", "--data", "cluster_mtu=1500")
    assert result.returncode == 0, result.log[-3000:]
    assert "cluster lab: lab-deb13 not in this run (--limit): nothing of the cluster is changed" in result.log
    assert result.changed() == {}, result.changed()


def test_a_node_added_is_trusted_after_one_run_and_no_longer_once_removed(native_converge, tmp_path):
    assert native_converge.returncode == 0
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
        removed_key = lab.run_ssh(added, f"sudo cat {KEY}").stdout  # what the node keeps after it leaves
        assert removed_key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        assert removed_key != lab.run_ssh("lab-deb13", f"sudo cat {KEY}").stdout  # one pair per node

        removed = run_deploy(LAB_INVENTORY, *hosts)
        assert removed.returncode == 0, removed.log[-3000:]
        assert "192.168.101.13" not in lab.run_ssh("lab-deb12", "cat /etc/sparkrig/cluster/known_hosts").stdout
        left = lab.run_ssh(
            added, "sudo ls /etc/sparkrig/cluster; grep -c sparkrig-cluster: ~/.ssh/authorized_keys", check=False
        ).stdout
        assert left.split() == ["0"], f"{added} keeps cluster files or trust: {left}"
        # Its own key, which it still holds, logs in from nowhere: neither from its old address
        # nor from a remaining node's (anyone on the link can take an address of from=).
        for name, address in (("lab-deb12", "192.168.101.11/24"), (added, "192.168.101.13/24")):
            lab.run_ssh(name, f"sudo ip addr replace {address} dev {link} && sudo ip link set {link} up")
        for source, target in ((added, "192.168.101.11"), ("lab-deb13", "192.168.100.11")):
            lab.run_ssh(source, "umask 077 && cat > /tmp/removed-key", input=removed_key)
            said = lab.run_ssh(
                source,
                "ssh -n -F /dev/null -i /tmp/removed-key -o IdentitiesOnly=yes -o BatchMode=yes "
                "-o UserKnownHostsFile=/tmp/kh -o StrictHostKeyChecking=accept-new "
                f"{target} true 2>&1; echo exit=$?; rm -f /tmp/removed-key /tmp/kh",
                check=False,
            ).stdout
            assert said.endswith("exit=255\n") and "Permission denied (publickey" in said, (source, said)
    finally:
        lab.unlink("lab-deb12", link)
    assert _check("lab-deb12").returncode == 0, _check("lab-deb12").stdout
    settled = run_deploy(LAB_INVENTORY, *hosts)
    assert settled.returncode == 0 and settled.changed() == {}, settled.changed()


def _pinned(name: str, address: str) -> list[str]:
    """The host keys ``name``'s cluster known_hosts pins for ``address``."""
    text = lab.run_ssh(name, "cat /etc/sparkrig/cluster/known_hosts").stdout
    return sorted(line.split(" ", 1)[1] for line in text.splitlines() if line.startswith(f"{address} "))


def _host_keys(name: str) -> list[str]:
    return sorted(lab.run_ssh(name, "cat /etc/ssh/ssh_host_*_key.pub | cut -d' ' -f1,2").stdout.splitlines())


def test_a_node_reinstalled_rejoins_and_passes_the_suite_in_one_run_and_its_old_key_is_refused(native_converge):
    """lab-deb13 installed afresh from its image at the same address (new host keys, no cluster
    files). The controller refuses it until its owner accepts the new host key (the lab reads it
    from the box's own files, as an owner reads it on the box's console); then one run re-pins it
    on lab-deb12, replaces its key pair everywhere, and leaves it passing the whole suite, its
    controls that act included: the fleet's reinstalled box, on DGX OS's network stack."""
    assert native_converge.returncode == 0
    node, other, address = "lab-deb13", "lab-deb12", "192.168.100.12"
    for name in NODES:
        assert _check(name).returncode == 0, _check(name).stdout
    old_key, old_host_keys = lab.run_ssh(node, f"sudo cat {KEY}").stdout, _host_keys(node)
    assert _pinned(other, address) == old_host_keys
    trusted = KNOWN_HOSTS.read_text()
    started = time.monotonic()
    lab.recreate(node)
    write_stock_files(node)
    recreated = time.monotonic()
    accepted = KNOWN_HOSTS.read_text()  # recreate re-pinned the box from its own files
    lab_address = next(h["address"] for h in json.loads(lab.inventory_path().read_text())["hosts"] if h["name"] == node)
    # The controller still pins the old host key: pyinfra refuses the box and says what to do.
    KNOWN_HOSTS.write_text(trusted)
    try:
        refused = subprocess.run(
            [PYINFRA, "-y", "--limit", node, LAB_INVENTORY, "fact", "server.Hostname"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        # The owner's step: the old key removed, the new one accepted once checked against the box's.
        for label in (lab_address, node):
            subprocess.run(["ssh-keygen", "-R", label, "-f", str(KNOWN_HOSTS)], check=True, capture_output=True)
        with KNOWN_HOSTS.open("a") as known:
            known.writelines(f"{line}\n" for line in accepted.splitlines() if line.split()[0] in (lab_address, node))
        KNOWN_HOSTS.with_name(KNOWN_HOSTS.name + ".old").unlink(missing_ok=True)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in said, said[-3000:]
    assert f"ssh-keygen -R {lab_address}" in said, said[-3000:]
    assert sorted(KNOWN_HOSTS.read_text().splitlines()) == sorted(accepted.splitlines())

    converging = time.monotonic()
    rejoined = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    converged = time.monotonic()
    assert rejoined.returncode == 0, rejoined.log[-3000:]
    for name in NODES:
        assert _check(name).returncode == 0, _check(name).stdout
    suite = run_check(LAB_INVENTORY, [node], "-rfE")
    assert suite.returncode == 0, (suite.stdout + suite.stderr)[-6000:]
    assert any(line.startswith(f"{node} ") for line in host_table(suite.stdout)), suite.stdout[-3000:]
    new_host_keys = _host_keys(node)
    assert not set(new_host_keys) & set(old_host_keys)
    assert _pinned(other, address) == new_host_keys  # the new host keys alone
    assert lab.run_ssh(node, f"sudo cat {KEY}").stdout != old_key  # a new pair
    admitted = lab.run_ssh(other, f"grep -c ' sparkrig-cluster:lab:{node}$' .ssh/authorized_keys").stdout
    assert admitted == "1\n", admitted  # its new key alone
    # The old pair, used from the node's own cluster address (inside from=), is refused.
    lab.run_ssh(node, "umask 077 && cat > /tmp/old-key", input=old_key)
    said = lab.run_ssh(
        node,
        "ssh -n -F /dev/null -i /tmp/old-key -o IdentitiesOnly=yes -o BatchMode=yes "
        f"-o UserKnownHostsFile=/etc/sparkrig/cluster/known_hosts -b {address} "
        "192.168.100.11 true 2>&1; echo exit=$?; rm -f /tmp/old-key",
        check=False,
    ).stdout
    assert said.endswith("exit=255\n") and "Permission denied (publickey" in said, said
    again = run_deploy(LAB_INVENTORY, *_limit(*NODES))
    assert again.returncode == 0 and again.changed() == {}, again.changed()
    print(
        f"reinstall rejoin: recreate {recreated - started:.0f} s, converge {converged - converging:.0f} s, "
        f"second converge {time.monotonic() - converged:.0f} s, whole test {time.monotonic() - started:.0f} s"
    )


def test_a_link_change_that_cuts_the_controller_off_rolls_back_by_itself(native_converge, tmp_path):
    """The controller reaches both nodes through NAT, as 192.168.77.50 (a FAULT the lab makes:
    no check on the controller can see it), and the inventory moves the cluster to
    192.168.77.0/24: the first node to apply it answers the controller through the link and is
    cut off. It puts its old link files back by itself; the other node is not changed."""
    assert native_converge.returncode == 0
    inventory = _moved(tmp_path, confirm_seconds=20)
    before = {name: lab.run_ssh(name, f"sudo cat {LINK_FILES[name]}").stdout for name in NODES}
    for name in NODES:
        lab.appear_as(name, "192.168.77.50")
    try:
        started = time.monotonic()
        cut = run_deploy(inventory, *_limit(*NODES))
        took = time.monotonic() - started
    finally:
        for name in NODES:
            lab.appear_as(name, None)
    assert cut.returncode != 0, cut.log[-3000:]
    # Before the timer fired no new connection got through; the one after it may see it fired.
    assert re.search(
        r"the link change was not confirmed \((no new SSH connection|the host rolled back already)\)", cut.log
    ), cut.log[-3000:]
    assert "rolled back; a new SSH connection works again" in cut.log, cut.log[-3000:]
    assert "the link is not changed here, as a node before this one did not confirm its change" in cut.log
    assert took < 240, took
    _rolled_back(before)


def test_a_node_that_reboots_before_its_change_is_confirmed_rolls_back_at_boot(native_converge, tmp_path):
    """The change above, cut off the same way, and the first node rebooted while it waits for
    the confirmation (a FAULT: the lab restarts it): the rollback timer dies with the reboot,
    so the node rolls back at boot, before its network starts, and is reachable again with its
    old link; the other node is not changed."""
    assert native_converge.returncode == 0
    inventory = _moved(tmp_path, confirm_seconds=120)
    before = {name: lab.run_ssh(name, f"sudo cat {LINK_FILES[name]}").stdout for name in NODES}
    # Read from the controller: the node, cut off, answers no SSH connection. pyinfra picks
    # which node goes first; the node that applied the change is the one rebooted.
    state = {name: HOSTS_DIR / name / "rootfs" / "var/lib/sparkrig/cluster-link" for name in NODES}
    for name in NODES:
        lab.appear_as(name, "192.168.77.50")
    try:
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(run_deploy, inventory, *_limit(*NODES))
            deadline = time.monotonic() + 600
            applied = []
            while not applied and not running.done():
                assert time.monotonic() < deadline, "the change was never applied"
                time.sleep(0.5)
                applied = [n for n in NODES if (state[n] / "armed").exists() and (state[n] / "applied").exists()]
            assert not running.done(), running.result().log[-3000:]
            lab.restart(applied[0])
            cut = running.result()
    finally:
        for name in NODES:
            lab.appear_as(name, None)
    assert cut.returncode != 0, cut.log[-3000:]
    assert "the link change was not confirmed (the host rolled back already)" in cut.log, cut.log[-3000:]
    assert "the link is not changed here, as a node before this one did not confirm its change" in cut.log
    journal = lab.run_ssh(applied[0], "sudo journalctl -b -t sparkrig --no-pager").stdout
    assert "cluster link rolled back at boot" in journal, journal
    assert "sparkrig" not in lab.run_ssh(applied[0], "ls /etc/systemd/system/sysinit.target.wants/").stdout
    _rolled_back(before)
