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

from .environment import (
    addresses,
    env_variables,
    first_address,
    no_rdma_note,
    peer_links,
    render_check,
    render_env_file,
    render_hostfile,
    render_profile_script,
)
from .facts import (
    CHECK,
    HOSTFILE,
    KEY_FILE,
    KNOWN_HOSTS,
    NETPLAN_FILE,
    NETWORKD,
    NETWORKD_PREFIX,
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
from .link import (
    NETWORKD_VALIDATOR,
    NM_VALIDATOR,
    VERIFY_NETPLAN,
    link,
    render_netplan,
    render_networkd,
    render_networkmanager,
)
from .settings import DEFAULTS, SETTINGS
from .trust import (
    VERIFY_SSH_CONFIG,
    authorized_key,
    authorized_lines,
    controller_key,
    private_key,
    render_known_hosts,
    render_ssh_config,
)


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
        leftovers = reading.value(wanted[0])
        if leftovers["files"] and not host_output.fact_failed():
            leave(
                name="Out of any cluster: its key, trust, environment and link files removed",
                files=leftovers["files"],
                key_owner=leftovers["key_owner"],
            )
        return
    state_part, node_part = wanted
    state = reading.value(state_part)
    node = reading.value(node_part)
    if host_output.fact_failed():
        return
    name, user, mtu = settings["cluster_name"], settings["cluster_user"], settings["cluster_mtu"]
    # Every rail: the listed interfaces and the twins read here. The link's data carries them
    # all, so the link's write, apply and rollback treat a twin as any other interface.
    interfaces: dict[str, str] = rails(settings, node)
    devices = {i: node["rdma"][i] for i in interfaces if i in node["rdma"]}
    files = {**node["link_state"], **state["files"]}

    missing = [i for i in settings["cluster_interfaces"] if i not in node["links"]]
    if missing:
        messages.refused(
            name="Cluster interfaces exist",
            message=f"cluster_interfaces names {', '.join(missing)}, "
            f"which this host has no interface of (it has {', '.join(sorted(node['links']))})",
        )
        return
    address, management = _management_interface(node["links"])
    if management in interfaces:
        messages.refused(
            name="Cluster link is not the deploy's connection",
            message=(
                f"{management} carries this deploy's SSH connection ({address}): sparkrig never reconfigures "
                "it as a cluster link; connect through another interface"
            ),
        )
        return
    if node["user"] is None:
        messages.refused(
            name="Cluster user exists", message=f"cluster_user {user} is no user on this host: create it first"
        )
        return
    if not node["ssh_config_d"]:
        messages.refused(
            name="ssh reads /etc/ssh/ssh_config.d",
            message=(
                "/etc/ssh/ssh_config has no 'Include /etc/ssh/ssh_config.d/*.conf': the cluster's pinned host keys "
                "would not apply"
            ),
        )
        return
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
        return
    nodes = _nodes(settings, node)
    if isinstance(nodes, str):
        messages.refused(name="Cluster nodes are read", message=nodes)
        return
    peers = [n for n in nodes if n["name"] != host.name]

    if any(state["packages"].get(p) is None for p in PACKAGES):
        install_packages(name="Install ping (iputils-ping) for spark-cluster-check", packages=list(PACKAGES))
    if devices and any(state["packages"].get(p) is None for p in RDMA_PACKAGES):
        install_packages(
            name="Install ib_write_bw (perftest) for spark-cluster-check --bandwidth", packages=list(RDMA_PACKAGES)
        )
    note = None if devices else no_rdma_note(list(interfaces))
    if note:
        messages.detail(f"cluster {name}: {note}")

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
        # DGX OS: NetworkManager manages every port, netplan or not.
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
        i
        for i, a in interfaces.items()
        if not node["links"][i]["up"]
        or node["links"][i]["mtu"] != mtu
        or a not in node["links"][i]["addresses"]
        or (node["networkmanager"] and i in node["nm_managed"])
    ]
    if writes or stale or start_networkd or drifted:
        for dest, *_rest in writes:
            messages.detail(f"writing {dest}")
        if stale:
            messages.detail(f"removing {', '.join(stale)}")
        if drifted:
            messages.detail(f"{', '.join(drifted)}: down, MTU or address not as configured, or NetworkManager's")
        link(
            name="Cluster link: written, applied to its interfaces alone, kept once a new SSH connection confirms it",
            cluster=name,
            files=writes,
            stale=stale,
            start_networkd=start_networkd,
            paths=sorted({*contents, *stale, *node["link_files"]}),
            own=[f"{NETWORKD_PREFIX}*.network", *[f"10-netplan-{i}.*" for i in interfaces]],
            interfaces=list(interfaces),
            added=[(i, a) for i, a in interfaces.items() if a not in node["links"][i]["addresses"]],
            netplan=netplan,
            networkmanager=node["networkmanager"],
            seconds=settings["cluster_link_confirm_seconds"],
            ports=[(i, a, mtu, [p["address"] for p in peer_links({i: a}, peers)]) for i, a in interfaces.items()],
            _serial=True,  # node after node: a change no new connection confirms stops the others'
        )

    # Trust.
    key, _public = controller_key(settings["cluster_key_dir"], name, host.name, node["host_keys"])
    group = node["user"]["group"]
    if not atomic.up_to_date(files.get(KEY_FILE), key, mode=0o600, user=user, group=group):
        private_key(name=f"Cluster key of {user} ({KEY_FILE}, 0600)", dest=KEY_FILE, key=key, user=user, group=group)
    root_files = {
        KNOWN_HOSTS: ("Every node's pinned host keys", render_known_hosts(nodes), 0o644, None),
        SSH_CONFIG: (
            "ssh uses the cluster key and the pinned host keys between nodes",
            render_ssh_config(nodes, user),
            0o644,
            ("sh", "-c", VERIFY_SSH_CONFIG, "verify"),
        ),
        HOSTFILE: ("MPI hostfile", render_hostfile(nodes, settings["cluster_slots"]), 0o644, None),
        settings["cluster_env_file"]: (
            "NCCL environment (cluster_env_file)",
            render_env_file(
                env_variables(
                    list(interfaces),
                    first_address(interfaces),
                    nodes[0]["first"],
                    name,
                    settings["cluster_env_extra"],
                    list(devices.values()),
                ),
                note,
            ),
            0o644,
            ("sh", "-n"),
        ),
        PROFILE_SCRIPT: (
            "Login shells read the NCCL environment",
            render_profile_script(settings["cluster_env_file"]),
            0o644,
            ("sh", "-n"),
        ),
        CHECK: (
            "spark-cluster-check command",
            render_check(
                name,
                user,
                mtu,
                interfaces,
                peers,
                settings["cluster_env_file"],
                devices=devices,
                rail_floor=settings["cluster_rail_floor_gbits"],
                nccl_floor=settings["cluster_nccl_floor_gbytes"],
            ),
            0o755,
            ("sh", "-n"),
        ),
    }
    for dest, (title, content, mode, validate) in host.loop(root_files.items()):
        if not atomic.up_to_date(files.get(dest), content, mode=mode):
            atomic.file(
                name=f"{title} ({dest})",
                dest=dest,
                current=files.get(dest),
                content=content,
                mode=mode,
                validate=validate,
            )
    lines = authorized_lines(nodes, name)
    if node["user"]["authorized"] != lines:
        authorized_key(
            name=f"Each node's own cluster key in {user}'s authorized_keys, from that node's addresses only",
            user=user,
            home=node["user"]["home"],
            lines=lines,
        )
