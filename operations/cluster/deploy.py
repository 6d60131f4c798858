"""Clusters: the deploy. Each node reads itself once (a peer's reading gives its host keys,
and a node whose host keys changed, reinstalled, a new key pair for every node's trust),
then its link, trust and NCCL environment are changed where they differ from the settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.context import ctx_host

from sparkrig import atomic, host_output, host_settings, messages, reading
from sparkrig.packages import installed as install_packages
from sparkrig.settings import defaults

from .environment import addresses, converge_environment, first_address, no_rdma_note
from .facts import (
    CHECK,
    HOSTFILE,
    KEY_FILE,
    KNOWN_HOSTS,
    NETPLAN_FILE,
    NETWORKD,
    NM_FILE,
    PACKAGES,
    PROFILE_SCRIPT,
    RDMA_PACKAGES,
    SSH_CONFIG,
    WAIT_ONLINE,
    ClusterHost,
    ClusterLeftovers,
    link_files,
)
from .fleet import head_of, planned_rails
from .leave import leave
from .link import converge_link
from .settings import DEFAULTS, SETTINGS
from .trust import controller_key, converge_trust


def _files(settings: Mapping[str, Any]) -> tuple[str, ...]:
    # Both forms of the link file: which one a host uses is read in the same reading.
    return (
        *link_files(settings["cluster_interfaces"], False),
        NETPLAN_FILE,
        NM_FILE,
        KEY_FILE,
        KNOWN_HOSTS,
        HOSTFILE,
        SSH_CONFIG,
        settings["cluster_env_file"],
        PROFILE_SCRIPT,
        CHECK,
    )


def parts(settings: Mapping[str, Any]) -> list[reading.Part]:
    """The parts a node of a cluster reads; off a cluster, what a node would have left."""
    settings = {**defaults(SETTINGS), **settings}
    if settings["cluster_name"] is None:
        return [reading.part(ClusterLeftovers, env_file=settings["cluster_env_file"])]
    return [
        reading.part(
            atomic.HostState,
            paths=_files(settings),
            units=(NETWORKD, WAIT_ONLINE),
            packages=(*PACKAGES, *RDMA_PACKAGES),
        ),
        reading.part(ClusterHost, user=settings["cluster_user"]),
    ]


@reading.planner
def reads(settings):
    return parts(settings)


def _management_interface(links: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the address the deploy's SSH connection arrives at, the interface holding it)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None:
        return None, None
    address = transport.getpeername()[0]
    for name, interface in links.items():
        if any(a.split("/")[0] == address for a in interface["addresses"]):
            return address, name
    return address, None


def rails(settings: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, str]:
    """A node's rails (interface: address): its cluster_interfaces and, with cluster_rails
    'twins', the twins its own reading found."""
    return planned_rails(settings["cluster_interfaces"], settings.get("cluster_rails", "twins"), node.get("twins", {}))


def _node(
    name: str, settings: Mapping[str, Any], host_keys: Sequence[str], node: Mapping[str, Any] | None = None
) -> dict:
    """One node as the others see it; ``node`` its reading (its twins and RDMA devices)."""
    node = node or {}
    interfaces = rails(settings, node)
    return {
        "name": name,
        "addresses": addresses(interfaces),
        "first": first_address(interfaces),
        "devices": {a.split("/")[0]: node.get("rdma", {}).get(i, "") for i, a in interfaces.items()},
        "host_keys": list(host_keys),
        "public": controller_key(settings["cluster_key_dir"], settings["cluster_name"], name, host_keys)[1],
    }


def _nodes(settings: Mapping[str, Any], own: Mapping[str, Any]) -> list[dict] | str:
    """Every node of this host's cluster, head first (with its host keys from its own
    reading), or why they cannot be had."""
    everyone = [(h.name, host_settings.known(h)) for h in host.inventory]
    name = settings["cluster_name"]
    head = head_of(everyone, name)
    found = []
    for peer in host.inventory:
        peer_settings = dict(everyone)[peer.name]
        if peer_settings.get("cluster_name") != name:
            continue
        if peer.name == host.name:
            found.append(_node(peer.name, peer_settings, own["host_keys"], own))
            continue
        with ctx_host.use(peer):
            value = reading.value(parts(peer_settings)[1])
            failed = host_output.fact_failed()
        if failed or not value["host_keys"]:
            return f"cluster node {peer.name} could not be read (or has no SSH host key): its trust is not written"
        found.append(_node(peer.name, peer_settings, value["host_keys"], value))
    found.sort(key=lambda node: node["name"] != head)
    return found


@deploy("Cluster", data_defaults=DEFAULTS)
def cluster():
    """
    Link this host to the other nodes of its cluster, trust them, and give jobs NCCL's environment.

    Settings: ``cluster_name`` (None: nothing is done), ``cluster_interfaces``, ``cluster_rails``,
    ``cluster_topology``, ``cluster_rail_floor_gbits``, ``cluster_nccl_floor_gbytes``, ``cluster_mtu``,
    ``cluster_head``, ``cluster_user``, ``cluster_slots``, ``cluster_key_dir``, ``cluster_env_file``,
    ``cluster_env_extra``; see docs/settings.md and docs/cluster.md.
    """
    settings = host_settings.current()
    wanted = parts(settings)
    if settings["cluster_name"] is None:
        _left(wanted[0])
        return
    state_part, node_part = wanted
    state = reading.value(state_part)
    node = reading.value(node_part)
    if host_output.fact_failed():
        return
    # Every rail: the listed interfaces and the twins read here. The link's data carries them
    # all, so the link's write, apply and rollback treat a twin as any other interface.
    interfaces: dict[str, str] = rails(settings, node)
    devices = {i: node["rdma"][i] for i in interfaces if i in node["rdma"]}
    if not _ready(settings, node, interfaces):
        return
    nodes = _nodes(settings, node)
    if isinstance(nodes, str):
        messages.refused(name="Cluster nodes are read", message=nodes)
        return
    note = _tools(settings, state, interfaces, devices)
    converge_link(settings, node, state, interfaces, [n for n in nodes if n["name"] != host.name])
    converge_trust(settings, node, {**node["link_state"], **state["files"]}, nodes)
    converge_environment(settings, state["files"], interfaces, devices, nodes, note)


def _left(leftovers_part: reading.Part) -> None:
    """Off a cluster: what a node of one would have left is removed."""
    leftovers = reading.value(leftovers_part)
    if leftovers["files"] and not host_output.fact_failed():
        leave(
            name="Out of any cluster: its key, trust, environment and link files removed",
            files=leftovers["files"],
            key_owner=leftovers["key_owner"],
        )


def _ready(settings: Mapping[str, Any], node: Mapping[str, Any], interfaces: Mapping[str, str]) -> bool:
    """Whether this node may be changed: its interfaces and cluster user exist, no rail is the
    deploy's own connection, ssh reads ssh_config.d, and every node of its cluster is in this
    run. Says why where not."""
    name, user = settings["cluster_name"], settings["cluster_user"]
    missing = [i for i in settings["cluster_interfaces"] if i not in node["links"]]
    if missing:
        messages.refused(
            name="Cluster interfaces exist",
            message=f"cluster_interfaces names {', '.join(missing)}, "
            f"which this host has no interface of (it has {', '.join(sorted(node['links']))})",
        )
        return False
    address, management = _management_interface(node["links"])
    if management in interfaces:
        messages.refused(
            name="Cluster link is not the deploy's connection",
            message=(
                f"{management} carries this deploy's SSH connection ({address}): sparkrig never reconfigures "
                "it as a cluster link; connect through another interface"
            ),
        )
        return False
    if node["user"] is None:
        messages.refused(
            name="Cluster user exists", message=f"cluster_user {user} is no user on this host: create it first"
        )
        return False
    if not node["ssh_config_d"]:
        messages.refused(
            name="ssh reads /etc/ssh/ssh_config.d",
            message=(
                "/etc/ssh/ssh_config has no 'Include /etc/ssh/ssh_config.d/*.conf': the cluster's pinned host keys "
                "would not apply"
            ),
        )
        return False
    left_out = [
        peer.name
        for peer in host.inventory
        if host_settings.known(peer)["cluster_name"] == name and not host.state.is_host_in_limit(peer)
    ]
    if left_out:
        # Half a cluster is never configured: its nodes' trust and hostfile must agree.
        logger.warning(
            f"{host.print_prefix}cluster {name}: {', '.join(left_out)} not in this run (--limit): "
            "nothing of the cluster is changed; run all its nodes together to converge it"
        )
        return False
    return True


def _tools(
    settings: Mapping[str, Any], state: Mapping[str, Any], interfaces: Mapping[str, str], devices: Mapping[str, str]
) -> str | None:
    """What spark-cluster-check runs (ping; ib_write_bw where a rail has RDMA). Returns the
    note for a node without RDMA (said here, and written into the NCCL environment)."""
    if any(state["packages"].get(p) is None for p in PACKAGES):
        install_packages(name="Install ping (iputils-ping) for spark-cluster-check", packages=list(PACKAGES))
    if devices and any(state["packages"].get(p) is None for p in RDMA_PACKAGES):
        install_packages(
            name="Install ib_write_bw (perftest) for spark-cluster-check --bandwidth", packages=list(RDMA_PACKAGES)
        )
    note = None if devices else no_rdma_note(list(interfaces))
    if note:
        messages.detail(f"cluster {settings['cluster_name']}: {note}")
    return note
