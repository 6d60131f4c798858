"""Clusters: the rails each node's addresses are planned on, and the checks across a
cluster's nodes, on the controller before any host is contacted (sparkrig.settings.
validate_hosts runs them): the same user, MTU, head, rails and topology on every node,
addresses unique, one subnet per rail, the topology's subnets (a direct cable's two nodes,
a switch's every node), and every cluster subnet clear of the controller's own path to
each node."""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any


def _said(key: str, value: Any, allowed: str) -> str:
    return f"{key} = {value!r}: allowed is {allowed}"


# A QSFP port of a Spark is two interfaces, "twins" (enp1s0f0np0 and enP2p1s0f0np0, each a
# PCIe x4 link with its own RoCE device): each twin is a rail of its own, on a subnet of its
# own (NVIDIA's Cluster Assistant does so; one subnet for both confuses routing). A listed
# interface's twin takes the same host number TWIN_STEP subnets of its size further on:
# 192.168.100.11/24's twin is 192.168.200.11/24, so ports numbered 100, 101, 102 keep their
# twins on 200, 201, 202.
TWIN_STEP = 100
_PRIVATE = tuple(ipaddress.IPv4Network(b) for b in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def twin_address(address: str) -> str | None:
    """The address the twin of an interface at ``address`` gets, or None where that would
    leave the port's /8 or the private range it is in."""
    interface = ipaddress.IPv4Interface(address)
    shift = TWIN_STEP * interface.network.num_addresses
    if int(interface.ip) + shift > int(ipaddress.IPv4Address("255.255.255.255")):
        return None
    moved = ipaddress.IPv4Interface(f"{ipaddress.IPv4Address(int(interface.ip) + shift)}/{interface.network.prefixlen}")
    if (int(moved.ip) >> 24) != (int(interface.ip) >> 24):
        return None
    for block in _PRIVATE:  # RFC 1918: a port in one keeps its twin in it
        if interface.ip in block and moved.ip not in block:
            return None
    return str(moved)


def planned_rails(interfaces: Mapping[str, str], rails: str, twins: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every rail of a node: each interface of ``cluster_interfaces`` with its address, and
    with ``cluster_rails`` 'twins' the twin of each (its name from ``twins``, read from the
    host) that the list does not name itself, at :func:`twin_address`. Without ``twins``
    (the settings alone, before any host is read) each twin is named ``twin of IF``: what
    validation checks, as if every port had one."""
    found = dict(interfaces)
    if rails != "twins":
        return found
    for name, address in interfaces.items():
        twin = f"twin of {name}" if twins is None else twins.get(name)
        moved = twin_address(address)
        if twin is not None and twin not in interfaces and moved is not None:
            found[twin] = moved
    return found


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
            found.append(
                (
                    nodes[0],
                    _said("cluster_name", cluster, "the name of a cluster of two hosts or more (no other host has it)"),
                )
            )
            continue
        for key in ("cluster_user", "cluster_mtu", "cluster_head", "cluster_rails", "cluster_topology"):
            values = {n: data[n].get(key) for n in nodes}
            if len({repr(v) for v in values.values()}) > 1:
                first = values[nodes[0]]
                for node in nodes[1:]:
                    if repr(values[node]) != repr(first):
                        found.append(
                            (
                                node,
                                _said(
                                    key,
                                    values[node],
                                    f"the same value on every node of cluster {cluster!r} ({nodes[0]} has {first!r})",
                                ),
                            )
                        )
        head = data[nodes[0]].get("cluster_head")
        if head is not None and head not in nodes:
            for node in nodes:
                found.append((node, _said("cluster_head", head, f"a host of cluster {cluster!r}: {', '.join(nodes)}")))
        found += _address_problems(cluster, nodes, data)
    return found


def _rail_key(name: str) -> str:
    """The setting a rail's address comes from: a listed interface's, or cluster_rails' twin."""
    return "cluster_rails" if name.startswith("twin of ") else "cluster_interfaces"


def _address_problems(
    cluster: str, nodes: Sequence[str], data: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, str]]:
    found = []
    owner: dict[ipaddress.IPv4Address, str] = {}
    subnets: dict[ipaddress.IPv4Network, list[str]] = {}
    for node in nodes:
        interfaces = data[node]["cluster_interfaces"]
        rails = planned_rails(interfaces, data[node].get("cluster_rails", "twins"))
        for name, address in interfaces.items():
            if data[node].get("cluster_rails", "twins") == "twins" and twin_address(address) is None:
                found.append(
                    (
                        node,
                        _said(
                            "cluster_rails",
                            "twins",
                            (
                                f"'listed' where a port's twin cannot take its address {TWIN_STEP} subnets further on "
                                f"({name} is at {address}: its twin's would leave its /8 or private range); "
                                "list the twin in cluster_interfaces yourself"
                            ),
                        ),
                    )
                )
        for name, address in rails.items():
            key = _rail_key(name)
            value = interfaces if key == "cluster_interfaces" else data[node].get("cluster_rails", "twins")
            where = f" ({name}'s rail would be {address})" if key == "cluster_rails" else ""
            interface = ipaddress.IPv4Interface(address)
            if interface.ip in owner:
                found.append(
                    (
                        node,
                        _said(
                            key,
                            value,
                            f"addresses unique in cluster {cluster!r} "
                            f"({interface.ip} is also {owner[interface.ip]}'s){where}",
                        ),
                    )
                )
            owner.setdefault(interface.ip, node)
            clash = next((s for s in subnets if s.overlaps(interface.network) and s != interface.network), None)
            if clash is not None:
                found.append(
                    (
                        node,
                        _said(
                            key,
                            value,
                            f"one subnet per rail: {address} overlaps {clash}, which {subnets[clash][0]} uses{where}",
                        ),
                    )
                )
                continue
            mine = [n for n in subnets.get(interface.network, []) if n == node]
            if mine:
                found.append(
                    (node, _said(key, value, f"one subnet per rail: two rails of {node} in {interface.network}{where}"))
                )
                continue
            subnets.setdefault(interface.network, []).append(node)
        found += _management_problems(node, data[node], rails)
    found += _topology_problems(cluster, nodes, data, subnets)
    return found


def _topology_problems(
    cluster: str,
    nodes: Sequence[str],
    data: Mapping[str, Mapping[str, Any]],
    subnets: Mapping[ipaddress.IPv4Network, list[str]],
) -> list[tuple[str, str]]:
    """Direct cables: each rail's subnet holds the two nodes a cable joins. A switch: each
    rail's subnet holds every node (every node reaches every node on each rail)."""
    found = []
    topology = data[nodes[0]].get("cluster_topology", "direct")
    for network, holders in subnets.items():
        if len(holders) < 2:
            node = holders[0]
            found.append(
                (
                    node,
                    _said(
                        "cluster_interfaces",
                        data[node]["cluster_interfaces"],
                        f"links to other nodes: no other node of cluster {cluster!r} has an address in {network}",
                    ),
                )
            )
        elif topology == "direct" and len(holders) > 2:
            for node in holders:
                found.append(
                    (
                        node,
                        _said(
                            "cluster_topology",
                            "direct",
                            (
                                f"'switch' for a subnet of more than two nodes: {network} holds {', '.join(holders)}, "
                                "and a direct cable joins two (through a switch, every node is on every rail's subnet)"
                            ),
                        ),
                    )
                )
        elif topology == "switch" and len(holders) < len(nodes):
            for node in (n for n in nodes if n not in holders):
                found.append(
                    (
                        node,
                        _said(
                            "cluster_interfaces",
                            data[node]["cluster_interfaces"],
                            (
                                f"an address in every rail's subnet of cluster {cluster!r} (cluster_topology 'switch': "
                                f"every node reaches every node on each rail); {node} has none in {network}"
                            ),
                        ),
                    )
                )
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
        return [
            (
                node,
                _said(
                    "ssh_hostname",
                    target,
                    (
                        f"a host name the controller resolves, or an IPv4 address ({error}): a cluster node's "
                        "management path is checked against its cluster subnets before any host is contacted"
                    ),
                ),
            )
        ]
    if node_ip is None:  # IPv6 only: no IPv4 cluster subnet can take its path
        return []
    source, route = controller_route(node_ip)
    found = []
    for name, address in interfaces.items():
        network = ipaddress.IPv4Interface(address).network
        if node_ip in network:
            why = f"the address the deploy connects to ({node_ip} is in {network})"
        elif source is not None and source in network:
            why = (
                f"the controller's own address towards this host ({source}, the source of its route to "
                f"{node_ip}, is in {network}: the node would answer the controller through the link)"
            )
        elif route is not None and route.overlaps(network):
            why = (
                f"the controller's route to this host ({node_ip} is reached through {route}, which {network} overlaps)"
            )
        else:
            continue
        key = _rail_key(name)
        value = data["cluster_interfaces"] if key == "cluster_interfaces" else data.get("cluster_rails")
        where = f" ({name}'s rail would be {address})" if key == "cluster_rails" else ""
        found.append(
            (
                node,
                _said(
                    key,
                    value,
                    f"subnets apart from {why}: sparkrig never reconfigures its own connection{where}",
                ),
            )
        )
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
            nets = [
                ipaddress.IPv4Network(r["dst"], strict=False)
                for r in json.loads(routes.stdout or "[]")
                if r.get("dst") not in (None, "default")
            ]
            route = max(nets, key=lambda n: n.prefixlen, default=None)
            return (ipaddress.IPv4Address(source) if source else None), route
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((str(address), 22))
        except OSError:
            return None, None
        return ipaddress.IPv4Address(probe.getsockname()[0]), None
