"""DGX OS's starting state on the lab hosts whose flavour asks for it (``dgx_os``).

A stock Spark arrives with Docker and the NVIDIA container toolkit already
installed from NVIDIA-configured apt sources its owner did not write, pinned
above the others in ``/etc/apt/preferences.d``; its users are not in the
``docker`` group and the ``nvidia`` runtime is not registered with Docker.
The lab reproduces that before any deploy:

- before boot, it writes the source file ``/etc/apt/sources.list.d/dgx.list``
  (one-line format, its own ``signed-by`` keyring) naming the lab's
  ``dgx/baseos`` repository, a STAND-IN for DGX OS's (lab/repo.py), and
  the pin ``/etc/apt/preferences.d/dgx`` on that repository's origin;
- after boot, it installs the two stand-in packages from there (the Docker one
  brings Debian's real docker.io; the toolkit one a runc pass-through named
  ``nvidia-container-runtime``), as the image's installer would have.

A flavour with ``gpu_standin`` also gets ``/usr/local/bin/nvidia-smi``, a
STAND-IN that answers the query sparkrig's hardware fact makes and ``-L``
(``spark-preflight``'s) as the named GPU would, and fails every other call as
nvidia-smi does without a driver: the lab has no GPU. There is no
``/dev/nvidiactl``, so the controls that need a real GPU skip, saying so.

A flavour with ``netplan_nm`` runs DGX OS's network stack, Debian's real netplan.io and
network-manager (lab/image.py installs them, keeps systemd-networkd off and udev masked):
``/etc/netplan/01-network-manager-all.yaml`` says ``renderer: NetworkManager`` and puts
eth0 on NetworkManager (a static address: the lab has no DHCP server), and NetworkManager
makes its own DHCP "Wired connection" profiles for the other ports (the cluster's stand-in
link), as on a Spark. Two lab STAND-INS for udev, which cannot run in a container:

- NetworkManager sees ``/sys`` read-only (a drop-in): with a writable ``/sys`` it waits for
  udev to initialize each link and leaves them all "unmanaged";
- netplan's udev rule (``90-netplan.rules``, which hands a networkd port over from
  NetworkManager) never fires; sparkrig's own NetworkManager setting and ``nmcli`` do that
  on a Spark too (operations/cluster), so the lab proves them, not the rule.
"""

from __future__ import annotations

from .config import DOCKER_STANDIN_PACKAGE, TOOLKIT_STANDIN_PACKAGE
from .model import Flavour

SOURCES_FILE = "/etc/apt/sources.list.d/dgx.list"
PIN_FILE = "/etc/apt/preferences.d/dgx"
KEYRING = "/usr/share/keyrings/sparkrig-lab-dgx-standin.asc"
NVIDIA_SMI = "/usr/local/bin/nvidia-smi"
PACKAGES = (DOCKER_STANDIN_PACKAGE, TOOLKIT_STANDIN_PACKAGE)

# The only nvidia-smi call the stand-in answers: operations/hardware/'s.
HARDWARE_QUERY = "--query-gpu=compute_cap,name --format=csv,noheader"


def nvidia_smi_standin(answer: str) -> str:
    """The stand-in nvidia-smi script: ``answer`` ("12.1, NVIDIA GB10") to the hardware
    query, the GPU list as that GPU would (its UUID names the stand-in), nothing else."""
    name = answer.split(", ", 1)[1]
    return (
        "#!/bin/sh\n"
        "# sparkrig lab STAND-IN for nvidia-smi (lab/dgxos.py): the lab has no GPU.\n"
        "# It answers sparkrig's hardware query and -L as this box's GPU would, and fails\n"
        "# everything else as nvidia-smi does without a driver (exit 9).\n"
        f'if [ "$*" = "{HARDWARE_QUERY}" ]; then echo "{answer}"; exit 0; fi\n'
        f'if [ "$*" = "-L" ]; then echo "GPU 0: {name} (UUID: GPU-sparkrig-lab-stand-in)"; exit 0; fi\n'
        'echo "sparkrig lab stand-in nvidia-smi: no GPU in the lab" >&2\n'
        "exit 9\n"
    )


def rootfs_files(flavour: Flavour, repo_url: str, origin: str, key: str) -> dict[str, tuple[str, int]]:
    """Files (content, mode) a host of ``flavour`` starts with, by absolute path.

    ``repo_url`` is where the host reaches the lab's site, ``origin`` the DGX
    stand-in repository's Origin, ``key`` its armored public key.
    """
    files: dict[str, tuple[str, int]] = {}
    if flavour.dgx_os:
        files[SOURCES_FILE] = (
            "# sparkrig lab: STAND-IN for the NVIDIA-configured source DGX OS installs its stack from\n"
            f"deb [signed-by={KEYRING}] {repo_url}/dgx/baseos ./\n",
            0o644,
        )
        files[PIN_FILE] = (
            "# sparkrig lab: DGX OS pins its own repositories above the others\n"
            f'Package: *\nPin: release o={origin}\nPin-Priority: 600\n',
            0o644,
        )
        files[KEYRING] = (key, 0o644)
    if flavour.gpu_standin:
        files[NVIDIA_SMI] = (nvidia_smi_standin(flavour.gpu_standin), 0o755)
    return files


NETPLAN_FILE = "/etc/netplan/01-network-manager-all.yaml"
NM_LAB_DROP_IN = "/etc/systemd/system/NetworkManager.service.d/sparkrig-lab.conf"
NM_LAB_CONF = (
    "# sparkrig lab STAND-IN for udev (lab/dgxos.py): /sys here is the controller's; with it\n"
    "# writable NetworkManager waits for udev, which never runs in a container\n"
    "[Service]\nBindReadOnlyPaths=/sys\n"
)


def network_files(flavour: Flavour, address: str, gateway: str, nameservers: list[str]) -> dict[str, tuple[str, int]]:
    """Files (content, mode) of DGX OS's network stack on a ``netplan_nm`` host whose eth0
    has ``address`` (/24) and ``gateway``, by absolute path; none for other flavours."""
    if not flavour.netplan_nm:
        return {}
    netplan = (
        "# sparkrig lab (lab/dgxos.py): DGX OS's netplan, NetworkManager renders every port;\n"
        "# eth0 is static (no DHCP server in the lab)\n"
        "network:\n  version: 2\n  renderer: NetworkManager\n  ethernets:\n    eth0:\n"
        f"      addresses: [{address}/24]\n"
        f"      routes: [{{to: default, via: {gateway}}}]\n"
        f"      nameservers: {{addresses: [{', '.join(nameservers)}]}}\n"
    )
    return {NETPLAN_FILE: (netplan, 0o600), NM_LAB_DROP_IN: (NM_LAB_CONF, 0o644)}


def install_command() -> str:
    """What the lab runs on a booted ``dgx_os`` host, as its user, to install the stack."""
    return (
        "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        "--no-install-recommends -o Dpkg::Use-Pty=0 " + " ".join(PACKAGES) + " >/dev/null"
    )
