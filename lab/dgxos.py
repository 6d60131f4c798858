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
STAND-IN (lab/nvidia-smi-standin.sh) that answers the queries sparkrig makes (the hardware
fact's, the GPU policy's, ``-L``) as the named GPU would, takes the GPU policy's settings
(``-pm``, ``-lgc``, ``-pl``) as root, records each, answers later queries consistently with
them and forgets them at a reboot, as a GPU does; every other call fails as nvidia-smi does
without a driver: the lab has no GPU. There is no
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

import shlex
from pathlib import Path

from .config import DOCKER_STANDIN_PACKAGE, TOOLKIT_STANDIN_PACKAGE
from .model import Flavour

SOURCES_FILE = "/etc/apt/sources.list.d/dgx.list"
PIN_FILE = "/etc/apt/preferences.d/dgx"
KEYRING = "/usr/share/keyrings/sparkrig-lab-dgx-standin.asc"
NVIDIA_SMI = "/usr/local/bin/nvidia-smi"
PACKAGES = (DOCKER_STANDIN_PACKAGE, TOOLKIT_STANDIN_PACKAGE)

# The query operations/hardware/ sends to tell what the box is (the stand-in answers it).
HARDWARE_QUERY = "--query-gpu=compute_cap,name --format=csv,noheader"
STANDIN_SCRIPT = Path(__file__).with_name("nvidia-smi-standin.sh")
# The stand-in's figures per GPU name: made up for the stand-in (near the cards' published
# ones), never read from a real card. GB10's power limits are [N/A] here: whether a Spark's
# driver offers -pl is not known, so the stand-in refuses it
# (exit 3, "not supported") and sparkrig's checks must say so.
STANDIN_GPUS = {
    "NVIDIA GB10": {
        "MAX_SM": "3003",
        "POWER_DRAW": "[N/A]",
        "POWER_MIN": "[N/A]",
        "POWER_MAX": "[N/A]",
        "POWER_DEFAULT": "[N/A]",
        "TEMPERATURE": "45",
    },
}
STANDIN_DEFAULT = {
    "MAX_SM": "3090",
    "POWER_DRAW": "31.50",
    "POWER_MIN": "250.00",
    "POWER_MAX": "350.00",
    "POWER_DEFAULT": "300.00",
    "TEMPERATURE": "45",
}
# Where the stand-in records each setting call (boot id, uid, arguments): kept across reboots.
STANDIN_CALLS = "/var/lib/sparkrig-lab-nvidia-smi/calls"


def nvidia_smi_standin(answer: str) -> str:
    """The stand-in nvidia-smi script (lab/nvidia-smi-standin.sh) for the GPU ``answer``
    describes ("12.1, NVIDIA GB10": compute capability, name), with that GPU's stand-in figures."""
    capability, name = answer.split(", ", 1)
    figures = {"CAP": capability, "NAME": name, **STANDIN_GPUS.get(name, STANDIN_DEFAULT)}
    header = "".join(f"{key}={shlex.quote(value)}\n" for key, value in figures.items())
    body = STANDIN_SCRIPT.read_text()
    first, rest = body.split("\n", 1)
    return f"{first}\n{header}{rest}"


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
            f"Package: *\nPin: release o={origin}\nPin-Priority: 600\n",
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
