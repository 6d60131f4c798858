"""Text the lab writes or parses: ssh_config, known_hosts, inventory.json, nft, apt indexes.

Pure functions only (no I/O), covered by unit tests. The formats of
inventory.json, known_hosts and ssh_config are an interface used by the rest
of the project: change them only together with their readers.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .config import (
    DOCKER_STANDIN_PACKAGE,
    METRICS_PORT,
    NFT_TABLE,
    REPO_PORT,
    SSH_USER,
    SUBNET_PREFIX,
    TOOLKIT_STANDIN_PACKAGE,
    VETH_PREFIX,
)
from .model import FLAVOURS, AptRepo, LabHost, cluster_links, repo_url

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


def render_known_hosts(hosts: Sequence[LabHost], host_keys: Mapping[str, Sequence[tuple[str, str]]]) -> str:
    """known_hosts lines for every host key, once under the address and once under the name."""
    lines = []
    for host in hosts:
        for label in (host.address, host.name):
            lines.extend(f"{label} {keytype} {key}" for keytype, key in host_keys[host.name])
    return "".join(line + "\n" for line in lines)


def render_inventory(
    hosts: Sequence[LabHost],
    ssh_key: Path,
    known_hosts: Path,
    apt_repo: AptRepo,
    wheelhouse: Mapping[str, object] | None = None,
    registry: Mapping[str, object] | None = None,
    sources: Mapping[str, object] | None = None,
) -> str:
    """inventory.json: what the deploy and the tests need to reach each host.

    ``apt_repo_url`` is where the host reaches the lab's apt repositories: Docker's
    ``https://download.docker.com`` and NVIDIA's ``https://nvidia.github.io``
    become ``<apt_repo_url>/docker`` and ``<apt_repo_url>/nvidia``, the rest of
    their URLs unchanged. ``wheelhouse`` (paths below the same URL) describes the
    lab's Python wheels (lab/wheelhouse.py), ``registry`` the stand-in image the
    lab's registry serves at ``<apt_repo_url>/v2/`` (lab/registry.py), ``sources``
    the git repository of the lab's source-build project (lab/sourcebuild.py).
    """
    document: dict[str, object] = {
        "hosts": [
            {
                "name": host.name,
                "flavour": host.flavour,
                "address": host.address,
                "ssh_user": SSH_USER,
                "ssh_key": str(ssh_key),
                "known_hosts": str(known_hosts),
                "ssh_service": host.ssh_service,
                "apt_repo_url": repo_url(host.index, apt_repo.port),
            }
            for host in hosts
        ],
        "apt_repo": {
            "docker_key_fingerprint": apt_repo.docker_key_fingerprint,
            "nvidia_key_fingerprint": apt_repo.nvidia_key_fingerprint,
            "docker_package": DOCKER_STANDIN_PACKAGE,
            "toolkit_package": TOOLKIT_STANDIN_PACKAGE,
        },
        "wheelhouse": dict(wheelhouse or {}),
        "registry": dict(registry or {}),
        "sources": dict(sources or {}),
        # The ConnectX-7 STAND-IN links between hosts of this fleet (lab/model.py).
        "clusters": [link.to_json() for link in cluster_links([host.name for host in hosts])],
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


def render_nft_ruleset(nameservers: Sequence[str], ip_forward_before: int, repo_port: int = REPO_PORT) -> str:
    """The lab's one nftables table: NAT to the internet, and isolation of the hosts.

    Of the controller, a host reaches only the apt repository server, at its own
    gateway address: ``fib daddr . iif type local`` holds only for an address
    of the interface the packet came in on. Of each other, the hosts reach only the
    node exporter's port (``METRICS_PORT``): the fleet's Prometheus on one of them scrapes
    the others there.

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
\t\t{lab} oifname "{VETH_PREFIX}*" tcp dport {METRICS_PORT} accept
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
\t\t{lab} ip daddr {SUBNET_PREFIX}.0.0/16 tcp dport {repo_port} fib daddr . iif type local accept
\t\t{lab} drop
\t}}
}}
"""


def parse_ip_forward_before(nft_table_listing: str) -> int | None:
    """The ip_forward value recorded in the lab table's comment, if there is one."""
    match = _IP_FORWARD_COMMENT.search(nft_table_listing)
    return int(match.group(1)) if match else None


