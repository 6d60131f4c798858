"""Clusters: what a node is made of (its links, SSH host keys, link files, the cluster
user), and what a host taken out of its cluster still holds; the places sparkrig's files go."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output, rendering, user_files
from sparkrig.settings import USER_NAME

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
PACKAGES = ("iputils-ping",)  # ping -M do (busybox's ping has no -M)
# ib_write_bw for spark-cluster-check --bandwidth: installed only where a rail has an RDMA
# device (elsewhere the check skips, saying why, and nothing would use it).
RDMA_PACKAGES = ("perftest",)
MARKER = "sparkrig-cluster:"  # the comment of every line sparkrig manages in authorized_keys

_IFNAME = re.compile(r"[^\s/:]{1,15}")  # what the kernel takes as an interface name
_PCI = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")
_RDMA = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HOST_KEY = re.compile(r"(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/]+={0,2}")


# As the cluster user (runuser: no PAM session, no shell start-up files): the lines of
# their authorized_keys that sparkrig manages. For `sh -c SCRIPT NAME HOME`.
AUTHORIZED_LIMIT = 1 << 20
READ_AUTHORIZED = rendering.script(
    "cluster/read-authorized.sh.j2",
    marker=MARKER,
    limit=AUTHORIZED_LIMIT,
    user_read=user_files.user_read('"$f"', AUTHORIZED_LIMIT),
)


def read_rails(sys_root: str = "/sys") -> str:
    """sh printing, for each network interface backed by a device, ``pci IF ADDRESS`` (its PCI
    address), and for each RDMA device's interface ``rdma IF DEVICE`` (as ibdev2netdev reads
    them). A veth or a bridge has no device: neither line. ``sys_root`` is /sys but in tests."""
    return (
        f'for n in {sys_root}/class/net/*; do [ -e "$n/device" ] || continue; '
        'd=$(readlink -f "$n/device") && echo pci "${n##*/}" "${d##*/}"; done; '
        f'for r in {sys_root}/class/infiniband/*/device/net/*; do [ -e "$r" ] || continue; '
        f'x=${{r#{sys_root}/class/infiniband/}}; echo rdma "${{r##*/}}" "${{x%%/*}}"; done'
    )


def twins(pci: dict[str, str], rdma: dict[str, str]) -> dict[str, str]:
    """Each interface's twin: the one other interface whose PCI address differs from its own
    in the domain alone, both with an RDMA device (a Spark's enp1s0f0np0, 0000:01:00.0, and
    enP2p1s0f0np0, 0002:01:00.0). Another device at the same bus address in a third domain
    (the Spark's Realtek enP7s7) has no RDMA device; two candidates make no twin."""
    found = {}
    for name, address in pci.items():
        match = _PCI.fullmatch(address)
        if name not in rdma or match is None:
            continue
        others = [
            other
            for other, theirs in pci.items()
            if other != name
            and other in rdma
            and (m := _PCI.fullmatch(theirs)) is not None
            and m.group(2) == match.group(2)
            and m.group(1) != match.group(1)
        ]
        if len(others) == 1:
            found[name] = others[0]
    return found


class ClusterHost(FactBase):
    """
    Returns what a cluster node is made of: its links (``ip -j addr``: each interface's
    flags, MTU and IPv4 addresses), whether it uses netplan, whether NetworkManager runs and
    the devices it manages (``nm_managed``), whether ssh reads
    ``/etc/ssh/ssh_config.d``, its SSH host keys, the files sparkrig wrote for the link,
    the cluster user (uid, home, login group, the authorized_keys lines sparkrig manages,
    read as that user), ``None`` when there is no such user; and from /sys, each interface's
    twin and RDMA device (:func:`read_rails`, :func:`twins`).

    .. code:: python

        {"links": {"eth1": {"up": True, "mtu": 9000, "addresses": ["192.168.100.11/24"]}},
         "netplan": False, "networkmanager": False, "nm_managed": [], "ssh_config_d": True,
         "host_keys": ["ssh-ed25519 AAAA..."],
         "link_files": ["/etc/systemd/network/40-sparkrig-cluster-eth1.network"],
         "user": {"uid": 1000, "home": "/home/spark", "group": "spark",
                  "authorized": ['from="..." ssh-ed25519 AAAA... sparkrig-cluster:lab']},
         "twins": {"enp1s0f0np0": "enP2p1s0f0np0", "enP2p1s0f0np0": "enp1s0f0np0"},
         "rdma": {"enp1s0f0np0": "rocep1s0f0", "enP2p1s0f0np0": "roceP2p1s0f0"}}
    """

    def command(self, user: str) -> StringCommand:
        q_user = QuoteString(user)
        return StringCommand(
            "echo links $(ip -j addr show);",
            "if command -v netplan >/dev/null && [ -d /etc/netplan ]; then echo netplan yes; else echo netplan no; fi;",
            # NetworkManager's devices and their state: a cluster port it manages is not networkd's.
            "if systemctl is-active -q NetworkManager 2>/dev/null; then echo networkmanager yes;",
            "nmcli -t -f DEVICE,STATE device 2>/dev/null | sed 's/^/nmdevice /'; else echo networkmanager no; fi;",
            "if grep -Eqs '^[[:space:]]*Include[[:space:]]+/etc/ssh/ssh_config\\.d/\\*\\.conf' /etc/ssh/ssh_config;",
            "then echo ssh_config_d yes; else echo ssh_config_d no; fi;",
            'for k in /etc/ssh/ssh_host_*_key.pub; do [ -f "$k" ] && echo hostkey $(cut -d\' \' -f1,2 "$k"); done;',
            f"for f in {NETWORKD_DIR}/{NETWORKD_PREFIX}*.network {NETPLAN_FILE} {NM_FILE}; "
            'do [ -f "$f" ] && echo linkfile "$f"; done;',
            # Each networkd link file's state too: a twin's file, whose name the settings
            # alone cannot give to the host state's reading, is compared all the same.
            f'for f in {NETWORKD_DIR}/{NETWORKD_PREFIX}*.network; do [ -f "$f" ] &&',
            'echo linkstate $(stat -c \'%a %U %G\' "$f") $(sha256sum < "$f" | cut -d\' \' -f1) "$f"; done;',
            "if e=$(getent passwd",
            q_user,
            "); then",
            'h=$(echo "$e" | cut -d: -f6); echo user $(id -u',
            q_user,
            ") $(id -gn",
            q_user,
            ') "$h";',
            "runuser -u",
            q_user,
            "-- sh -c",
            QuoteString(READ_AUTHORIZED),
            'sparkrig "$h" | sed "s/^/authorized /";',
            "else echo nouser; fi;",
            read_rails(),
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found: dict = self.default()
        pci: dict[str, str] = {}
        rdma: dict[str, str] = {}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "links":
                for link in json.loads(rest or "[]"):
                    found["links"][link["ifname"]] = {
                        "up": "UP" in link.get("flags", []),
                        "mtu": int(link.get("mtu", 0)),
                        "addresses": [
                            f"{a['local']}/{a['prefixlen']}"
                            for a in link.get("addr_info", [])
                            if a.get("family") == "inet"
                        ],
                    }
            elif kind == "nmdevice":
                device, _, state = rest.partition(":")
                if state != "unmanaged":
                    found["nm_managed"].append(device)
            elif kind in ("netplan", "networkmanager", "ssh_config_d"):
                found[kind] = rest == "yes"
            elif kind == "hostkey":
                if not _HOST_KEY.fullmatch(rest):
                    raise ValueError(f"not an SSH host key: {rest[:60]!r}")
                found["host_keys"].append(rest)
            elif kind == "linkfile":
                if not (
                    rest in (NETPLAN_FILE, NM_FILE)
                    or (rest.startswith(f"{NETWORKD_DIR}/{NETWORKD_PREFIX}") and rest.endswith(".network"))
                ):
                    raise ValueError(f"unexpected link file {rest[:80]!r}")
                found["link_files"].append(rest)
            elif kind == "user":
                uid, group, home = rest.split(" ", 2)
                found["user"] = {"uid": int(uid), "group": group, "home": home, "authorized": []}
            elif kind == "authorized":
                found["user"]["authorized"].append(rest)
            elif kind == "linkstate":
                mode, user, group, sha, path = rest.split(" ", 4)
                if not (
                    path.startswith(f"{NETWORKD_DIR}/{NETWORKD_PREFIX}")
                    and path.endswith(".network")
                    and re.fullmatch("[0-7]{3,4}", mode)
                    and re.fullmatch("[0-9a-f]{64}", sha)
                ):
                    raise ValueError(f"unexpected line {line[:80]!r}")
                found["link_state"][path] = {"sha256": sha, "mode": int(mode, 8), "user": user, "group": group}
            elif kind in ("pci", "rdma"):
                name, _, value = rest.partition(" ")
                if not _IFNAME.fullmatch(name) or (kind == "rdma" and not _RDMA.fullmatch(value)):
                    raise ValueError(f"unexpected line {line[:80]!r}")
                (rdma if kind == "rdma" else pci)[name] = value  # twins() passes over a USB or platform device
            elif kind != "nouser":
                raise ValueError(f"unexpected line {line[:80]!r}")
        found["twins"] = twins(pci, rdma)
        found["rdma"] = rdma
        return found

    @staticmethod
    def default() -> dict:
        return {
            "links": {},
            "netplan": False,
            "networkmanager": False,
            "nm_managed": [],
            "ssh_config_d": False,
            "host_keys": [],
            "link_files": [],
            "link_state": {},
            "user": None,
            "twins": {},
            "rdma": {},
        }


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
            "for f in",
            *[QuoteString(p) for p in fixed],
            QuoteString(env_file),
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
