"""Clusters: a Spark's twin interfaces as rails of their own, their RoCE devices, the
topology (direct cables or a switch), and what NCCL's environment says of them."""

from __future__ import annotations

import getpass
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig.operations import cluster as cl
from sparkrig.operations.cluster import deploy as cl_deploy
from sparkrig.operations.cluster import environment as cl_env
from sparkrig.operations.cluster import facts as cl_facts
from sparkrig.operations.cluster import fleet as cl_fleet
from sparkrig.operations.cluster import link as cl_link
from sparkrig.operations.cluster import trust as cl_trust
from sparkrig.settings import problems, resolve
from tests.unit.operations.test_cluster import LINK_OP, _fake_tools, _node_fact, _plan, recorded
from tests.unit.pyinfra_fake import HOST_STATE, host_state

LINK = {"cluster_name": "lab", "cluster_user": "spark"}


def _fleet(*hosts):
    everyone = [(name, {**data, **resolve(cl.SETTINGS, data)}) for name, data in hosts]
    return cl_fleet.fleet_problems(everyone, everyone)


def _node(n: int, **interfaces) -> tuple[str, dict]:
    return (f"n{n}", {**LINK, "ssh_hostname": f"10.0.0.{n}", "cluster_interfaces": interfaces})


# The fact: twins and RDMA devices, read from /sys ------------------------------------------


def _spark_sys(root: Path) -> None:
    """A STAND-IN for a Spark's /sys, laid out as the kernel does (the lab's hosts have no PCI
    devices): the QSFP port's two twins (PCI domains 0000 and 0002, each with its RoCE device),
    the second port's twins, the Realtek 10 GbE port at the same bus address in domain 0007
    (no RDMA), and a veth (no device at all)."""
    ports = {
        "enp1s0f0np0": ("0000:01:00.0", "rocep1s0f0"),
        "enP2p1s0f0np0": ("0002:01:00.0", "roceP2p1s0f0"),
        "enp1s0f1np1": ("0000:01:00.1", "rocep1s0f1"),
        "enP2p1s0f1np1": ("0002:01:00.1", "roceP2p1s0f1"),
        "enP7s7": ("0007:01:00.0", None),
    }
    # Two interfaces of one PCI function (a dual-port card of another make): no twins of each other.
    for name in ("eth2", "eth3"):
        device = root / "devices" / "pci0000:00" / "0000:05:00.0"
        (device / "net" / name).mkdir(parents=True)
        (root / "class" / "net" / name).mkdir(parents=True)
        os.symlink(os.path.relpath(device, root / "class" / "net" / name), root / "class" / "net" / name / "device")
    (root / "class" / "infiniband" / "mlx4_0").mkdir(parents=True)
    os.symlink(
        os.path.relpath(root / "devices" / "pci0000:00" / "0000:05:00.0", root / "class" / "infiniband" / "mlx4_0"),
        root / "class" / "infiniband" / "mlx4_0" / "device",
    )
    for name, (pci, rdma) in ports.items():
        device = root / "devices" / f"pci{pci[:4]}:00" / pci
        (device / "net" / name).mkdir(parents=True)
        (root / "class" / "net" / name).mkdir(parents=True)
        os.symlink(os.path.relpath(device, root / "class" / "net" / name), root / "class" / "net" / name / "device")
        if rdma:
            (root / "class" / "infiniband" / rdma).mkdir(parents=True)
            os.symlink(
                os.path.relpath(device, root / "class" / "infiniband" / rdma),
                root / "class" / "infiniband" / rdma / "device",
            )
    (root / "class" / "net" / "veth0").mkdir(parents=True)


