"""The lab's data model: flavours, hosts, the address plan and leftover names.

Everything here is pure (no I/O), so it is covered by unit tests.

Host number ``i`` (1-based, position in the fleet) gets network namespace
``sparkrig-NAME``, root-side veth ``srlab<i>`` with ``10.213.<i>.1/24`` and,
inside the namespace, ``eth0`` with ``10.213.<i>.2/24``. The lab's apt
repositories are served at ``http://10.213.<i>.1:<REPO_PORT>`` to host ``i``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import NETNS_PREFIX, SUBNET_PREFIX, VETH_PREFIX

REPO_SERVER_SCRIPT = "reposerver.py"

MAX_HOSTS = 254
_HOST_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_LAB_LINK = re.compile(rf"^{VETH_PREFIX}\d+c?$")


@dataclass(frozen=True)
class Flavour:
    """A kind of lab host: which Debian suite and architecture, how sshd is started,
    and what the host holds before any deploy."""

    name: str
    suite: str
    ssh_service: str
    # Sees the controller's CUDA toolkit (config.CONTROLLER_CUDA), reached through
    # /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-X.Y as on Ubuntu.
    cuda_toolkit: bool = False
    # Debian's name of the host's architecture; a foreign one runs under qemu-user
    # (lab/binfmt.py).
    arch: str = "amd64"
    # The cached image it boots from (default: its own name); flavours that differ only
    # in their starting state share one.
    image: str = ""
    # Packages the image holds beyond image.PACKAGES.
    extra_packages: tuple[str, ...] = ()
    # Starts like a stock DGX OS box (lab/dgxos.py): Docker and the NVIDIA
    # container toolkit installed from an apt source the deploy did not write, pinned in
    # /etc/apt/preferences.d; nobody in the docker group; the nvidia runtime not registered.
    dgx_os: bool = False
    # The STAND-IN nvidia-smi it carries (lab/dgxos.py), as "compute capability, name".
    gpu_standin: str = ""
    # DGX OS's network stack (lab/dgxos.py): netplan with the NetworkManager renderer,
    # eth0 on NetworkManager through netplan, systemd-networkd installed but off, and
    # NetworkManager's own DHCP "Wired connection" profiles on the other ports.
    netplan_nm: bool = False
    # Local users attack the deploy, the suite and the rollout on purpose (lab/hostile.py);
    # kept out of inventory/lab.py's fleet, played by inventory/lab_hostile.py alone.
    hostile: bool = False

    @property
    def emulated(self) -> bool:
        """Runs under qemu-user: the lab's controllers are x86_64 (lab/binfmt.py)."""
        return self.arch != "amd64"

    @property
    def image_name(self) -> str:
        """The name of the cached image this flavour boots from."""
        return self.image or self.name


FLAVOURS: dict[str, Flavour] = {
    "debian12": Flavour("debian12", "bookworm", "ssh.service"),
    "debian13": Flavour("debian13", "trixie", "ssh.socket", cuda_toolkit=True),
    # Debian 13 on DGX OS's network stack: netplan.io 1.1 (Ubuntu 24.04's generation; Debian
    # 12's 0.106 is older than any DGX OS 7) and network-manager, from Debian.
    "debian13-nm": Flavour(
        "debian13-nm",
        "trixie",
        "ssh.socket",
        cuda_toolkit=True,
        image="debian13-nm",
        extra_packages=("netplan.io", "network-manager"),
        netplan_nm=True,
    ),
    # Debian 12 amd64 in DGX OS's starting state (the same image as debian12).
    "dgxos": Flavour("dgxos", "bookworm", "ssh.service", image="debian12", dgx_os=True),
    # The stock Spark as near as this machine gets: aarch64 under qemu-user emulation
    # (Debian 13 arm64 does not boot there: systemd 257's executor fails under qemu),
    # DGX OS's starting state, and a STAND-IN nvidia-smi reporting a GB10. Debian's
    # docker.io is in its image: installing it at every boot under emulation is slow.
    "gb10": Flavour(
        "gb10",
        "bookworm",
        "ssh.service",
        arch="arm64",
        image="debian12-arm64",
        extra_packages=("docker.io",),
        dgx_os=True,
        gpu_standin="12.1, NVIDIA GB10",
    ),
    # Debian 12 amd64 (the same image as debian12) where local users attack (lab/hostile.py).
    "hostile": Flavour("hostile", "bookworm", "ssh.service", image="debian12", hostile=True),
}

# Five hosts. The fleet tests kill, recreate and drift the "-b" hosts while the first
# two keep what the other tests set up on them; lab-deb12-b starts as DGX OS does, and
# lab-gb10 is the emulated stock Spark, deployed with sparkrig's default settings. The
# cluster pair is one of each network stack: lab-deb13 on DGX OS's (netplan +
# NetworkManager), lab-deb12 on systemd-networkd alone.
DEFAULT_FLEET: tuple[tuple[str, str], ...] = (
    ("lab-deb12", "debian12"),
    ("lab-deb13", "debian13-nm"),
    ("lab-deb12-b", "dgxos"),
    ("lab-deb13-b", "debian13"),
    ("lab-gb10", "gb10"),
)

