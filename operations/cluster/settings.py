"""Clusters: two or more boxes linked through their ConnectX-7 ports, as one cluster: the
settings, declared once, and their checks (those across a cluster's nodes are in :mod:`.fleet`)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from sparkrig.settings import (
    USER_NAME,
    Setting,
    absolute_path,
    controller_path,
    declare,
    defaults,
    env_mapping_except,
    int_range,
    one_of,
)

from .fleet import fleet_problems

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
_ADDRESS = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}")

# The variables of cluster_env_file that sparkrig writes itself (cluster_env_extra may not).
MANAGED_ENV = (
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include",
    "OMPI_MCA_oob_tcp_if_include",
    "MASTER_ADDR",
    "VLLM_HOST_IP",
    "SPARKRIG_CLUSTER",
    "SPARKRIG_CLUSTER_HOSTFILE",
)


# Checks --------------------------------------------------------------------


def name_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    if value is None or (isinstance(value, str) and _NAME.fullmatch(value)):
        return None
    return "None (not in a cluster) or a cluster name: lower-case letters, digits, '_' and '-', at most 32"


def address_problem(value: Any) -> str | None:
    """Why ``value`` is no static IPv4 address with its prefix for a link, or None."""
    if not (isinstance(value, str) and _ADDRESS.fullmatch(value)):
        return f"{value!r} is not an IPv4 address with its prefix like '192.168.100.11/24'"
    try:
        interface = ipaddress.IPv4Interface(value)
    except ValueError as error:
        return f"{value!r}: {error}"
    if str(interface) != value:
        return f"{value!r} is not written as {interface} would be"
    if not 8 <= interface.network.prefixlen <= 30:
        return f"{value!r}: a prefix from /8 to /30"
    if interface.ip in (interface.network.network_address, interface.network.broadcast_address):
        return f"{value!r} is its subnet's network or broadcast address"
    if interface.ip.is_loopback or interface.ip.is_multicast or interface.ip.is_link_local:
        return f"{value!r}: loopback, multicast and link-local addresses are not link addresses"
    return None


def interfaces_check(value: Any, data: Mapping[str, Any]) -> str | None:
    allowed = (
        "a mapping of interface names (letters, digits, '_', '.', '-', at most 15, not lo) to "
        "static IPv4 addresses with their prefix, e.g. {'enp1s0f0np0': '192.168.100.11/24'}; "
        "at least one when cluster_name is set"
    )
    if not isinstance(value, Mapping):
        return allowed
    if data.get("cluster_name") is not None and not value:
        return allowed
    for name, address in value.items():
        if not isinstance(name, str) or not _INTERFACE.fullmatch(name) or name == "lo":
            return f"{allowed} ({name!r} is no interface name)"
        problem = address_problem(address)
        if problem:
            return f"{allowed} ({problem})"
    networks = [ipaddress.IPv4Interface(a).network for a in value.values()]
    for i, one in enumerate(networks):
        for other in networks[i + 1 :]:
            if one.overlaps(other):
                return f"{allowed} (two interfaces of one host in {one}: one subnet per link)"
    return None


def user_check(value: Any, data: Mapping[str, Any]) -> str | None:
    if value is None and data.get("cluster_name") is None:
        return None
    if isinstance(value, str) and USER_NAME.fullmatch(value) and value != "root":
        return None
    return "the user (not root) who runs jobs across the cluster, the same on every node; required with cluster_name"


def head_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    if value is None or (isinstance(value, str) and value and value.isprintable()):
        return None
    return "None (the cluster's first host in inventory order) or the inventory name of one of its hosts"


SETTINGS = (
    Setting(
        "cluster_name",
        None,
        "The cluster this host belongs to (None: none, and this concern does nothing). Every host "
        "of the inventory with the same name is a node of it; give it to an inventory group "
        "(docs/cluster.md). Every node must be in the run: a --limit that leaves one out is refused.",
        name_check,
    ),
    Setting(
        "cluster_interfaces",
        {},
        "The host's cluster link: each ConnectX-7 interface and its static address with prefix, e.g. "
        "{'enp1s0f0np0': '192.168.100.11/24'} (with cluster_rails 'twins', each one's twin is "
        "addressed too). Addresses are unique in the cluster, one subnet per rail (every address "
        "of a subnet has the same prefix; a subnet holds the two nodes of a direct cable, or every "
        "node through a switch: cluster_topology), and no subnet holds the address the deploy "
        "connects to (a host name is resolved on the controller), nor the controller's own address "
        "towards the node, nor overlaps the controller's route to it (other than a default route).",
        interfaces_check,
    ),
    Setting(
        "cluster_rails",
        "twins",
        "'twins': each interface of cluster_interfaces whose twin the host has (a Spark's QSFP port "
        "is two interfaces, enp1s0f0np0 and enP2p1s0f0np0, each a PCIe x4 link with its own RoCE "
        "device: read from /sys, PCI addresses alike but for the domain, both with an RDMA device) "
        "gets it as a second rail, on a subnet of its own: the same host number 100 subnets of its "
        "size further on (192.168.100.11/24's twin: 192.168.200.11/24), unless cluster_interfaces "
        "lists the twin itself. Both rails are how a port reaches 200 Gb/s (NVIDIA's Cluster "
        "Assistant). 'listed': cluster_interfaces alone. The same on every node.",
        one_of("twins", "listed"),
    ),
    Setting(
        "cluster_topology",
        "direct",
        "How the nodes are cabled: 'direct' (QSFP cables between nodes: two nodes on one cable, three "
        "in a ring; each rail's subnet holds the two nodes its cable joins) or 'switch' (each node "
        "cabled to a switch: each rail's subnet holds every node). The same on every node.",
        one_of("direct", "switch"),
    ),
    Setting(
        "cluster_rail_floor_gbits",
        80,
        "spark-cluster-check --bandwidth fails a rail whose ib_write_bw to a peer averages less "
        "(Gb/s). 80 is the threshold of NVIDIA's check-connectx-bandwidth helper (dgx-spark-playbooks, "
        "connect-two-sparks performance_benchmarking_guide.md), whose example measures 92.57 and 97.28 "
        "Gb/s on a port's two rails; a CX-7 left in its degraded state after boot gives 8 to 25.",
        int_range(1, 400, "Gb/s per rail"),
    ),
    Setting(
        "cluster_nccl_floor_gbytes",
        12,
        "spark-cluster-check --nccl fails an all_reduce_perf whose bus bandwidth at its largest size "
        "(1 GiB) is less (GB/s). 12 is half of what NCCL's maintainers count as one 200 Gb/s NIC's "
        "peak (24 GB/s, nccl-tests issue 119), well above the ~3 GB/s of NCCL fallen back to TCP "
        "(dgx-spark-playbooks issue 102).",
        int_range(1, 1000, "GB/s"),
    ),
    Setting(
        "cluster_mtu",
        9000,
        "MTU of every cluster interface (the same on every node; jumbo frames for NCCL over TCP "
        "and RoCE). spark-cluster-check pings each peer with MTU - 28 bytes, not fragmented.",
        int_range(1280, 9216, "bytes; 9000 for jumbo frames"),
    ),
    Setting(
        "cluster_link_confirm_seconds",
        60,
        "How long a node waits, after a change of its cluster link, for a NEW SSH connection from "
        "the controller to confirm it; unconfirmed, the node puts its previous link files back and "
        "applies them by itself (as `netplan try` does). Nodes change one after the other.",
        int_range(20, 600, "seconds"),
    ),
    Setting(
        "cluster_head",
        None,
        "The node whose first cluster address is MASTER_ADDR and that heads the MPI hostfile: an "
        "inventory host name, the same on every node (None: the cluster's first host in inventory "
        "order).",
        head_check,
    ),
    Setting(
        "cluster_user",
        None,
        "The user who runs jobs across the cluster (the same name on every node, an existing user "
        "other than root): the cluster key is theirs, and SSH between nodes logs in as them.",
        user_check,
    ),
    Setting(
        "cluster_slots",
        1,
        "Slots of each node in the MPI hostfile (processes mpirun starts per node: one per GPU).",
        int_range(1, 64, "slots"),
    ),
    Setting(
        "cluster_key_dir",
        "~/.config/sparkrig/clusters",
        "Where the controller keeps each cluster node's own key pair (NAME/NODE/id_ed25519, made once "
        "per install of the node: beside it, host_keys, the node's SSH host keys it was made for; mode "
        "0600 in 0700 directories; ~ is the controller user's home). Delete a node's directory "
        "to make it a new pair at the next run.",
        controller_path,
    ),
    Setting(
        "cluster_env_file",
        "/etc/sparkrig/cluster.env",
        "The KEY=VALUE file of NCCL's environment: NCCL_IB_HCA (the rails' RoCE devices, read from "
        "the host; left out, and the file says so, where there is none), NCCL_SOCKET_IFNAME, "
        "GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME, UCX_NET_DEVICES, OMPI_MCA_btl_tcp_if_include and "
        "OMPI_MCA_oob_tcp_if_include (the rails' interfaces), MASTER_ADDR (the head's first address), "
        "VLLM_HOST_IP (this node's), SPARKRIG_CLUSTER and SPARKRIG_CLUSTER_HOSTFILE. Login shells read it through "
        "/etc/profile.d/sparkrig-cluster.sh; systemd units read it with EnvironmentFile=.",
        absolute_path,
    ),
    Setting(
        "cluster_env_extra",
        {},
        "Extra variables for the same file, e.g. {'NCCL_DEBUG': 'WARN'}: valid names "
        "other than the managed ones; literal values without single quotes or newlines.",
        env_mapping_except(MANAGED_ENV),
    ),
)

DEFAULTS = defaults(SETTINGS)  # the settings this concern's deploy reads: its own

FLEET_CHECKS = (fleet_problems,)
declare(__name__, SETTINGS, FLEET_CHECKS)
