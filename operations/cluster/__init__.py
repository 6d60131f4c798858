"""
Clusters: two or more boxes linked through their ConnectX-7 ports, as one cluster.

Off unless a host has ``cluster_name``. A cluster is a group of the inventory: every
host with the same ``cluster_name``. Per host:

- **The link.** Each interface of ``cluster_interfaces`` gets its static address and
  ``cluster_mtu``: a systemd-networkd ``.network`` file, or ``/etc/netplan/40-sparkrig-
  cluster.yaml`` (mode 600, rendered by networkd) where the host has netplan. The file is
  validated before it takes effect. A change is applied node after node, to those interfaces
  alone, and kept only when a NEW SSH connection confirms it; else the node puts the old
  files back by itself (:func:`link`). The interface the deploy's own SSH connection arrives
  on is never one of them, and settings validation keeps every cluster subnet clear of the
  controller's path to each node.
- **Trust.** One key pair per node, made once on the controller
  (``cluster_key_dir/NAME/NODE/id_ed25519``, 0600). A node's private half is its cluster
  user's ``/etc/sparkrig/cluster/id_ed25519``; every node's public half is a line of the
  cluster user's ``~/.ssh/authorized_keys`` on every node (written as them), restricted with
  ``from=`` to that node's addresses; every node's host keys are pinned in
  ``/etc/sparkrig/cluster/known_hosts``,
  which ``/etc/ssh/ssh_config.d/50-sparkrig-cluster.conf`` makes the only host keys the
  cluster user's ssh accepts for those addresses (``StrictHostKeyChecking yes``).
- **NCCL's environment** (``NCCL_SOCKET_IFNAME``, ``MASTER_ADDR``, ...) in ``cluster_env_file``,
  read by login shells and units, and an MPI hostfile, ``/etc/sparkrig/cluster/hostfile``.
- ``spark-cluster-check``: per peer, link up, MTU, a jumbo ping that must not fragment,
  SSH as the cluster user without a prompt; with ``--nccl``, nccl-tests' ``all_reduce_perf``
  (a prefix source build named ``nccl-tests``, in ``/opt/sparkrig/builds/nccl-tests/current/bin``)
  across the nodes with mpirun.

Every node's host keys come from its own reading (a peer's reading is its one reading,
made early), so a node added to the inventory is trusted by the others after one run
and a node removed is no longer trusted (its key's line leaves every authorized_keys, its
host keys the pinned file).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import posixpath
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

import gevent
from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand, deploy, operation
from pyinfra.context import ctx_host

from sparkrig import atomic, host_output, messages, prefix, reading, rendering, user_files
from sparkrig.connection import run_on_new_connection
from sparkrig.packages import installed as install_packages
from sparkrig.settings import (
    ALL_DEFAULTS,
    USER_NAME,
    Setting,
    absolute_path,
    controller_path,
    declare,
    defaults,
    env_mapping_except,
    int_range,
    resolve,
)

NETWORKD_DIR = "/etc/systemd/network"
NETWORKD_PREFIX = "40-sparkrig-cluster-"
NETPLAN_FILE = "/etc/netplan/40-sparkrig-cluster.yaml"
# Where NetworkManager runs beside networkd (a Debian desktop): it leaves the cluster ports alone.
NM_FILE = "/etc/NetworkManager/conf.d/90-sparkrig-cluster.conf"
NETWORKD = "systemd-networkd.service"
WAIT_ONLINE = "systemd-networkd-wait-online.service"
DIRECTORY = "/etc/sparkrig/cluster"
KEY_FILE = f"{DIRECTORY}/id_ed25519"
KNOWN_HOSTS = f"{DIRECTORY}/known_hosts"
HOSTFILE = f"{DIRECTORY}/hostfile"
SSH_CONFIG = "/etc/ssh/ssh_config.d/50-sparkrig-cluster.conf"
PROFILE_SCRIPT = "/etc/profile.d/sparkrig-cluster.sh"
CHECK = "/usr/local/bin/spark-cluster-check"
# Where a prefix source build named nccl-tests (the owner's catalogue entry) is installed.
NCCL_TESTS_BIN = f"{prefix.current('nccl-tests')}/bin"
PACKAGES = ("iputils-ping",)  # ping -M do (busybox's ping has no -M)
MARKER = "sparkrig-cluster:"  # the comment of every line sparkrig manages in authorized_keys
STAGE = "/var/lib/sparkrig/stage"  # root's: files on their way to a directory of another user

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
_ADDRESS = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}")
_HOST_KEY = re.compile(r"(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/]+={0,2}")
_MANAGED_ENV = (
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include", "MASTER_ADDR", "VLLM_HOST_IP",
    "SPARKRIG_CLUSTER", "SPARKRIG_CLUSTER_HOSTFILE",
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
        for other in networks[i + 1:]:
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
        "{'enp1s0f0np0': '192.168.100.11/24'}. Addresses are unique in the cluster, one subnet per "
        "link (every address of a subnet has the same prefix, each subnet holds two nodes or more), "
        "and no subnet holds the address the deploy connects to (a host name is resolved on the "
        "controller), nor the controller's own address towards the node, nor overlaps the "
        "controller's route to it (other than a default route).",
        interfaces_check,
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
        "Where the controller keeps each cluster node's own key pair (NAME/NODE/id_ed25519, made once, "
        "mode 0600 in 0700 directories; ~ is the controller user's home). Delete a node's directory "
        "to make it a new pair at the next run.",
        controller_path,
    ),
    Setting(
        "cluster_env_file",
        "/etc/sparkrig/cluster.env",
        "The KEY=VALUE file of NCCL's environment: NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, "
        "TP_SOCKET_IFNAME, UCX_NET_DEVICES, OMPI_MCA_btl_tcp_if_include and OMPI_MCA_oob_tcp_if_include"
        " (the cluster interfaces), MASTER_ADDR (the head's first address), VLLM_HOST_IP (this "
        "node's), SPARKRIG_CLUSTER and SPARKRIG_CLUSTER_HOSTFILE. Login shells read it through "
        "/etc/profile.d/sparkrig-cluster.sh; systemd units read it with EnvironmentFile=.",
        absolute_path,
    ),
    Setting(
        "cluster_env_extra",
        {},
        "Extra variables for the same file, e.g. {'NCCL_IB_HCA': 'mlx5_0,mlx5_1'}: valid names "
        "other than the managed ones; literal values without single quotes or newlines.",
        env_mapping_except(_MANAGED_ENV),
    ),
)


# Checks across hosts ----------------------------------------------------------------


def _said(key: str, value: Any, allowed: str) -> str:
    return f"{key} = {value!r}: allowed is {allowed}"


def members(everyone: Sequence[tuple[str, Mapping[str, Any]]], name: str) -> list[str]:
    """The hosts of cluster ``name``, in inventory order."""
    return [host_name for host_name, data in everyone if data.get("cluster_name") == name]


def head_of(everyone: Sequence[tuple[str, Mapping[str, Any]]], name: str) -> str:
    """The head of cluster ``name``: its cluster_head, else its first host."""
    nodes = members(everyone, name)
    data = dict(everyone)[nodes[0]]
    return data.get("cluster_head") or nodes[0]


def fleet_problems(
    targeted: Sequence[tuple[str, Mapping[str, Any]]], everyone: Sequence[tuple[str, Mapping[str, Any]]]
) -> list[tuple[str, str]]:
    """(host, problem) for every cluster one of the ``targeted`` hosts is in, seen across
    the whole inventory ``everyone`` (every setting resolved). A run that leaves out some of
    a cluster's nodes is no problem here: it changes nothing of that cluster (see
    :func:`cluster`), so ``--limit`` and the rollout tool's batches still work."""
    found: list[tuple[str, str]] = []
    data = dict(everyone)
    clusters = sorted({d["cluster_name"] for n, d in targeted if d.get("cluster_name") is not None})
    for cluster in clusters:
        nodes = members(everyone, cluster)
        if len(nodes) < 2:
            found.append((nodes[0], _said(
                "cluster_name", cluster, "the name of a cluster of two hosts or more (no other host has it)"
            )))
            continue
        for key in ("cluster_user", "cluster_mtu", "cluster_head"):
            values = {n: data[n].get(key) for n in nodes}
            if len({repr(v) for v in values.values()}) > 1:
                first = values[nodes[0]]
                for node in nodes[1:]:
                    if repr(values[node]) != repr(first):
                        found.append((node, _said(
                            key, values[node], f"the same value on every node of cluster {cluster!r} "
                            f"({nodes[0]} has {first!r})",
                        )))
        head = data[nodes[0]].get("cluster_head")
        if head is not None and head not in nodes:
            for node in nodes:
                found.append((node, _said(
                    "cluster_head", head, f"a host of cluster {cluster!r}: {', '.join(nodes)}"
                )))
        found += _address_problems(cluster, nodes, data)
    return found