# The hostile host (lab/hostile.py): booted with the default fleet on every run, but no
# member of it (inventory/lab.py leaves it out), so its attacks touch no other host's results.
HOSTILE_FLEET: tuple[tuple[str, str], ...] = (("lab-hostile", "hostile"),)
# What `lab up` boots when no fleet is named.
BOOTED_FLEET: tuple[tuple[str, str], ...] = DEFAULT_FLEET + HOSTILE_FLEET


@dataclass(frozen=True)
class ClusterLink:
    """A second link straight between two hosts' namespaces: the STAND-IN for the
    ConnectX-7 cable between two Sparks (a veth pair, no NAT, no end in the controller's
    namespace). It comes up at the kernel's MTU of 1500, as a CX-7 port does: the deploy
    sets the cluster's MTU (9000) and the addresses."""

    cluster: str
    interface: str
    hosts: tuple[str, str]
    addresses: tuple[str, str]

    def to_json(self) -> dict[str, object]:
        """The link as inventory.json gives it to the lab inventory."""
        return {"name": self.cluster, "interface": self.interface, "addresses": dict(zip(self.hosts, self.addresses))}


# The default fleet's cluster: its two x86_64 hosts that the fleet tests leave alone
# (lab-gb10 is slow under qemu), linked on a subnet of their own.
CLUSTER_LINKS: tuple[ClusterLink, ...] = (
    ClusterLink("lab", "cx7-standin", ("lab-deb12", "lab-deb13"), ("192.168.100.11/24", "192.168.100.12/24")),
)


def cluster_links(names: Sequence[str]) -> list[ClusterLink]:
    """The cluster links whose two hosts are both in a fleet of these host names."""
    return [link for link in CLUSTER_LINKS if set(link.hosts) <= set(names)]