# --- apt repositories ----------------------------------------------------------

_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def render_deb822(fields: Mapping[str, str]) -> str:
    """One deb822 stanza (a control file, a Packages entry, a Release file).

    A value's later lines are continuation lines: each gets a leading space,
    and an empty one becomes `` .``.
    """
    lines = []
    for name, value in fields.items():
        first, *rest = value.split("\n")
        lines.append(f"{name}: {first}".rstrip())
        lines.extend(f" {line}" if line.strip() else " ." for line in rest)
    return "".join(line + "\n" for line in lines)


def render_packages_entry(control: Mapping[str, str], filename: str, deb: bytes) -> str:
    """A package's stanza in a Packages index: its control fields, then where and what the .deb is.

    The Description stays last, as dpkg-scanpackages writes it.
    """
    fields = {name: value for name, value in control.items() if name != "Description"}
    fields.update(Filename=filename, Size=str(len(deb)), SHA256=hashlib.sha256(deb).hexdigest())
    if "Description" in control:
        fields["Description"] = control["Description"]
    return render_deb822(fields)


def render_packages(entries: Sequence[str]) -> str:
    """A Packages index of stanzas from :func:`render_packages_entry`."""
    return "\n".join(entries)


def release_date(when: datetime.datetime) -> str:
    """A Release file's Date (RFC 2822 in UTC, English names whatever the locale)."""
    utc = when.astimezone(datetime.timezone.utc)
    return f"{_WEEKDAYS[utc.weekday()]}, {utc.day:02d} {_MONTHS[utc.month - 1]} {utc.year} {utc:%H:%M:%S} UTC"


def render_release(fields: Mapping[str, str], indexes: Mapping[str, bytes]) -> str:
    """A Release file: ``fields``, then the SHA256 and size of every index file.

    ``indexes`` maps paths relative to the Release file's directory to contents.
    """
    sums = "".join(
        f" {hashlib.sha256(data).hexdigest()} {len(data):>8} {path}\n" for path, data in sorted(indexes.items())
    )
    return render_deb822(fields) + "SHA256:\n" + sums


def parse_gpg_fingerprints(colons: str) -> dict[str, str]:
    """``{user id: primary key fingerprint}`` of ``gpg --with-colons --list-keys`` output."""
    found: dict[str, str] = {}
    fingerprint: str | None = None
    expect_fingerprint = False
    for line in colons.splitlines():
        fields = line.split(":")
        record = fields[0]
        if record in ("pub", "sec"):
            fingerprint, expect_fingerprint = None, True
        elif record in ("sub", "ssb"):
            expect_fingerprint = False
        elif record == "fpr" and expect_fingerprint and len(fields) > 9:
            fingerprint, expect_fingerprint = fields[9], False
        elif record == "uid" and fingerprint and len(fields) > 9:
            found[fields[9].replace("\\x3a", ":")] = fingerprint
    return found


def render_daemon_json(host: LabHost, repo_port: int = REPO_PORT) -> str:
    """The /etc/docker/daemon.json a lab host starts with: its Docker trusts the lab's
    registry (the stand-in for nvcr.io, plain HTTP on the repository server at the host's
    gateway), as a fleet trusts its own private registry. The deploy merges into it.

    On a host under qemu-user emulation dockerd cannot program nftables ("Failed to
    initialize nft: Protocol not supported") and starts only without iptables and its
    bridge: a fact of the emulated lab, in the host's own file, never a sparkrig setting."""
    config: dict[str, object] = {"insecure-registries": [f"{host.gateway}:{repo_port}"]}
    if FLAVOURS[host.flavour].emulated:
        config.update({"iptables": False, "ip6tables": False, "bridge": "none"})
    return json.dumps(config, indent=4) + "\n"
