"""Clusters: what jobs read on a node: NCCL's environment (cluster_env_file, read by login
shells through a profile script), the MPI hostfile, and spark-cluster-check."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra import host

from sparkrig import atomic, prefix, rendering

from .facts import CHECK, HOSTFILE, PROFILE_SCRIPT
from .settings import MANAGED_ENV

# Where a prefix source build named nccl-tests (the owner's catalogue entry) is installed.
NCCL_TESTS_BIN = f"{prefix.current('nccl-tests')}/bin"


def env_variables(
    interfaces: Sequence[str],
    own: str,
    head: str,
    name: str,
    extra: Mapping[str, str],
    devices: Sequence[str] = (),
) -> list[tuple[str, str]]:
    """The env file's variables: managed ones in a fixed order, then extras sorted.
    ``devices``: the rails' RDMA devices, read from the host (none: NCCL_IB_HCA is left out
    and NCCL keeps to its sockets)."""
    every = ",".join(interfaces)
    managed = {
        # '=': NCCL's exact match (a bare name is a prefix: mlx5_1 would take mlx5_10 too).
        "NCCL_IB_HCA": "=" + ",".join(devices) if devices else None,
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
    return [(key, managed[key]) for key in MANAGED_ENV if managed[key] is not None] + sorted(extra.items())


def no_rdma_note(interfaces: Sequence[str]) -> str:
    """What the env file and the deploy say where no rail has an RDMA device."""
    return (
        f"no RDMA device behind {', '.join(interfaces)} (/sys/class/infiniband names none): NCCL_IB_HCA "
        "is not set and NCCL moves data over TCP sockets"
    )


def render_env_file(variables: Sequence[tuple[str, str]], note: str | None = None) -> str:
    return rendering.render(
        "cluster/cluster.env.j2",
        lines=[f"{key}={rendering.quote_literal(value)}" for key, value in variables],
        note=note,
    )


def first_address(interfaces: Mapping[str, str]) -> str:
    return str(ipaddress.IPv4Interface(next(iter(interfaces.values()))).ip)


def addresses(interfaces: Mapping[str, str]) -> list[str]:
    return [str(ipaddress.IPv4Interface(a).ip) for a in interfaces.values()]


def render_hostfile(nodes: Sequence[Mapping[str, Any]], slots: int) -> str:
    return rendering.render("cluster/hostfile.j2", nodes=nodes, slots=slots)


def peer_links(
    interfaces: Mapping[str, str],
    peers: Sequence[Mapping[str, Any]],
    devices: Mapping[str, str] | None = None,
) -> list[dict]:
    """Each peer address this host reaches (on a direct cable, its one peer on that rail;
    through a switch, every node on every rail), with its own interface on that subnet, and
    the RDMA devices at both ends (empty where there is none)."""
    found = []
    for peer in peers:
        for address in peer["addresses"]:
            for name, own in interfaces.items():
                if ipaddress.IPv4Address(address) in ipaddress.IPv4Interface(own).network:
                    found.append(
                        {
                            "name": peer["name"],
                            "address": address,
                            "interface": name,
                            "device": (devices or {}).get(name, ""),
                            "peer_device": peer.get("devices", {}).get(address, ""),
                        }
                    )
    return found


def render_check(
    name: str,
    user: str,
    mtu: int,
    interfaces: Mapping[str, str],
    peers: Sequence[Mapping[str, Any]],
    env_file: str,
    hostfile: str = HOSTFILE,
    nccl_tests_bin: str = NCCL_TESTS_BIN,
    devices: Mapping[str, str] | None = None,
    rail_floor: int = 80,
    nccl_floor: int = 12,
) -> str:
    return rendering.render(
        "cluster/spark-cluster-check.sh.j2",
        name=name,
        user=user,
        mtu=mtu,
        interfaces=sorted(interfaces),
        peers=peer_links(interfaces, peers, devices),
        hostfile=hostfile,
        env_file=env_file,
        nccl_tests_bin=nccl_tests_bin,
        rail_floor=rail_floor,
        nccl_floor=nccl_floor,
    )


def render_profile_script(env_file: str) -> str:
    return rendering.render("cluster/profile.sh.j2", env_file=env_file)


def converge_environment(
    settings: Mapping[str, Any],
    files: Mapping[str, Any],
    interfaces: Mapping[str, str],
    devices: Mapping[str, str],
    nodes: Sequence[Mapping[str, Any]],
    note: str | None,
) -> None:
    """The environment step of the cluster's deploy: the MPI hostfile, NCCL's environment
    (``nodes[0]``, the head, is MASTER_ADDR) with the profile script that reads it, and
    spark-cluster-check."""
    name, user, env_file = settings["cluster_name"], settings["cluster_user"], settings["cluster_env_file"]
    peers = [n for n in nodes if n["name"] != host.name]
    variables = env_variables(
        list(interfaces),
        first_address(interfaces),
        nodes[0]["first"],
        name,
        settings["cluster_env_extra"],
        list(devices.values()),
    )
    check = render_check(
        name,
        user,
        settings["cluster_mtu"],
        interfaces,
        peers,
        env_file,
        devices=devices,
        rail_floor=settings["cluster_rail_floor_gbits"],
        nccl_floor=settings["cluster_nccl_floor_gbytes"],
    )
    written = {
        HOSTFILE: ("MPI hostfile", render_hostfile(nodes, settings["cluster_slots"]), 0o644, None),
        env_file: ("NCCL environment (cluster_env_file)", render_env_file(variables, note), 0o644, ("sh", "-n")),
        PROFILE_SCRIPT: (
            "Login shells read the NCCL environment",
            render_profile_script(env_file),
            0o644,
            ("sh", "-n"),
        ),
        CHECK: ("spark-cluster-check command", check, 0o755, ("sh", "-n")),
    }
    # host.loop: each file keeps its place (and its row in pyinfra's table) on every host.
    for dest, (title, content, mode, validate) in host.loop(written.items()):
        atomic.file_if_changed(
            name=f"{title} ({dest})", dest=dest, current=files.get(dest), content=content, mode=mode, validate=validate
        )
