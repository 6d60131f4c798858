"""The lab's network: a namespace and veth pair per host, one nftables table.

Only objects named like the lab's (``sparkrig-*`` namespaces, ``srlab*``
links, table ``inet sparkrig_lab``) are created or removed here; the rest of
the controller's network configuration is never touched, except
``net.ipv4.ip_forward``, which the lab records before it sets it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from .config import IP_FORWARD, NFT_TABLE
from .model import FLAVOURS, LabHost, is_lab_link, is_lab_netns, is_other_lab_netns
from .render import parse_ip_forward_before, render_nft_ruleset
from .system import LabError, run

log = logging.getLogger("sparkrig.lab")


def create_host_network(host: LabHost) -> None:
    """The host's namespace, with ``eth0`` wired to ``srlab<i>`` in the root namespace. Its
    address and route are set here, but on a host with DGX OS's network stack
    (``netplan_nm``), whose NetworkManager configures eth0 from netplan at boot."""
    ns, veth, peer = host.netns, host.veth, f"{host.veth}c"
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
    run(["ip", "link", "set", peer, "netns", ns])
    run(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
    run(["ip", "addr", "add", f"{host.gateway}/24", "dev", veth])
    run(["ip", "link", "set", veth, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    if not FLAVOURS[host.flavour].netplan_nm:
        run(["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run(["ip", "-n", ns, "route", "add", "default", "via", host.gateway])
    run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])


def create_cluster_link(first: LabHost, second: LabHost, interface: str) -> None:
    """The ConnectX-7 STAND-IN: a veth pair made straight between two hosts' namespaces,
    named ``interface`` in both; it goes with them (nothing of it is in the root namespace)."""
    run(
        [
            "ip",
            "link",
            "add",
            interface,
            "netns",
            first.netns,
            "type",
            "veth",
            "peer",
            "name",
            interface,
            "netns",
            second.netns,
        ]
    )


def power_on_ports(host: LabHost) -> None:
    """The host's ports as a machine's are when it powers on: the namespace outlives a
    host's nspawn, so before each boot the cluster links (veth pairs in the namespace) are
    taken down, back to 1500 bytes and without addresses (their peers lose carrier, as a
    Spark's do while it reboots), and so is eth0 where the host's own NetworkManager
    configures it (``netplan_nm``); elsewhere eth0 is the lab's, set from outside."""
    links = json.loads(run(["ip", "-j", "-n", host.netns, "link", "show", "type", "veth"]).stdout or "[]")
    for name in [link["ifname"] for link in links]:
        if name == "eth0" and not FLAVOURS[host.flavour].netplan_nm:
            continue
        run(["ip", "-n", host.netns, "addr", "flush", "dev", name])
        run(["ip", "-n", host.netns, "link", "set", name, "down", "mtu", "1500"])
    if FLAVOURS[host.flavour].netplan_nm:
        run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])  # a cable plugged in


def _netns_names() -> list[str]:
    out = run(["ip", "-j", "netns", "list"]).stdout.strip()
    return [entry["name"] for entry in json.loads(out or "[]")]


def lab_netns() -> list[str]:
    """Network namespaces named like the lab's."""
    return sorted(name for name in _netns_names() if is_lab_netns(name))


def other_labs_netns() -> list[str]:
    """Network namespaces of other labs (other SPARKRIG_LAB_IDs) running beside this one."""
    return sorted(name for name in _netns_names() if is_other_lab_netns(name))


def lab_links() -> list[str]:
    """Root-namespace links named like the lab's veths."""
    out = run(["ip", "-j", "link", "show"]).stdout.strip()
    names = [entry["ifname"] for entry in json.loads(out or "[]")]
    return sorted(name for name in names if is_lab_link(name))


def netns_pids(ns: str) -> list[int]:
    """Processes living in a network namespace."""
    return [int(pid) for pid in run(["ip", "netns", "pids", ns]).stdout.split()]


def delete_netns(ns: str) -> None:
    """Remove a namespace (its eth0 and so the veth pair go with it)."""
    run(["ip", "netns", "delete", ns])


def delete_link(name: str) -> None:
    """Remove a root-namespace link if it still exists.

    A deleted namespace takes its veth pair with it, asynchronously: the link can
    vanish between listing and deleting, which is not an error.
    """
    result = run(["ip", "link", "delete", name], check=False)
    if result.returncode != 0 and name in lab_links():
        raise LabError(f"could not delete link {name}: {result.stderr.strip()}")


def nft_table_listing() -> str | None:
    """``nft list table`` of the lab's table, or None when there is none."""
    result = run(["nft", "list", "table", "inet", NFT_TABLE], check=False)
    return result.stdout if result.returncode == 0 else None


def install_nft(nameservers: Sequence[str], ip_forward_before: int, repo_port: int) -> None:
    """Load the lab's table (it must not exist yet)."""
    run(["nft", "-f", "-"], input=render_nft_ruleset(nameservers, ip_forward_before, repo_port))


def delete_nft() -> int | None:
    """Remove the lab's table if present; the ip_forward value its comment recorded."""
    listing = nft_table_listing()
    if listing is None:
        return None
    run(["nft", "delete", "table", "inet", NFT_TABLE])
    return parse_ip_forward_before(listing)


def read_ip_forward(path: Path = IP_FORWARD) -> int:
    """The controller's ``net.ipv4.ip_forward``."""
    return int(path.read_text().strip())


def write_ip_forward(value: int, path: Path = IP_FORWARD) -> None:
    """Set the controller's ``net.ipv4.ip_forward``."""
    log.info("net.ipv4.ip_forward = %d", value)
    path.write_text(f"{value}\n")