def test_the_fact_reads_each_ports_twin_and_rdma_device_from_sys(tmp_path):
    _spark_sys(tmp_path)
    lines = subprocess.run(
        ["sh", "-c", cl_facts.read_rails(str(tmp_path))], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert "pci enP7s7 0007:01:00.0" in lines and not any("veth0" in line for line in lines)
    found = cl_facts.ClusterHost().process(["nouser", *lines])
    assert found["twins"] == {
        "enp1s0f0np0": "enP2p1s0f0np0",
        "enP2p1s0f0np0": "enp1s0f0np0",
        "enp1s0f1np1": "enP2p1s0f1np1",
        "enP2p1s0f1np1": "enp1s0f1np1",
    }
    assert found["rdma"]["enP2p1s0f0np0"] == "roceP2p1s0f0" and "enP7s7" not in found["rdma"]
    assert found["rdma"]["eth3"] == "mlx4_0" and "eth2" not in found["twins"]
    # The deploy's own command reads /sys so.
    assert cl_facts.read_rails() in cl_facts.ClusterHost().command("spark").get_raw_value()


def test_a_usb_nic_is_no_port_and_a_forged_line_fails_the_host():
    # A USB NIC with soft-RoCE (rxe) on it: an RDMA device, no PCI address, no twin.
    found = cl_facts.ClusterHost().process(
        [
            "nouser",
            "pci enx00aa 1-1:1.0",
            "rdma enx00aa rxe0",
            "pci enp1s0f0np0 0000:01:00.0",
            "rdma enp1s0f0np0 rocep1s0f0",
        ]
    )
    assert found["twins"] == {} and found["rdma"] == {"enx00aa": "rxe0", "enp1s0f0np0": "rocep1s0f0"}
    with pytest.raises(FactProcessError, match="unexpected line 'rdma eth0 rocep1s0f0 extra'"):
        cl_facts.ClusterHost().process(["nouser", "rdma eth0 rocep1s0f0 extra"])


# Planning: the rails and their addresses ----------------------------------------------------


def test_each_twin_is_a_rail_100_subnets_further_on():
    listed = {"enp1s0f0np0": "192.168.100.11/24"}
    assert cl_fleet.planned_rails(listed, "twins", {"enp1s0f0np0": "enP2p1s0f0np0"}) == {
        "enp1s0f0np0": "192.168.100.11/24",
        "enP2p1s0f0np0": "192.168.200.11/24",
    }
    assert cl_fleet.planned_rails(listed, "twins", {}) == listed  # no twin read here (a veth)
    assert cl_fleet.planned_rails(listed, "listed", {"enp1s0f0np0": "enP2p1s0f0np0"}) == listed
    both = {"enp1s0f0np0": "192.168.100.11/24", "enP2p1s0f0np0": "192.168.150.11/24"}  # listed itself: kept
    assert (
        cl_fleet.planned_rails(both, "twins", {"enp1s0f0np0": "enP2p1s0f0np0", "enP2p1s0f0np0": "enp1s0f0np0"}) == both
    )
    assert cl_fleet.twin_address("10.1.2.3/16") == "10.101.2.3/16"
    # 192.168.200.0/24 moved 100 subnets on is 192.169.44.0/24: out of 192.168.0.0/16, no twin address.
    assert cl_fleet.twin_address("192.168.200.11/24") is None


@pytest.mark.parametrize(
    ("hosts", "host", "expected"),
    [
        # Two nodes on one cable, both twins: fine.
        ((_node(1, cx7="192.168.100.11/24"), _node(2, cx7="192.168.100.12/24")), None, None),
        # A twin's planned subnet taken by another port of the same node.
        (
            (
                _node(1, cx7="192.168.100.11/24", cx8="192.168.200.21/24"),
                _node(2, cx7="192.168.100.12/24", cx8="192.168.200.22/24"),
            ),
            "n1",
            "cluster_rails = 'twins': allowed is one subnet per rail: two rails of n1 in 192.168.200.0/24 "
            "(twin of cx7's rail would be 192.168.200.11/24)",
        ),
        # A port whose twin cannot be placed.
        (
            (_node(1, cx7="192.168.200.11/24"), _node(2, cx7="192.168.200.12/24")),
            "n1",
            "cluster_rails = 'twins': allowed is 'listed' where a port's twin cannot take its address",
        ),
        # Three nodes on one subnet need a switch.
        (
            (_node(1, cx7="192.168.100.11/24"), _node(2, cx7="192.168.100.12/24"), _node(3, cx7="192.168.100.13/24")),
            "n3",
            "cluster_topology = 'direct': allowed is 'switch' for a subnet of more than two nodes: "
            "192.168.100.0/24 holds n1, n2, n3",
        ),
    ],
)
def test_rails_and_topology_are_checked_before_any_host_is_contacted(hosts, host, expected):
    found = _fleet(*hosts)
    if expected is None:
        assert found == []
    else:
        assert any(h == host and expected in problem for h, problem in found), found


def test_three_nodes_in_a_ring_of_direct_cables_or_through_a_switch():
    ring = (
        _node(1, a="192.168.101.11/24", b="192.168.103.11/24"),
        _node(2, a="192.168.101.12/24", b="192.168.102.12/24"),
        _node(3, a="192.168.102.13/24", b="192.168.103.13/24"),
    )
    assert _fleet(*ring) == []
    switch = {"cluster_topology": "switch"}
    star = [
        (n, {**d, **switch})
        for n, d in (_node(1, p="192.168.100.11/24"), _node(2, p="192.168.100.12/24"), _node(3, p="192.168.100.13/24"))
    ]
    assert _fleet(*star) == []
    # Through a switch every node is on every rail: one left off a rail's subnet is refused.
    star[2] = ("n3", {**star[2][1], "cluster_interfaces": {"p": "192.168.110.13/24"}})
    found = _fleet(*star)
    assert (
        "n3",
        "cluster_interfaces = {'p': '192.168.110.13/24'}: allowed is an address in every rail's subnet of "
        "cluster 'lab' (cluster_topology 'switch': every node reaches every node on each rail); n3 has none "
        "in 192.168.100.0/24",
    ) in found, found
    # The topology and rails are the cluster's: the same on every node.
    mixed = [star[0], star[1], ("n3", {**_node(3, p="192.168.100.13/24")[1]})]
    assert any(
        h == "n3" and "cluster_topology = 'direct': allowed is the same value on every node" in p
        for h, p in _fleet(*mixed)
    )


def test_rail_settings_say_what_is_allowed():
    assert (
        "cluster_rails = 'both': allowed is one of 'twins', 'listed'"
        in problems(cl.SETTINGS, {"cluster_rails": "both"})[0]
    )
    assert (
        "cluster_topology = 'ring': allowed is one of 'direct', 'switch'"
        in problems(cl.SETTINGS, {"cluster_topology": "ring"})[0]
    )
    assert "NCCL_IB_HCA is managed" in problems(cl.SETTINGS, {"cluster_env_extra": {"NCCL_IB_HCA": "mlx5_0"}})[0]


# The deploy: twins' rails, their devices, and NCCL's environment -----------------------------


def _rails_lines() -> list[str]:
    """What read_rails prints on a Spark whose first port is cabled (see _spark_sys)."""
    return ["pci cx7 0000:01:00.0", "pci cx7twin 0002:01:00.0", "rdma cx7 rocep1s0f0", "rdma cx7twin roceP2p1s0f0"]


def _spark_fact(links: dict, host_key: str) -> list[str]:
    return [*_node_fact(links, host_key=host_key), *_rails_lines()]


def test_a_spark_node_gets_both_twins_as_rails_and_ncclib_hca_names_their_devices(tmp_path):
    links = {"cx7": (False, 1500, []), "cx7twin": (False, 1500, []), "eth0": (True, 1500, ["10.0.0.1/24"])}
    ops = _plan(
        tmp_path,
        {
            HOST_STATE: host_state(packages={"iputils-ping": "1", "perftest": None}),
            "ip -j addr": _spark_fact(links, "ssh-ed25519 AAAAhost"),
        },
        {HOST_STATE: host_state(), "ip -j addr": _spark_fact({}, "ssh-ed25519 AAAApeer")},
    )
    apply = next(op for op in ops if LINK_OP in op.name)
    # The twin's link file is written and applied as any rail's: the link's data carries it.
    twin_file = b"[Match]\nName=cx7twin\n"
    assert any(twin_file in content and b"Address=192.168.200.11/24" in content for content in apply.uploads.values())
    assert any("cx7 cx7twin" in c or "networkctl" in c for c in apply.commands)
    env = next(op for op in ops if "| NCCL environment" in op.name)
    text = next(iter(env.uploads.values())).decode()
    assert "NCCL_IB_HCA==rocep1s0f0,roceP2p1s0f0\n" in text and "NCCL_SOCKET_IFNAME=cx7,cx7twin\n" in text
    assert "no RDMA device" not in text
    known = next(op for op in ops if "| Every node's pinned host keys" in op.name)
    assert b"192.168.200.12 ssh-ed25519 AAAApeer" in next(iter(known.uploads.values()))  # the peer's twin rail
    assert any("Install ib_write_bw (perftest)" in op.name for op in ops)


def test_a_node_without_rdma_says_so_and_installs_no_perftest(tmp_path, caplog):
    links = {"cx7": (False, 1500, []), "eth0": (True, 1500, ["10.0.0.1/24"])}
    with caplog.at_level("INFO"):
        ops = _plan(
            tmp_path,
            {
                HOST_STATE: host_state(packages={"iputils-ping": None, "perftest": None}),
                "ip -j addr": _node_fact(links),
            },
            {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAApeer")},
        )
    env = next(op for op in ops if "| NCCL environment" in op.name)
    text = next(iter(env.uploads.values())).decode()
    assert "# no RDMA device behind cx7 (/sys/class/infiniband names none): NCCL_IB_HCA is not set" in text
    assert "NCCL_IB_HCA" not in "".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "cluster lab: no RDMA device behind cx7" in caplog.text
    assert not any("perftest" in op.name for op in ops)


def test_the_env_file_with_rdma_reads_back_in_sh(tmp_path):
    variables = cl_env.env_variables(
        ["a", "b"], "192.168.100.12", "192.168.100.11", "lab", {}, ["rocep1s0f0", "roceP2p1s0f0"]
    )
    path = tmp_path / "cluster.env"
    path.write_text(cl_env.render_env_file(variables))
    shown = subprocess.run(["sh", "-c", f"set -a; . {path}; env"], capture_output=True, text=True, check=True).stdout
    assert "NCCL_IB_HCA==rocep1s0f0,roceP2p1s0f0" in shown.splitlines()


# spark-cluster-check --bandwidth: ib_write_bw per rail to each peer, on recorded real outputs ---


PEER = {
    "name": "b",
    "addresses": ["192.168.100.12", "192.168.200.12"],
    "first": "192.168.100.12",
    # The peer's other port is cabled: its devices' names differ from this node's.
    "devices": {"192.168.100.12": "rocep1s0f1", "192.168.200.12": "roceP2p1s0f1"},
    "host_keys": ["ssh-ed25519 AAAAb"],
    "public": "ssh-ed25519 AAAAkeyb sparkrig-cluster:lab:b",
}
RAILS = {"cx7": "192.168.100.11/24", "cx7twin": "192.168.200.11/24"}
DEVICES = {"cx7": "rocep1s0f0", "cx7twin": "roceP2p1s0f0"}


def _bandwidth(tmp_path, outputs: dict, floor: int = 80, devices=DEVICES, ib_write_bw: bool = True):
    """Run the rendered check with --bandwidth. STAND-INS: ip, ping (test_cluster's), ssh (logs
    the peer's server command, as the peer would run it, and exits), and ib_write_bw printing,
    per local device, a RECORDED REAL output (``outputs``); the check's own sh runs for real."""
    bin_dir = tmp_path / "bin"
    _fake_tools(bin_dir, "2: cx7: <UP> mtu 9000 state UP mode", "192.168.100.12 dev cx7", 0, 0)
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "ssh.log"}\n')
    if ib_write_bw:
        cases = "".join(f'*"-d {device} "*) cat {tmp_path / name} ;; ' for device, name in outputs.items())
        for name in outputs.values():
            (tmp_path / name).write_text(recorded(name))
        (bin_dir / "ib_write_bw").write_text(
            f'#!/bin/sh\necho "$*" >> {tmp_path / "client.log"}\ncase "$* " in {cases}esac\n'
        )
        (bin_dir / "ib_write_bw").chmod(0o755)
    script = tmp_path / "spark-cluster-check"
    script.write_text(
        cl_env.render_check(
            "lab",
            getpass.getuser(),
            9000,
            RAILS,
            [PEER],
            "/etc/sparkrig/cluster.env",
            devices=devices,
            rail_floor=floor,
        )
    )
    return subprocess.run(
        ["sh", str(script), "--bandwidth"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"},
    )


def test_bandwidth_measures_each_rail_to_each_peer_against_the_floor(tmp_path):
    result = _bandwidth(
        tmp_path, {"rocep1s0f0": "ib_write_bw-dgx-spark-rail1.txt", "roceP2p1s0f0": "ib_write_bw-dgx-spark-rdma-cm.txt"}
    )
    assert "OK bandwidth cx7 b: rail cx7 (rocep1s0f0) to b (192.168.100.12): 92.57 Gb/s (floor 80)" in result.stdout
    assert (
        "OK bandwidth cx7twin b: rail cx7twin (roceP2p1s0f0) to b (192.168.200.12): 111.71 Gb/s (floor 80)"
        in result.stdout
    )
    assert not result.returncode & 128, result.stdout
    # The peer's server on the peer's device of that rail, the client from this rail's to its address.
    servers = (tmp_path / "ssh.log").read_text().splitlines()
    assert any(
        s.endswith("192.168.100.12 timeout 30 ib_write_bw -d rocep1s0f1 -F --report_gbits -D 5 -p 18515")
        for s in servers
    ), servers
    assert "-d roceP2p1s0f0 -F --report_gbits -D 5 -p 18515 192.168.200.12" in (tmp_path / "client.log").read_text()


@pytest.mark.parametrize(
    ("outputs", "floor", "line"),
    [
        # A real run under any floor (8-byte messages): the rail is named.
        (
            {"rocep1s0f0": "ib_write_bw-small-messages.txt"},
            80,
            "FAIL bandwidth cx7 b: rail cx7 (rocep1s0f0) to b (192.168.100.12): 0.48 Gb/s, under the floor of 80 Gb/s",
        ),
        # A real report in MB/sec, converted (its last row: 19.50 MB/s).
        (
            {"rocep1s0f0": "ib_read_bw-megabytes.txt"},
            80,
            "FAIL bandwidth cx7 b: rail cx7 (rocep1s0f0) to b (192.168.100.12): 0.16 Gb/s, under the floor of 80 Gb/s",
        ),
        # A Spark's real rail against a floor above it.
        (
            {"rocep1s0f0": "ib_write_bw-dgx-spark-rail1.txt"},
            93,
            "FAIL bandwidth cx7 b: rail cx7 (rocep1s0f0) to b (192.168.100.12): 92.57 Gb/s, under the floor of 93 Gb/s",
        ),
    ],
)
def test_a_rail_under_its_floor_fails_naming_the_rail(tmp_path, outputs, floor, line):
    result = _bandwidth(tmp_path, {"roceP2p1s0f0": "ib_write_bw-dgx-spark-rail1.txt", **outputs}, floor=floor)
    assert result.returncode & 128, result.stdout
    assert any(shown.startswith(line) for shown in result.stdout.splitlines()), result.stdout


def test_the_default_floor_fails_the_degraded_state_nvidia_describes():
    # NVIDIA's guide: a CX-7 left degraded after boot gives 8 to 25 Gb/s a rail (playbooks PR 108: ~13).
    floor = resolve(cl.SETTINGS, {})["cluster_rail_floor_gbits"]
    assert 25 < floor <= 92.57


def test_bandwidth_skips_a_rail_without_rdma_and_fails_without_perftest(tmp_path):
    # The lab's veth: no RDMA device, a skip that says why.
    result = _bandwidth(tmp_path, {}, devices={})
    assert (
        "SKIP bandwidth cx7 b: no RDMA device behind cx7 (a veth, as in sparkrig's lab, or a port without RoCE)"
        in result.stdout
        and not result.returncode & 128
    )
    (tmp_path / "again").mkdir()
    result = _bandwidth(tmp_path / "again", {}, ib_write_bw=False)
    assert "FAIL bandwidth cx7 b: ib_write_bw is not installed (Debian's perftest" in result.stdout
    assert result.returncode & 128


def test_a_converged_spark_node_plans_nothing_its_twins_file_read_with_the_node(tmp_path):
    keys = {"cluster_key_dir": str(tmp_path / "keys")}
    a = {**LINK, "ssh_hostname": "10.0.0.1", "cluster_interfaces": {"cx7": "192.168.100.11/24"}, **keys}
    b = {**LINK, "ssh_hostname": "10.0.0.2", "cluster_interfaces": {"cx7": "192.168.100.12/24"}, **keys}
    twins = {"twins": {"cx7": "cx7twin", "cx7twin": "cx7"}, "rdma": {"cx7": "rocep1s0f0", "cx7twin": "roceP2p1s0f0"}}
    key, _public = cl_trust.controller_key(str(tmp_path / "keys"), "lab", "@fake/a", ["ssh-ed25519 AAAAhost"])
    nodes = [
        cl_deploy._node("@fake/a", resolve(cl.SETTINGS, a), ["ssh-ed25519 AAAAhost"], twins),
        cl_deploy._node("@fake/b", resolve(cl.SETTINGS, b), ["ssh-ed25519 AAAApeer"], twins),
    ]
    rails = {"cx7": "192.168.100.11/24", "cx7twin": "192.168.200.11/24"}
    link_files = {
        f"/etc/systemd/network/40-sparkrig-cluster-{i}.network": cl_link.render_networkd(i, addr, 9000)
        for i, addr in rails.items()
    }
    files = {
        **{k: v for k, v in link_files.items() if "cx7twin" not in k},  # the settings name cx7's file alone
        cl_facts.KNOWN_HOSTS: cl_trust.render_known_hosts(nodes),
        cl_facts.SSH_CONFIG: cl_trust.render_ssh_config(nodes, "spark"),
        cl_facts.HOSTFILE: cl_env.render_hostfile(nodes, 1),
        "/etc/sparkrig/cluster.env": cl_env.render_env_file(
            cl_env.env_variables(
                list(rails), "192.168.100.11", "192.168.100.11", "lab", {}, ["rocep1s0f0", "roceP2p1s0f0"]
            )
        ),
        cl_facts.PROFILE_SCRIPT: cl_env.render_profile_script("/etc/sparkrig/cluster.env"),
        cl_facts.CHECK: (
            cl_env.render_check(
                "lab", "spark", 9000, rails, nodes[1:], "/etc/sparkrig/cluster.env", devices=twins["rdma"]
            ),
            0o755,
        ),
    }
    state = host_state(
        files=files, units={cl_facts.NETWORKD: (True, True)}, packages={"iputils-ping": "1", "perftest": "1"}
    )
    state.append(f"file 600 spark spark {hashlib.sha256(key).hexdigest()} {cl_facts.KEY_FILE}")
    # The node's own reading states each networkd link file of sparkrig's: the twin's among them.
    link_state = [
        f"linkstate 644 root root {hashlib.sha256(text.encode()).hexdigest()} {path}"
        for path, text in link_files.items()
    ]
    links = {
        "cx7": (True, 9000, ["192.168.100.11/24"]),
        "cx7twin": (True, 9000, ["192.168.200.11/24"]),
        "eth0": (True, 1500, ["10.0.0.1/24"]),
    }
    fact = [
        *_node_fact(links, authorized=cl_trust.authorized_lines(nodes, "lab"), files=list(link_files)),
        *link_state,
        *_rails_lines(),
    ]
    ops = _plan(
        tmp_path,
        {HOST_STATE: state, "ip -j addr": fact},
        {HOST_STATE: host_state(), "ip -j addr": _spark_fact({}, "ssh-ed25519 AAAApeer")},
    )
    assert ops == [], [op.name for op in ops]
