"""Where the lab keeps its state, where it caches images, and its fixed names.

Paths come from the environment once, at import time:

- ``SPARKRIG_LAB_DIR`` (default ``/var/lib/sparkrig-lab``): hosts, SSH key,
  inventory, state;
- ``SPARKRIG_LAB_CACHE`` (default ``/var/cache/sparkrig-lab``): debootstrapped
  images, the apt repositories' signing keys and built repositories, kept
  across ``up``/``down``;
- ``SPARKRIG_LAB_MIRROR`` (default ``http://deb.debian.org/debian``): the
  Debian mirror used by debootstrap and by apt inside the hosts;
- ``SPARKRIG_LAB_CUDA`` (default: where this machine's ``/usr/local/cuda``
  leads): a real CUDA toolkit directory ``.../cuda-X.Y`` that flavours with
  ``cuda_toolkit`` see read-only at ``/usr/local/cuda-X.Y``; empty for none;
- ``SPARKRIG_LAB_ID`` (default: none): a digit 1-9 that makes this a separate lab
  beside the default one, with names and addresses of its own (namespaces
  ``sparkrig<ID>-*``, links ``sr<ID>lab*``, table ``sparkrig_lab<ID>``, subnet
  ``10.<213+ID>``, cgroup ``sparkrig-lab<ID>``, its own state directory and
  apt repository server), so two checkouts can run their lab tests at once;
  the image cache is shared. ``down`` of one never touches the other: each lab
  restores the ``net.ipv4.ip_forward`` it found when it goes down, except that it
  leaves it at 1 while another lab still runs.
"""

from __future__ import annotations

import os
from pathlib import Path


def lab_id(value: str) -> str:
    """The lab's instance suffix: "" for the default lab, else one digit 1-9."""
    if value not in ("", *"123456789"):
        raise ValueError(f"SPARKRIG_LAB_ID must be one digit 1-9 (or unset), not {value!r}")
    return value


LAB_ID = lab_id(os.environ.get("SPARKRIG_LAB_ID", ""))
_SUFFIX = f"-{LAB_ID}" if LAB_ID else ""

LAB_DIR = Path(os.environ.get("SPARKRIG_LAB_DIR", f"/var/lib/sparkrig-lab{_SUFFIX}"))
CACHE_DIR = Path(os.environ.get("SPARKRIG_LAB_CACHE", "/var/cache/sparkrig-lab"))
MIRROR = os.environ.get("SPARKRIG_LAB_MIRROR", "http://deb.debian.org/debian")
CONTROLLER_CUDA = os.environ.get("SPARKRIG_LAB_CUDA", os.path.realpath("/usr/local/cuda"))

HOSTS_DIR = LAB_DIR / "hosts"
SSH_KEY = LAB_DIR / "ssh" / "id_ed25519"
KNOWN_HOSTS = LAB_DIR / "known_hosts"
SSH_CONFIG = LAB_DIR / "ssh_config"
INVENTORY = LAB_DIR / "inventory.json"
STATE = LAB_DIR / "state.json"
LOCK = LAB_DIR / "lock"
REPO_CACHE = CACHE_DIR / f"repo{_SUFFIX}"
REPO_SERVER_PID = LAB_DIR / "repo-server.pid"
REPO_SERVER_LOG = LAB_DIR / "repo-server.log"
# The controller's cache of the fleet's source-build wheels (source_builds_controller_cache
# in inventory/lab.py): emptied by up and down, so a fresh lab builds for real.
WHEEL_CACHE = LAB_DIR / "wheel-cache"
# The controller's cluster key pairs (cluster_key_dir in inventory/lab.py): removed by up
# and down, so a fresh lab makes its cluster key anew.
CLUSTER_KEYS = LAB_DIR / "cluster-keys"

SSH_USER = "spark"
SSH_UID = 1000

NETNS_PREFIX = f"sparkrig{LAB_ID}-"
VETH_PREFIX = f"sr{LAB_ID}lab"
NFT_TABLE = f"sparkrig_lab{LAB_ID}"
SUBNET_PREFIX = f"10.{213 + int(LAB_ID or 0)}"
CGROUP_PARENT = f"sparkrig-lab{LAB_ID}"

# The lab's signed apt repositories (stand-ins for Docker's and NVIDIA's), served
# over HTTP from the controller on each host's gateway address at this port.
REPO_PORT = 8765
# The node exporter's port (the metrics concern's, on each host's lab address): the one port
# on which the lab's hosts reach each other, for the fleet's Prometheus (inventory/lab.py).
METRICS_PORT = 9100
DOCKER_STANDIN_PACKAGE = "sparkrig-lab-standin-docker-ce"
TOOLKIT_STANDIN_PACKAGE = "sparkrig-lab-standin-nvidia-container-toolkit"
# Stand-ins for a kernel and an NVIDIA driver package, each in an old and a new version.
KERNEL_STANDIN_PACKAGE = "sparkrig-lab-standin-kernel"
DRIVER_STANDIN_PACKAGE = "sparkrig-lab-standin-nvidia-driver"
UPDATE_STANDIN_VERSIONS = ("1.0", "2.0")

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
CONTROLLER_RESOLV_CONF = Path("/etc/resolv.conf")
CONTROLLER_CA_DIR = Path("/usr/local/share/ca-certificates")

BOOT_TIMEOUT_S = 90.0
STOP_GRACE_S = 20.0

# This machine's local wheel folder: a PyTorch CPU wheel lies there on these
# machines; the lab serves it to its hosts (lab/wheelhouse.py).
LOCAL_WHEEL_DIR = Path("/opt/wheels")