def _address_problems(cluster: str, nodes: Sequence[str], data: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    found = []
    owner: dict[ipaddress.IPv4Address, str] = {}
    subnets: dict[ipaddress.IPv4Network, list[str]] = {}
    for node in nodes:
        interfaces = data[node]["cluster_interfaces"]
        for address in interfaces.values():
            interface = ipaddress.IPv4Interface(address)
            if interface.ip in owner:
                found.append((node, _said(
                    "cluster_interfaces", interfaces,
                    f"addresses unique in cluster {cluster!r} ({interface.ip} is also {owner[interface.ip]}'s)",
                )))
            owner.setdefault(interface.ip, node)
            clash = next((s for s in subnets if s.overlaps(interface.network) and s != interface.network), None)
            if clash is not None:
                found.append((node, _said(
                    "cluster_interfaces", interfaces,
                    f"one subnet per link: {address} overlaps {clash}, which {subnets[clash][0]} uses",
                )))
                continue
            subnets.setdefault(interface.network, []).append(node)
        found += _management_problems(node, data[node], interfaces)
    for network, holders in subnets.items():
        if len(holders) < 2:
            node = holders[0]
            found.append((node, _said(
                "cluster_interfaces", data[node]["cluster_interfaces"],
                f"links to other nodes: no other node of cluster {cluster!r} has an address in {network}",
            )))
    return found


def _management_problems(node: str, data: Mapping[str, Any], interfaces: Mapping[str, str]) -> list[tuple[str, str]]:
    """A cluster subnet must keep clear of the deploy's own path to ``node``: the address it
    connects to, the controller's source address towards it (the node would answer the
    controller through the link) and the controller's route to it (unless a default route)."""
    target = str(data.get("ssh_hostname") or node)
    if target.startswith("@"):  # @local, @docker...: no SSH path to keep clear
        return []
    try:
        node_ip = _resolve(target)
    except OSError as error:
        return [(node, _said("ssh_hostname", target, (
            f"a host name the controller resolves, or an IPv4 address ({error}): a cluster node's "
            "management path is checked against its cluster subnets before any host is contacted"
        )))]
    if node_ip is None:  # IPv6 only: no IPv4 cluster subnet can take its path
        return []
    source, route = controller_route(node_ip)
    found = []
    for address in interfaces.values():
        network = ipaddress.IPv4Interface(address).network
        if node_ip in network:
            why = f"the address the deploy connects to ({node_ip} is in {network})"
        elif source is not None and source in network:
            why = (f"the controller's own address towards this host ({source}, the source of its route to "
                   f"{node_ip}, is in {network}: the node would answer the controller through the link)")
        elif route is not None and route.overlaps(network):
            why = f"the controller's route to this host ({node_ip} is reached through {route}, which {network} overlaps)"
        else:
            continue
        found.append((node, _said(
            "cluster_interfaces", interfaces, f"subnets apart from {why}: sparkrig never reconfigures its own connection",
        )))
    return found


def _resolve(target: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the controller connects to for ``target`` (None: IPv6 only)."""
    try:
        return ipaddress.IPv4Address(target)
    except ValueError:
        pass
    infos = socket.getaddrinfo(target, 22, type=socket.SOCK_STREAM)
    for family, *_rest, sockaddr in infos:
        if family == socket.AF_INET:
            return ipaddress.IPv4Address(sockaddr[0])
    return None


def controller_route(
    address: ipaddress.IPv4Address,
) -> tuple[ipaddress.IPv4Address | None, ipaddress.IPv4Network | None]:
    """The controller's source address towards ``address`` and the (non-default) route that
    reaches it, as its kernel says (``ip route``); where ``ip`` is missing, the source
    address alone (a UDP socket's, nothing is sent)."""
    if shutil.which("ip"):
        got = subprocess.run(["ip", "-j", "route", "get", str(address)], capture_output=True, text=True)
        routes = subprocess.run(["ip", "-j", "route", "show", "match", str(address)], capture_output=True, text=True)
        if got.returncode == 0 and routes.returncode == 0:
            source = next((r.get("prefsrc") for r in json.loads(got.stdout or "[]") if r.get("prefsrc")), None)
            nets = [ipaddress.IPv4Network(r["dst"], strict=False) for r in json.loads(routes.stdout or "[]")
                    if r.get("dst") not in (None, "default")]
            route = max(nets, key=lambda n: n.prefixlen, default=None)
            return (ipaddress.IPv4Address(source) if source else None), route
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((str(address), 22))
        except OSError:
            return None, None
        return ipaddress.IPv4Address(probe.getsockname()[0]), None


FLEET_CHECKS = (fleet_problems,)
declare(__name__, SETTINGS, FLEET_CHECKS)


# Facts -----------------------------------------------------------------------------

# As the cluster user (runuser: no PAM session, no shell start-up files): the lines of
# their authorized_keys that sparkrig manages, read as every user's file is
# (user_files.USER_READ, at most AUTHORIZED_LIMIT bytes). $1: their home.
AUTHORIZED_LIMIT = 1 << 20
_READ_AUTHORIZED = (
    'f="$1/.ssh/authorized_keys"; [ -f "$f" ] || exit 0; '
    f'{user_files.user_read(chr(34) + "$f" + chr(34), AUTHORIZED_LIMIT)} | grep -F -e " {MARKER}"; [ $? -le 1 ]'
)


class ClusterHost(FactBase):
    """
    Returns what a cluster node is made of: its links (``ip -j addr``: each interface's
    flags, MTU and IPv4 addresses), whether it uses netplan, whether ssh reads
    ``/etc/ssh/ssh_config.d``, its SSH host keys, the files sparkrig wrote for the link,
    and the cluster user (uid, home, login group, the authorized_keys lines sparkrig manages,
    read as that user), ``None`` when there is no such user.

    .. code:: python

        {"links": {"eth1": {"up": True, "mtu": 9000, "addresses": ["192.168.100.11/24"]}},
         "netplan": False, "networkmanager": False, "ssh_config_d": True, "host_keys": ["ssh-ed25519 AAAA..."],
         "link_files": ["/etc/systemd/network/40-sparkrig-cluster-eth1.network"],
         "user": {"uid": 1000, "home": "/home/spark", "group": "spark",
                  "authorized": ['from="..." ssh-ed25519 AAAA... sparkrig-cluster:lab']}}
    """

    def command(self, user: str) -> StringCommand:
        q_user = QuoteString(user)
        return StringCommand(
            "echo links $(ip -j addr show);",
            "if command -v netplan >/dev/null && [ -d /etc/netplan ]; then echo netplan yes; else echo netplan no; fi;",
            "if systemctl is-active -q NetworkManager 2>/dev/null; then echo networkmanager yes; else echo networkmanager no; fi;",
            "if grep -Eqs '^[[:space:]]*Include[[:space:]]+/etc/ssh/ssh_config\\.d/\\*\\.conf' /etc/ssh/ssh_config;",
            "then echo ssh_config_d yes; else echo ssh_config_d no; fi;",
            "for k in /etc/ssh/ssh_host_*_key.pub; do [ -f \"$k\" ] && echo hostkey $(cut -d' ' -f1,2 \"$k\"); done;",
            f"for f in {NETWORKD_DIR}/{NETWORKD_PREFIX}*.network {NETPLAN_FILE} {NM_FILE}; do [ -f \"$f\" ] && echo linkfile \"$f\"; done;",
            "if e=$(getent passwd", q_user, "); then",
            'h=$(echo "$e" | cut -d: -f6); echo user $(id -u', q_user, ") $(id -gn", q_user, ') "$h";',
            "runuser -u", q_user, "-- sh -c", QuoteString(_READ_AUTHORIZED), 'sparkrig "$h" | sed "s/^/authorized /";',
            "else echo nouser; fi",
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found: dict = {"links": {}, "netplan": False, "networkmanager": False, "ssh_config_d": False,
                       "host_keys": [], "link_files": [], "user": None}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "links":
                for link in json.loads(rest or "[]"):
                    found["links"][link["ifname"]] = {
                        "up": "UP" in link.get("flags", []),
                        "mtu": int(link.get("mtu", 0)),
                        "addresses": [
                            f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"
                        ],
                    }
            elif kind in ("netplan", "networkmanager", "ssh_config_d"):
                found[kind] = rest == "yes"
            elif kind == "hostkey":
                if not _HOST_KEY.fullmatch(rest):
                    raise ValueError(f"not an SSH host key: {rest[:60]!r}")
                found["host_keys"].append(rest)
            elif kind == "linkfile":
                if not (rest in (NETPLAN_FILE, NM_FILE) or (rest.startswith(f"{NETWORKD_DIR}/{NETWORKD_PREFIX}") and rest.endswith(".network"))):
                    raise ValueError(f"unexpected link file {rest[:80]!r}")
                found["link_files"].append(rest)
            elif kind == "user":
                uid, group, home = rest.split(" ", 2)
                found["user"] = {"uid": int(uid), "group": group, "home": home, "authorized": []}
            elif kind == "authorized":
                found["user"]["authorized"].append(rest)
            elif kind != "nouser":
                raise ValueError(f"unexpected line {line[:80]!r}")
        return found

    @staticmethod
    def default() -> dict:
        return {"links": {}, "netplan": False, "networkmanager": False, "ssh_config_d": False, "host_keys": [],
                "link_files": [], "user": None}


class ClusterLeftovers(FactBase):
    """
    Returns the files a cluster node holds (sparkrig's link, key, trust, environment and
    check files) and the owner of the cluster key, on a host in no cluster: what a node
    taken out of its cluster still has.

    .. code:: python

        {"files": ["/etc/sparkrig/cluster/id_ed25519", ...], "key_owner": "spark"}
    """

    def command(self, env_file: str) -> StringCommand:
        fixed = [KEY_FILE, KNOWN_HOSTS, HOSTFILE, SSH_CONFIG, PROFILE_SCRIPT, CHECK, NETPLAN_FILE, NM_FILE]
        return StringCommand(
            "for f in", *[QuoteString(p) for p in fixed], QuoteString(env_file),
            f"{NETWORKD_DIR}/{NETWORKD_PREFIX}*.network;",
            'do [ -f "$f" ] && echo file "$f"; done;',
            f"[ -f {KEY_FILE} ] && echo keyowner $(stat -c %U {KEY_FILE}); true",
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found: dict = {"files": [], "key_owner": None}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "file" and rest.startswith("/"):
                found["files"].append(rest)
            elif kind == "keyowner" and USER_NAME.fullmatch(rest):
                found["key_owner"] = rest
            else:
                raise ValueError(f"unexpected line {line[:80]!r}")
        return found

    @staticmethod
    def default() -> dict:
        return {"files": [], "key_owner": None}


def link_files(interfaces: Iterable[str], netplan: bool) -> list[str]:
    return [NETPLAN_FILE] if netplan else [f"{NETWORKD_DIR}/{NETWORKD_PREFIX}{name}.network" for name in interfaces]


def _files(settings: Mapping[str, Any]) -> tuple[str, ...]:
    # Both forms of the link file: which one a host uses is read in the same reading.
    return (
        *link_files(settings["cluster_interfaces"], False), NETPLAN_FILE, NM_FILE,
        KEY_FILE, KNOWN_HOSTS, HOSTFILE, SSH_CONFIG, settings["cluster_env_file"], PROFILE_SCRIPT, CHECK,
    )


def parts(settings: Mapping[str, Any]) -> list[reading.Part]:
    """The parts a node of a cluster reads; off a cluster, what a node would have left."""
    settings = {**defaults(SETTINGS), **settings}
    if settings["cluster_name"] is None:
        return [reading.part(ClusterLeftovers, env_file=settings["cluster_env_file"])]
    return [
        reading.part(atomic.HostState, paths=_files(settings), units=(NETWORKD, WAIT_ONLINE), packages=PACKAGES),
        reading.part(ClusterHost, user=settings["cluster_user"]),
    ]


@reading.planner
def reads(settings):
    return parts(settings)


# The wanted state ----------------------------------------------------------------------


def render_networkd(interface: str, address: str, mtu: int) -> str:
    return rendering.render("cluster/link.network.j2", interface=interface, address=address, mtu=mtu)


NETWORKD_VALIDATOR = atomic.unit_file_validator(
    ["Match", "Link", "Network"],
    {
        "Name": r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}",
        "MTUBytes": "[0-9]+",
        "RequiredForOnline": "no",
        "Address": r"[0-9.]+/[0-9]+",
        "LinkLocalAddressing": "no",
        "IPv6AcceptRA": "no",
        "ConfigureWithoutCarrier": "yes",
    },
)


def render_networkmanager(interfaces: Iterable[str]) -> str:
    return rendering.render("cluster/networkmanager.conf.j2",
                         devices=",".join(f"interface-name:{name}" for name in interfaces))


NM_VALIDATOR = atomic.unit_file_validator(
    ["device-sparkrig-cluster"],
    {"match-device": r"interface-name:[A-Za-z0-9_.-]+(,interface-name:[A-Za-z0-9_.-]+)*", "managed": "0"},
)


def render_netplan(interfaces: Mapping[str, str], mtu: int) -> str:
    return rendering.render("cluster/netplan.yaml.j2", interfaces=sorted(interfaces.items()), mtu=mtu)


# netplan reads every file under /etc/netplan: the new one is checked with all the others,
# in a scratch root, before it takes effect. $1: the new file.
VERIFY_NETPLAN = r"""
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/etc/netplan" && cp /etc/netplan/*.yaml "$d/etc/netplan/" 2>/dev/null
cp "$1" "$d/etc/netplan/40-sparkrig-cluster.yaml" && netplan generate --root-dir "$d"
"""


def env_variables(
    interfaces: Sequence[str], own: str, head: str, name: str, extra: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The env file's variables: managed ones in a fixed order, then extras sorted."""
    every = ",".join(interfaces)
    managed = {
        "NCCL_SOCKET_IFNAME": every,
        "GLOO_SOCKET_IFNAME": interfaces[0],
        "TP_SOCKET_IFNAME": interfaces[0],
        "UCX_NET_DEVICES": every,
        "OMPI_MCA_btl_tcp_if_include": every,
        "OMPI_MCA_oob_tcp_if_include": every,
        "MASTER_ADDR": head,
        "VLLM_HOST_IP": own,
        "SPARKRIG_CLUSTER": name,
        "SPARKRIG_CLUSTER_HOSTFILE": HOSTFILE,
    }
    return [(key, managed[key]) for key in _MANAGED_ENV] + sorted(extra.items())


def render_env_file(variables: Sequence[tuple[str, str]]) -> str:
    return rendering.render(
        "cluster/cluster.env.j2", lines=[f"{key}={rendering.quote_literal(value)}" for key, value in variables]
    )


def first_address(interfaces: Mapping[str, str]) -> str:
    return str(ipaddress.IPv4Interface(next(iter(interfaces.values()))).ip)


def addresses(interfaces: Mapping[str, str]) -> list[str]:
    return [str(ipaddress.IPv4Interface(a).ip) for a in interfaces.values()]


def render_hostfile(nodes: Sequence[Mapping[str, Any]], slots: int) -> str:
    return rendering.render("cluster/hostfile.j2", nodes=nodes, slots=slots)


def render_known_hosts(nodes: Sequence[Mapping[str, Any]]) -> str:
    return rendering.render("cluster/known_hosts.j2", nodes=nodes)


def render_ssh_config(nodes: Sequence[Mapping[str, Any]], user: str) -> str:
    patterns = ",".join(address for node in nodes for address in node["addresses"])
    return rendering.render(
        "cluster/ssh_config.conf.j2", user=user, hosts=patterns, key=KEY_FILE, known_hosts=KNOWN_HOSTS
    )


def authorized_lines(nodes: Sequence[Mapping[str, Any]], name: str) -> list[str]:
    """The authorized_keys lines of the cluster: each node's own key (``node["public"]``),
    from that node's addresses only, no forwarding (``restrict``) but a terminal for
    interactive use. A node removed from the cluster takes its line, so its key, with it."""
    lines = []
    for node in nodes:
        key = " ".join(node["public"].split()[:2])
        sources = ",".join(node["addresses"])
        lines.append(f'from="{sources}",restrict,pty {key} {MARKER}{name}:{node_label(node["name"])}')
    return lines


def peer_links(interfaces: Mapping[str, str], peers: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Each peer address this host reaches, with its own interface on that subnet."""
    found = []
    for peer in peers:
        for address in peer["addresses"]:
            for name, own in interfaces.items():
                if ipaddress.IPv4Address(address) in ipaddress.IPv4Interface(own).network:
                    found.append({"name": peer["name"], "address": address, "interface": name})
    return found


def render_check(
    name: str, user: str, mtu: int, interfaces: Mapping[str, str], peers: Sequence[Mapping[str, Any]], env_file: str,
    hostfile: str = HOSTFILE, nccl_tests_bin: str = NCCL_TESTS_BIN,
) -> str:
    return rendering.render(
        "cluster/spark-cluster-check.sh.j2", name=name, user=user, mtu=mtu, interfaces=sorted(interfaces),
        peers=peer_links(interfaces, peers), hostfile=hostfile, env_file=env_file, nccl_tests_bin=nccl_tests_bin,
    )


def render_profile_script(env_file: str) -> str:
    return rendering.render("cluster/profile.sh.j2", env_file=env_file)


# The controller's key pair -----------------------------------------------------------------


def node_label(node: str) -> str:
    """An inventory name as a key directory's name and an authorized_keys comment: letters,
    digits, '.', '_' and '-' kept, anything else '_' (with a short hash, so two names differ)."""
    label = re.sub(r"[^A-Za-z0-9._-]", "_", node)
    if label != node or label in (".", ".."):
        label = f"{label}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"
    return label


def controller_key(key_dir: str, name: str, node: str) -> tuple[bytes, str]:
    """The key pair of ``node`` in cluster ``name`` on the controller (private bytes, public
    line), made once: ``KEY_DIR/NAME/NODE/id_ed25519`` (0600) in 0700 directories. Each
    node has its own pair, so a node removed from the cluster loses its login to the others.
    Two runs making it at once keep the first one's (the key is linked into place, never
    replaced)."""
    directory = Path(key_dir).expanduser() / name / node_label(node)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory.parent, 0o700)
    os.chmod(directory, 0o700)
    private = directory / "id_ed25519"
    if not private.exists():
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            new = Path(tmp) / "id_ed25519"
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{MARKER}{name}:{node_label(node)}",
                 "-f", str(new)],
                check=True, capture_output=True,
            )
            try:
                os.link(new, private)
            except FileExistsError:
                pass
    os.chmod(private, 0o600)
    public = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], check=True, capture_output=True, text=True)
    return private.read_bytes(), public.stdout.strip()


# Operations -----------------------------------------------------------------------------


class Secret(bytes):
    """Bytes that never show in a log (pyinfra's debug output prints commands' arguments)."""

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


def _stage_secret(state, host, directory: str, data: bytes) -> bool:
    """Upload ``data`` as the login user into ``directory``, made 0700 first (mkdir fails if
    anything is there): pyinfra's own uploads pass through a world-readable temp file."""
    ok, output = host.connector.run_shell_command(
        StringCommand("umask 077 && mkdir -m 700", QuoteString(directory))
    )
    if not ok:
        logger.error(f"{host.print_prefix}sparkrig: cannot make a private directory for the cluster key: {output.stderr}")
        return False
    return bool(host.connector.put_file(BytesIO(data), f"{directory}/key"))


@operation()
def private_key(dest: str, key: bytes, user: str, group: str):
    """
    Install a private key as a 0600 file of ``user``, never passing through a file others may read.

    + dest: where, in a directory of root's
    + key: the private key (OpenSSH format)
    + user: its owner
    + group: its group
    """
    staged = f"/tmp/sparkrig-key-{secrets.token_hex(8)}"
    temp = atomic.temp_path(dest)
    yield FunctionCommand(_stage_secret, (staged, Secret(key)), {})
    yield StringCommand(
        "install -d -m 755 -o root -g root", QuoteString(posixpath.dirname(dest)),
        "&& install -m 600 -o", QuoteString(user), "-g", QuoteString(group), QuoteString(f"{staged}/key"), QuoteString(temp),
        "&& ssh-keygen -y -f", QuoteString(temp), ">/dev/null && mv -f", QuoteString(temp), QuoteString(dest),
        "; s=$?; rm -rf", QuoteString(staged), QuoteString(temp), "; exit $s",
    )


# As the cluster user: their authorized_keys keeps every line but sparkrig's cluster
# lines, then gets $2's (a file in root's stage); written beside it, renamed over it.
# $1: their home.
_PUT_AUTHORIZED = (
    'set -e; umask 077; d="$1/.ssh"; f="$d/authorized_keys"; t="$d/.authorized_keys.sparkrig-new"; '
    'mkdir -p "$d"; '
    f'{{ if [ -f "$f" ]; then grep -v -F -e " {MARKER}" "$f" || [ $? -eq 1 ]; fi; cat "$2"; }} >"$t"; '
    'chmod 600 "$t"; mv -f "$t" "$f"'
)


@operation()
def authorized_key(user: str, home: str, lines: Sequence[str]):
    """
    Make ``lines`` the cluster lines of ``user``'s ``~/.ssh/authorized_keys``, written as them.

    + user: the cluster user
    + home: their home directory
    + lines: the authorized_keys lines (their comments start with ``sparkrig-cluster:``)
    """
    staged = f"{STAGE}/authorized-{secrets.token_hex(8)}"
    yield StringCommand("install -d -m 755 -o root -g root", QuoteString(STAGE))
    yield atomic.Upload(BytesIO("".join(f"{line}\n" for line in lines).encode()), staged)
    yield StringCommand(
        "chmod 644", QuoteString(staged), "&& runuser -u", QuoteString(user), "-- sh -c", QuoteString(_PUT_AUTHORIZED), "sparkrig",
        QuoteString(home), QuoteString(staged), "; s=$?; rm -f", QuoteString(staged), "; exit $s",
    )


# A change of the link is kept only when a NEW SSH connection confirms it (as `netplan try`
# does): before anything is written, the host arms a timer that puts the old link files back
# and applies them; the controller cancels it through a fresh connection once the change is
# applied. Nodes are changed one after the other, and none after one that failed.
LINK_DIR = "/var/lib/sparkrig/cluster-link"
LINK_LOADED = "/var/lib/sparkrig/cluster-link.loaded"  # touched when sparkrig's networkctl reload ran
ROLLBACK_UNIT = "sparkrig-cluster-rollback"
APPLY_UNIT = "sparkrig-cluster-apply"
NETWORKD_DIRS = ("/etc/systemd/network", "/run/systemd/network", "/usr/lib/systemd/network", "/lib/systemd/network")
_unconfirmed: set[str] = set()  # clusters whose link change a node did not confirm in this run


def render_link_apply(interfaces: Sequence[str], netplan: bool, networkmanager: bool) -> str:
    return rendering.render("cluster/link-apply.sh.j2", dir=LINK_DIR, loaded=LINK_LOADED, interfaces=list(interfaces),
                         netplan=netplan, networkmanager=networkmanager)


def render_link_rollback(paths: Sequence[str], added: Sequence[tuple[str, str]], started_networkd: bool) -> str:
    return rendering.render("cluster/link-rollback.sh.j2", dir=LINK_DIR, unit=ROLLBACK_UNIT, paths=list(paths),
                         added=list(added), started_networkd=started_networkd, networkd=NETWORKD)


def pending_check(own: Sequence[str]) -> str:
    """sh that fails, naming them, when networkd files other than ``own`` (name patterns)
    changed after systemd-networkd last loaded its files (its start, or sparkrig's last
    reload): ``networkctl reload`` would apply their change to their interfaces too."""
    skip = " ".join(f"! -name {shlex.quote(pattern)}" for pattern in own)
    return (
        f"if systemctl is-active -q {NETWORKD}; then "
        f'r="$d/networkd-started"; touch -d "$(systemctl show -P ActiveEnterTimestamp {NETWORKD})" "$r"; '
        f'if [ {LINK_LOADED} -nt "$r" ]; then r={LINK_LOADED}; fi; '
        f"p=$(find {' '.join(NETWORKD_DIRS)} -maxdepth 2 -type f "
        "\\( -name '*.network' -o -name '*.netdev' -o -path '*.network.d/*.conf' -o -path '*.netdev.d/*.conf' \\) "
        f'{skip} -newer "$r" 2>/dev/null | sort -u | tr "\\n" " "); '
        'if [ -n "$p" ]; then echo "sparkrig: changed since systemd-networkd loaded its files: ${p% }; '
        "networkctl reload would apply them to their interfaces too, so the cluster link is not changed: "
        f'apply them yourself (networkctl reload) and touch {LINK_LOADED}, or undo them" >&2; exit 1; fi; fi'
    )


def arm_rollback(paths: Sequence[str], own: Sequence[str], apply_script: str, rollback_script: str, seconds: int) -> str:
    """sh, as root: refuse while another link's change is pending, keep the old link files,
    write the apply and rollback scripts, arm the rollback timer."""
    keep = " ".join(paths)
    return (
        f"set -e; d={LINK_DIR}; install -d -m 755 -o root -g root /var/lib/sparkrig; "
        f"systemctl stop {ROLLBACK_UNIT}.timer {APPLY_UNIT}.service 2>/dev/null || true; "
        f"systemctl reset-failed {ROLLBACK_UNIT}.timer {ROLLBACK_UNIT}.service {APPLY_UNIT}.service 2>/dev/null || true; "
        f'rm -rf "$d"; mkdir -m 700 "$d"; {pending_check(own)}; '
        f'printf %s {shlex.quote(apply_script)} >"$d/apply.sh"; printf %s {shlex.quote(rollback_script)} >"$d/rollback.sh"; '
        f'for f in {keep}; do if [ -f "$f" ]; then mkdir -p "$d/old${{f%/*}}"; cp -a "$f" "$d/old$f"; fi; done; '
        f"systemd-run --quiet --unit={ROLLBACK_UNIT} --on-active={seconds}s --timer-property=AccuracySec=1s "
        f'/bin/sh "$d/rollback.sh"'
    )


# Through a NEW connection: the apply's outcome; when it succeeded, the rollback is cancelled.
CONFIRM = (
    f"d={LINK_DIR}; if [ -f \"$d/rolled-back\" ]; then echo rolled-back; "
    'elif [ ! -f "$d/applied" ]; then echo waiting; '
    f'elif [ "$(cat "$d/applied")" = 0 ]; then systemctl stop {ROLLBACK_UNIT}.timer && echo confirmed; '
    f'else echo "failed: $(tail -n 3 "$d/apply.log" | tr "\\n" " ")"; systemctl stop {ROLLBACK_UNIT}.timer; '
    f"systemctl start --no-block {ROLLBACK_UNIT}.service; fi"
)


def _not_after_a_failure(state, host, cluster: str) -> bool:
    if cluster in _unconfirmed:
        logger.error(f"{host.print_prefix}sparkrig: cluster {cluster}: the link is not changed here, as a node "
                     "before this one did not confirm its change in this run (see above)")
        return False
    return True


def _confirm_link(state, host, cluster: str, seconds: int) -> bool:
    """Confirm the link change through NEW SSH connections until the host's rollback timer
    would fire; else wait for it, and say whether the host came back."""
    deadline = time.monotonic() + seconds - 5
    said = "no new SSH connection"
    while time.monotonic() < deadline:
        ok, lines = run_on_new_connection(state, host, CONFIRM, timeout=10)
        answer = lines[-1] if ok and lines else ""
        if answer == "confirmed":
            return True
        if answer.startswith("failed") or answer == "rolled-back":
            said = f"the apply {answer}" if answer.startswith("failed") else "the host rolled back already"
            break
        if ok:
            said = "the apply did not finish"
        gevent.sleep(1)
    _unconfirmed.add(cluster)
    logger.error(f"{host.print_prefix}sparkrig: cluster {cluster}: the link change was not confirmed ({said}): "
                 f"the host puts its previous link files back and applies them by itself ({ROLLBACK_UNIT}.timer)")
    gevent.sleep(max(0.0, deadline + 15 - time.monotonic()))
    ok, lines = run_on_new_connection(state, host, f"cat {LINK_DIR}/rolled-back", timeout=10)
    if ok:
        logger.error(f"{host.print_prefix}sparkrig: cluster {cluster}: rolled back; a new SSH connection works again")
    else:
        logger.error(f"{host.print_prefix}sparkrig: cluster {cluster}: still no new SSH connection after the rollback "
                     f"time: reach the host another way ({LINK_DIR} holds the old files and rollback.sh)")
    return False


@operation()
def link(
    cluster: str, files: Sequence[tuple], stale: Sequence[str], start_networkd: Sequence[str], paths: Sequence[str],
    own: Sequence[str], interfaces: Sequence[str], added: Sequence[tuple[str, str]], netplan: bool,
    networkmanager: bool, seconds: int,
):
    """
    Change the cluster link: its files written, applied to its interfaces alone, kept only when
    a NEW SSH connection confirms it within ``seconds`` (else the host restores the old files).

    + cluster: the cluster's name
    + files: (dest, content, mode, validate, current) of each link file to write
    + stale: link files to remove
    + start_networkd: the commands that enable and start systemd-networkd (none when it runs)
    + paths: every link file sparkrig may hold here (kept before the change, restored after)
    + own: name patterns of the networkd files this change makes
    + interfaces: the cluster interfaces (never the one the deploy's connection uses)
    + added: (interface, address) the change adds (taken off again by a rollback)
    + netplan: the host renders netplan's files
    + networkmanager: NetworkManager runs and re-reads its configuration first (it lets go of them)
    + seconds: how long the host waits for the confirmation before it rolls back
    """
    yield FunctionCommand(_not_after_a_failure, (cluster,), {})
    apply_script = render_link_apply(interfaces, netplan, networkmanager)
    rollback_script = render_link_rollback(paths, added, bool(start_networkd))
    yield StringCommand(arm_rollback(paths, own, apply_script, rollback_script, seconds))
    for dest, content, mode, validate, current in files:
        yield from atomic.file._inner(dest=dest, content=content, mode=mode, validate=validate, current=current)
    if stale:
        yield StringCommand("rm -f", *[QuoteString(p) for p in stale])
    for command in start_networkd:
        yield command
    # Detached: a change that cuts this connection off still runs to its end.
    yield StringCommand(f"systemd-run --quiet --collect --unit={APPLY_UNIT} "
                        f"/bin/sh {LINK_DIR}/apply.sh")
    yield FunctionCommand(_confirm_link, (cluster, seconds), {})


# As the former cluster user: sparkrig's cluster lines leave their authorized_keys.
_DROP_AUTHORIZED = (
    'set -e; f="$1/.ssh/authorized_keys"; t="$1/.ssh/.authorized_keys.sparkrig-new"; [ -f "$f" ] || exit 0; '
    f'umask 077; {{ grep -v -F -e " {MARKER}" "$f" || [ $? -eq 1 ]; }} >"$t"; chmod 600 "$t"; mv -f "$t" "$f"'
)


@operation()
def leave(files: Sequence[str], key_owner: str | None):
    """
    Take a host out of its cluster: remove the files a node holds, and the cluster key's
    line from its user's authorized_keys (written as them).

    + files: the cluster files still there
    + key_owner: the user the cluster key belonged to (None: no key left)
    """
    messages.detail(f"removing {', '.join(files)}")
    if key_owner and key_owner != "root":
        yield StringCommand(
            "h=$(getent passwd", QuoteString(key_owner), "| cut -d: -f6) && [ -n \"$h\" ] && runuser -u",
            QuoteString(key_owner), "-- sh -c", QuoteString(_DROP_AUTHORIZED), 'sparkrig "$h" || true',
        )
    links = [f for f in files if f in (NETPLAN_FILE, NM_FILE) or f.startswith(f"{NETWORKD_DIR}/")]
    if not links or links == [NM_FILE]:
        yield StringCommand("rm -f", *[QuoteString(f) for f in files])
        if links:
            yield StringCommand("if systemctl is-active -q NetworkManager; then systemctl reload NetworkManager; fi")
        return
    # The link's interfaces alone are reconfigured (their files gone: unmanaged, addresses
    # dropped), never while another link's change waits to be loaded.
    interfaces = [f[len(f"{NETWORKD_DIR}/{NETWORKD_PREFIX}"):-len(".network")] for f in links if f.startswith(NETWORKD_DIR)]
    netplan = NETPLAN_FILE in links
    names = ([f"10-netplan-{i}.*" for i in interfaces] + ["10-netplan-*"] * netplan) or ["-"]
    apply = render_link_apply([*interfaces, *(["$n"] if netplan else [])], netplan, NM_FILE in links)
    yield StringCommand(
        f"set -e; d={LINK_DIR}; install -d -m 755 -o root -g root /var/lib/sparkrig; rm -rf \"$d\"; mkdir -m 700 \"$d\"; "
        + pending_check([f"{NETWORKD_PREFIX}*.network", *names]) + "; "
        + (f"n=$(sed -n 's/^    \\([A-Za-z0-9_.-]*\\):$/\\1/p' {NETPLAN_FILE} | tr '\\n' ' '); export n; " if netplan else "")
        + " ".join(["rm -f", *[shlex.quote(f) for f in files]]) + "; "
        + f"if systemctl is-active -q {NETWORKD}; then printf %s {shlex.quote(apply)} >\"$d/apply.sh\"; "
        + 'sh "$d/apply.sh"; cat "$d/apply.log"; [ "$(cat "$d/applied")" = 0 ]; fi'
    )


# The deploy --------------------------------------------------------------------------------


def _management_interface(links: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the address the deploy's SSH connection arrives at, the interface holding it)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None:
        return None, None
    address = transport.getpeername()[0]
    for name, link in links.items():
        if any(a.split("/")[0] == address for a in link["addresses"]):
            return address, name
    return address, None


def _node(name: str, settings: Mapping[str, Any], host_keys: Sequence[str]) -> dict:
    return {
        "name": name,
        "addresses": addresses(settings["cluster_interfaces"]),
        "first": first_address(settings["cluster_interfaces"]),
        "host_keys": list(host_keys),
        "public": controller_key(settings["cluster_key_dir"], settings["cluster_name"], name)[1],
    }


def _nodes(settings: Mapping[str, Any], own_keys: Sequence[str]) -> list[dict] | str:
    """Every node of this host's cluster, head first (with its host keys from its own
    reading), or why they cannot be had."""
    everyone = [(h.name, resolve(SETTINGS, h.data.dict())) for h in host.inventory]
    name = settings["cluster_name"]
    head = head_of(everyone, name)
    found = []
    for peer in host.inventory:
        peer_settings = dict(everyone)[peer.name]
        if peer_settings.get("cluster_name") != name:
            continue
        if peer.name == host.name:
            found.append(_node(peer.name, peer_settings, own_keys))
            continue
        with ctx_host.use(peer):
            value = reading.value(parts(peer_settings)[1])
            failed = host_output.fact_failed()
        if failed or not value["host_keys"]:
            return f"cluster node {peer.name} could not be read (or has no SSH host key): its trust is not written"
        found.append(_node(peer.name, peer_settings, value["host_keys"]))
    found.sort(key=lambda node: node["name"] != head)
    return found


@deploy("Cluster", data_defaults=ALL_DEFAULTS)
def cluster():
    """
    Link this host to the other nodes of its cluster, trust them, and give jobs NCCL's environment.

    Settings: ``cluster_name`` (None: nothing is done), ``cluster_interfaces``, ``cluster_mtu``,
    ``cluster_head``, ``cluster_user``, ``cluster_slots``, ``cluster_key_dir``,
    ``cluster_env_file``, ``cluster_env_extra``; see docs/settings.md and docs/cluster.md.
    """
    settings = resolve(SETTINGS, host.data.dict())
    wanted = parts(settings)
    if settings["cluster_name"] is None:
        leftovers = reading.value(wanted[0])
        if leftovers["files"] and not host_output.fact_failed():
            leave(name="Out of any cluster: its key, trust, environment and link files removed",
                  files=leftovers["files"], key_owner=leftovers["key_owner"])
        return
    state_part, node_part = wanted
    state = reading.value(state_part)
    node = reading.value(node_part)
    if host_output.fact_failed():
        return
    name, user, mtu = settings["cluster_name"], settings["cluster_user"], settings["cluster_mtu"]
    interfaces: dict[str, str] = dict(settings["cluster_interfaces"])
    files = state["files"]

    missing = [i for i in interfaces if i not in node["links"]]
    if missing:
        messages.refused(name="Cluster interfaces exist", message=f"cluster_interfaces names {', '.join(missing)}, "
                       f"which this host has no interface of (it has {', '.join(sorted(node['links']))})")
        return
    address, management = _management_interface(node["links"])
    if management in interfaces:
        messages.refused(name="Cluster link is not the deploy's connection", message=(
            f"{management} carries this deploy's SSH connection ({address}): sparkrig never reconfigures "
            "it as a cluster link; connect through another interface"))
        return
    if node["user"] is None:
        messages.refused(name="Cluster user exists", message=f"cluster_user {user} is no user on this host: create it first")
        return
    if not node["ssh_config_d"]:
        messages.refused(name="ssh reads /etc/ssh/ssh_config.d", message=(
            "/etc/ssh/ssh_config has no 'Include /etc/ssh/ssh_config.d/*.conf': the cluster's pinned host keys "
            "would not apply"))
        return
    left_out = [
        peer.name for peer in host.inventory
        if resolve(SETTINGS, peer.data.dict())["cluster_name"] == name and not host.state.is_host_in_limit(peer)
    ]
    if left_out:
        # Half a cluster is never configured: its nodes' trust and hostfile must agree.
        logger.warning(
            f"{host.print_prefix}cluster {name}: {', '.join(left_out)} not in this run (--limit): "
            "nothing of the cluster is changed; run all its nodes together to converge it"
        )
        return
    nodes = _nodes(settings, node["host_keys"])
    if isinstance(nodes, str):
        messages.refused(name="Cluster nodes are read", message=nodes)
        return
    peers = [n for n in nodes if n["name"] != host.name]

    if any(state["packages"].get(p) is None for p in PACKAGES):
        install_packages(name="Install ping (iputils-ping) for spark-cluster-check", packages=list(PACKAGES))

    # The link.
    netplan = node["netplan"]
    if netplan:
        contents = {NETPLAN_FILE: (render_netplan(interfaces, mtu), 0o600, ("sh", "-c", VERIFY_NETPLAN, "verify"))}
    else:
        contents = {
            path: (render_networkd(i, interfaces[i], mtu), 0o644, NETWORKD_VALIDATOR)
            for i, path in zip(interfaces, link_files(interfaces, False))
        }
        if node["networkmanager"]:
            contents[NM_FILE] = (render_networkmanager(interfaces), 0o644, NM_VALIDATOR)
    writes = [
        (dest, content, mode, validate, files.get(dest))
        for dest, (content, mode, validate) in contents.items()
        if not atomic.up_to_date(files.get(dest), content, mode=mode)
    ]
    stale = sorted(set(node["link_files"]) - set(contents))
    units = state["units"]
    start_networkd = []
    if (units.get(NETWORKD, {}).get("active"), units.get(NETWORKD, {}).get("enabled")) != ("active", "enabled"):
        start_networkd = [f"systemctl enable --now {NETWORKD}"]
        if units.get(WAIT_ONLINE, {}).get("enabled") not in ("enabled", "enabled-runtime"):
            # Enabling networkd enables its wait-online too (Also=), which would hold boot up
            # to two minutes for links it does not manage: keep boot as it was.
            start_networkd.append(f"systemctl disable {WAIT_ONLINE}")
    drifted = [
        i for i, a in interfaces.items()
        if not node["links"][i]["up"] or node["links"][i]["mtu"] != mtu or a not in node["links"][i]["addresses"]
    ]
    if writes or stale or start_networkd or drifted:
        for dest, *_rest in writes:
            messages.detail(f"writing {dest}")
        if stale:
            messages.detail(f"removing {', '.join(stale)}")
        if drifted:
            messages.detail(f"{', '.join(drifted)}: down, or MTU or address not as configured")
        link(
            name="Cluster link: written, applied to its interfaces alone, kept once a new SSH connection confirms it",
            cluster=name, files=writes, stale=stale, start_networkd=start_networkd,
            paths=sorted({*contents, *stale, *node["link_files"]}),
            own=[f"{NETWORKD_PREFIX}*.network", *[f"10-netplan-{i}.*" for i in interfaces]],
            interfaces=list(interfaces),
            added=[(i, a) for i, a in interfaces.items() if a not in node["links"][i]["addresses"]],
            netplan=netplan, networkmanager=node["networkmanager"] and not netplan,
            seconds=settings["cluster_link_confirm_seconds"],
            _serial=True,  # node after node: a change no new connection confirms stops the others'
        )

    # Trust.
    key, _public = controller_key(settings["cluster_key_dir"], name, host.name)
    group = node["user"]["group"]
    if not atomic.up_to_date(files.get(KEY_FILE), key, mode=0o600, user=user, group=group):
        private_key(name=f"Cluster key of {user} ({KEY_FILE}, 0600)", dest=KEY_FILE, key=key, user=user, group=group)
    root_files = {
        KNOWN_HOSTS: ("Every node's pinned host keys", render_known_hosts(nodes), 0o644, None),
        SSH_CONFIG: ("ssh uses the cluster key and the pinned host keys between nodes",
                     render_ssh_config(nodes, user), 0o644,
                     ("sh", "-c", 'ssh -G -F "$1" 127.0.0.1 >/dev/null', "verify")),
        HOSTFILE: ("MPI hostfile", render_hostfile(nodes, settings["cluster_slots"]), 0o644, None),
        settings["cluster_env_file"]: (
            "NCCL environment (cluster_env_file)",
            render_env_file(env_variables(
                list(interfaces), first_address(interfaces), nodes[0]["first"], name, settings["cluster_env_extra"]
            )),
            0o644, ("sh", "-n"),
        ),
        PROFILE_SCRIPT: ("Login shells read the NCCL environment", render_profile_script(settings["cluster_env_file"]),
                         0o644, ("sh", "-n")),
        CHECK: ("spark-cluster-check command",
                render_check(name, user, mtu, interfaces, peers, settings["cluster_env_file"]), 0o755, ("sh", "-n")),
    }
    for dest, (title, content, mode, validate) in host.loop(root_files.items()):
        if not atomic.up_to_date(files.get(dest), content, mode=mode):
            atomic.file(name=f"{title} ({dest})", dest=dest, current=files.get(dest), content=content, mode=mode,
                        validate=validate)
    lines = authorized_lines(nodes, name)
    if node["user"]["authorized"] != lines:
        authorized_key(name=f"Each node's own cluster key in {user}'s authorized_keys, from that node's addresses only",
                       user=user, home=node["user"]["home"], lines=lines)
