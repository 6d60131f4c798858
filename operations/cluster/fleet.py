"""Clusters: the checks across a cluster's nodes, on the controller before any host is
contacted (sparkrig.settings.validate_hosts runs them): the same user, MTU and head on
every node, addresses unique, one subnet per link, and every cluster subnet clear of the
controller's own path to each node."""

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