@dataclass
class LabHost:
    """One booted (or about to be booted) lab host."""

    name: str
    flavour: str
    address: str
    netns: str
    veth: str
    rootfs: Path
    pid: int = 0

    @property
    def index(self) -> int:
        """The host's number in the address plan (third octet of its address)."""
        return int(self.address.split(".")[2])

    @property
    def gateway(self) -> str:
        """The controller's address on this host's veth."""
        return gateway_address(self.index)

    @property
    def ssh_service(self) -> str:
        """The unit that starts sshd on this host (``ssh.service`` or ``ssh.socket``)."""
        return FLAVOURS[self.flavour].ssh_service

    def to_json(self) -> dict[str, object]:
        """The host as stored in state.json."""
        return {
            "name": self.name,
            "flavour": self.flavour,
            "address": self.address,
            "netns": self.netns,
            "veth": self.veth,
            "rootfs": str(self.rootfs),
            "pid": self.pid,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LabHost:
        """The inverse of :meth:`to_json`."""
        return cls(
            name=str(data["name"]),
            flavour=str(data["flavour"]),
            address=str(data["address"]),
            netns=str(data["netns"]),
            veth=str(data["veth"]),
            rootfs=Path(str(data["rootfs"])),
            pid=int(str(data.get("pid", 0))),
        )


@dataclass(frozen=True)
class AptRepo:
    """The lab's apt repositories as ``up`` built and serves them."""

    # The served directory: docker/linux/debian/... and nvidia/libnvidia-container/...
    root: Path
    docker_key_fingerprint: str
    nvidia_key_fingerprint: str
    port: int
    dgx_key_fingerprint: str = ""

    def to_json(self) -> dict[str, object]:
        """The repositories as stored in state.json."""
        return {
            "root": str(self.root),
            "docker_key_fingerprint": self.docker_key_fingerprint,
            "nvidia_key_fingerprint": self.nvidia_key_fingerprint,
            "port": self.port,
            "dgx_key_fingerprint": self.dgx_key_fingerprint,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> AptRepo:
        """The inverse of :meth:`to_json`."""
        return cls(
            root=Path(str(data["root"])),
            docker_key_fingerprint=str(data["docker_key_fingerprint"]),
            nvidia_key_fingerprint=str(data["nvidia_key_fingerprint"]),
            port=int(str(data["port"])),
            dgx_key_fingerprint=str(data.get("dgx_key_fingerprint", "")),
        )


def _check_index(index: int) -> None:
    if not 1 <= index <= MAX_HOSTS:
        raise ValueError(f"lab host number {index} is outside 1..{MAX_HOSTS}")


def host_address(index: int) -> str:
    """The address of host number ``index`` (inside its namespace)."""
    _check_index(index)
    return f"{SUBNET_PREFIX}.{index}.2"


def gateway_address(index: int) -> str:
    """The controller's address on the veth of host number ``index``."""
    _check_index(index)
    return f"{SUBNET_PREFIX}.{index}.1"


def repo_url(index: int, port: int) -> str:
    """Where host number ``index`` reaches the lab's apt repositories (no trailing slash)."""
    return f"http://{gateway_address(index)}:{port}"


def veth_name(index: int) -> str:
    """The root-namespace side of host number ``index``'s veth pair."""
    _check_index(index)
    return f"{VETH_PREFIX}{index}"


def netns_name(host_name: str) -> str:
    """The network namespace of a host."""
    return f"{NETNS_PREFIX}{host_name}"


def plan_fleet(fleet: Sequence[tuple[str, str]], hosts_dir: Path) -> list[LabHost]:
    """Hosts for ``fleet`` (pairs of name and flavour), numbered from 1 in order."""
    if not fleet:
        raise ValueError("the fleet is empty")
    if len(fleet) > MAX_HOSTS:
        raise ValueError(f"the lab holds at most {MAX_HOSTS} hosts, not {len(fleet)}")
    names = [name for name, _ in fleet]
    if len(set(names)) != len(names):
        raise ValueError(f"host names repeat in {names}")
    hosts = []
    for index, (name, flavour) in enumerate(fleet, start=1):
        if not _HOST_NAME.match(name):
            raise ValueError(f"bad lab host name {name!r}: use 1-40 of a-z, 0-9 and '-', not at either end")
        if flavour not in FLAVOURS:
            raise ValueError(f"unknown flavour {flavour!r} for {name}; known: {sorted(FLAVOURS)}")
        hosts.append(
            LabHost(
                name=name,
                flavour=flavour,
                address=host_address(index),
                netns=netns_name(name),
                veth=veth_name(index),
                rootfs=hosts_dir / name / "rootfs",
            )
        )
    return hosts


def parse_fleet_spec(spec: str) -> list[tuple[str, str]]:
    """Parse the CLI's ``name:flavour,name:flavour`` into pairs."""
    pairs = []
    for item in spec.split(","):
        name, sep, flavour = item.strip().partition(":")
        if not sep or not name or not flavour:
            raise ValueError(f"bad fleet entry {item!r}: expected NAME:FLAVOUR")
        pairs.append((name, flavour))
    return pairs


def is_lab_netns(name: str) -> bool:
    """Whether a network namespace name is one the lab makes."""
    return name.startswith(NETNS_PREFIX) and len(name) > len(NETNS_PREFIX)


_ANY_LAB_NETNS = re.compile(r"sparkrig[1-9]?-.+")


def is_other_lab_netns(name: str) -> bool:
    """Whether a network namespace belongs to another lab (another SPARKRIG_LAB_ID) than this one."""
    return bool(_ANY_LAB_NETNS.fullmatch(name)) and not is_lab_netns(name)


def is_lab_link(name: str) -> bool:
    """Whether a root-namespace link name is one the lab makes (``srlab<i>``, ``srlab<i>c``)."""
    return bool(_LAB_LINK.match(name.partition("@")[0]))


def is_lab_nspawn(argv: Sequence[str], hosts_dir: Path) -> bool:
    """Whether a command line is a ``systemd-nspawn`` booting a rootfs below ``hosts_dir``."""
    if not argv or os.path.basename(argv[0]) != "systemd-nspawn":
        return False
    return any(_is_below(directory, hosts_dir) for directory in _nspawn_directories(argv))


# A lab host's boot loop (lab/fleet.py _boot): ``sh -c LOOP BOOT_MARKER CGROUP_PROCS... --
# systemd-nspawn ...``, which boots the host again whenever nspawn exits 133 (a reboot asked
# from inside), as systemd-nspawn@.service does with RestartForceExitStatus=133.
BOOT_MARKER = "sparkrig-lab-boot"


def is_lab_boot(argv: Sequence[str], hosts_dir: Path) -> bool:
    """Whether a command line is a lab host's boot loop around a lab ``systemd-nspawn``."""
    if len(argv) < 4 or os.path.basename(argv[0]) != "sh" or argv[1] != "-c" or argv[3] != BOOT_MARKER:
        return False
    return "--" in argv[4:] and is_lab_nspawn(argv[argv.index("--", 4) + 1 :], hosts_dir)


def is_lab_repo_server(argv: Sequence[str], repo_cache: Path) -> bool:
    """Whether a command line is the lab's apt repository server, serving below ``repo_cache``."""
    # The interpreter, its options, then the script.
    script = next((arg for arg in argv[1:] if not arg.startswith("-")), "")
    if os.path.basename(script) != REPO_SERVER_SCRIPT:
        return False
    roots = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--root"]
    return any(_is_below(root, repo_cache) for root in roots)


def nspawn_directory(argv: Sequence[str]) -> str | None:
    """The ``-D``/``--directory`` of a ``systemd-nspawn`` command line, if any."""
    directories = _nspawn_directories(argv)
    return directories[-1] if directories else None


def _nspawn_directories(argv: Sequence[str]) -> list[str]:
    found = []
    for i, arg in enumerate(argv):
        if arg in ("-D", "--directory") and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith("--directory="):
            found.append(arg.split("=", 1)[1])
        elif arg.startswith("-D") and len(arg) > 2:
            found.append(arg[2:])
    return found


def _is_below(path: str, parent: Path) -> bool:
    return Path(os.path.normpath(path)).is_relative_to(Path(os.path.normpath(parent)))
