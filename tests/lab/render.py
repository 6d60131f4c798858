"""Text the lab writes or parses: ssh_config, known_hosts, inventory.json, nft.

Pure functions only (no I/O), covered by unit tests. The formats of
inventory.json, known_hosts and ssh_config are an interface used by the rest
of the project: change them only together with their readers.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .config import NFT_TABLE, SSH_USER, SUBNET_PREFIX, VETH_PREFIX
from .model import LabHost

# Destinations lab hosts must not reach through the controller (besides DNS).
PRIVATE_RANGES: tuple[str, ...] = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
)

_IP_FORWARD_COMMENT = re.compile(r"ip_forward_before=([01])\b")


def render_ssh_config(hosts: Sequence[LabHost], ssh_key: Path, known_hosts: Path) -> str:
    """An ssh_config with one strict-host-key-checking block per host."""
    blocks = [
        "\n".join(
            (
                f"Host {host.name}",
                f"  HostName {host.address}",
                f"  User {SSH_USER}",
                f"  IdentityFile {ssh_key}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {known_hosts}",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
            )
        )
        + "\n"
        for host in hosts
    ]
    return "\n".join(blocks)


def parse_public_key(text: str) -> tuple[str, str]:
    """``(keytype, base64 key)`` of an OpenSSH ``.pub`` file's text (the comment dropped)."""
    fields = text.split()
    if len(fields) < 2:
        raise ValueError(f"not an OpenSSH public key: {text!r}")
    return fields[0], fields[1]


def render_known_hosts(
    hosts: Sequence[LabHost], host_keys: Mapping[str, Sequence[tuple[str, str]]]
) -> str:
    """known_hosts lines for every host key, once under the address and once under the name."""
    lines = []
    for host in hosts:
        for label in (host.address, host.name):
            lines.extend(f"{label} {keytype} {key}" for keytype, key in host_keys[host.name])
    return "".join(line + "\n" for line in lines)


def render_inventory(hosts: Sequence[LabHost], ssh_key: Path, known_hosts: Path) -> str:
    """inventory.json: what the deploy and the tests need to reach each host."""
    document = {
        "hosts": [
            {
                "name": host.name,
                "flavour": host.flavour,
                "address": host.address,
                "ssh_user": SSH_USER,
                "ssh_key": str(ssh_key),
                "known_hosts": str(known_hosts),
                "ssh_service": host.ssh_service,
            }
            for host in hosts
        ]
    }
    return json.dumps(document, indent=2) + "\n"


def parse_nameservers(resolv_conf: str) -> list[str]:
    """The IPv4 nameservers of a resolv.conf that a lab host can use (not loopback)."""
    servers = []
    for line in resolv_conf.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                address = ipaddress.ip_address(fields[1])
            except ValueError:
                continue
            if address.version == 4 and not address.is_loopback:
                servers.append(str(address))
    return servers


def render_resolv_conf(nameservers: Sequence[str]) -> str:
    """A lab host's resolv.conf."""
    return "".join(f"nameserver {server}\n" for server in nameservers)


def render_etc_hosts(host_name: str) -> str:
    """A lab host's /etc/hosts (Debian's layout, the host name on 127.0.1.1)."""
    return (
        "127.0.0.1\tlocalhost\n"
        f"127.0.1.1\t{host_name}\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "ff02::1\tip6-allnodes\n"
        "ff02::2\tip6-allrouters\n"
    )


def passwd_ids(passwd: str, user: str) -> tuple[int, int]:
    """``(uid, gid)`` of ``user`` in an /etc/passwd text."""
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise ValueError(f"no user {user!r} in passwd")


def render_nft_ruleset(nameservers: Sequence[str], ip_forward_before: int) -> str:
    """The lab's one nftables table: NAT to the internet, and isolation of the hosts.

    The table's comment records the controller's ``net.ipv4.ip_forward`` from
    before the lab, so ``down`` can restore it even when state.json is lost.
    """
    if not nameservers:
        raise ValueError("the lab needs at least one nameserver")
    lab = f'iifname "{VETH_PREFIX}*"'
    dns = "{ " + ", ".join(nameservers) + " }"
    private = "{ " + ", ".join(PRIVATE_RANGES) + " }"
    return f"""table inet {NFT_TABLE} {{
\tcomment "sparkrig lab; ip_forward_before={ip_forward_before}"
\tchain postrouting {{
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tip saddr {SUBNET_PREFIX}.0.0/16 oifname != "{VETH_PREFIX}*" masquerade
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\tct state established,related accept
\t\t{lab} oifname "{VETH_PREFIX}*" drop
\t\t{lab} meta nfproto ipv6 drop
\t\t{lab} ip daddr {dns} udp dport 53 accept
\t\t{lab} ip daddr {dns} tcp dport 53 accept
\t\t{lab} ip daddr {private} drop
\t\t{lab} accept
\t}}
\tchain input {{
\t\ttype filter hook input priority filter; policy accept;
\t\t{lab} ct state established,related accept
\t\t{lab} drop
\t}}
}}
"""


def parse_ip_forward_before(nft_table_listing: str) -> int | None:
    """The ip_forward value recorded in the lab table's comment, if there is one."""
    match = _IP_FORWARD_COMMENT.search(nft_table_listing)
    return int(match.group(1)) if match else None
