"""The lab: real Debian systemd hosts on this machine, for converge and compliance tests.

Each host is a Debian root file system booted with ``systemd-nspawn --boot``
in its own network namespace, reachable from the controller over SSH (user
``spark``, the lab's key, strict host key checking) and reaching the package
registries through NAT. Run as root::

    python -m lab up [--hosts NAME:FLAVOUR,...]
    python -m lab status
    python -m lab ssh NAME [COMMAND...]
    python -m lab down

or from Python (pytest fixtures)::

    import lab
    hosts = lab.up()
    lab.run_ssh("lab-deb12", "systemctl is-system-running")
    lab.down()

``up`` writes ``inventory.json``, ``known_hosts`` and ``ssh_config`` under
:data:`LAB_DIR`; see :mod:`lab.render` for their formats. It also
serves the lab's signed apt repositories (stand-ins for Docker's and NVIDIA's,
see :mod:`lab.repo`) to each host at its ``apt_repo_url``. Importing
this package has no side effects and needs no privileges.
"""

from .config import LAB_DIR
from .fleet import (
    appear_as,
    down,
    images_to_build,
    inventory_path,
    kill,
    link,
    recreate,
    restart,
    run_ssh,
    ssh_config_path,
    status,
    unlink,
    up,
)
from .model import BOOTED_FLEET, DEFAULT_FLEET, FLAVOURS, HOSTILE_FLEET, LabHost
from .system import LabCommandError, LabError, missing_requirements

__all__ = [
    "appear_as",
    "BOOTED_FLEET",
    "DEFAULT_FLEET",
    "HOSTILE_FLEET",
    "FLAVOURS",
    "LAB_DIR",
    "LabCommandError",
    "LabError",
    "LabHost",
    "down",
    "images_to_build",
    "inventory_path",
    "kill",
    "link",
    "missing_requirements",
    "recreate",
    "restart",
    "run_ssh",
    "ssh_config_path",
    "status",
    "unlink",
    "up",
]
