"""
Containers: the Docker engine and the NVIDIA container toolkit, wired together
without clobbering what the host already has.

- Docker comes from the source the settings name: ``auto`` (the default: what is
  installed is kept, as on DGX OS; where Docker is absent it is installed from a
  source the host already has, else from Docker's apt repository), ``docker-ce``
  (Docker's apt repository), ``distro`` (the distribution's ``docker.io``) or
  ``preinstalled`` (verified, never installed). The toolkit likewise: ``auto``,
  ``nvidia`` (NVIDIA's apt repository) or ``preinstalled``. A vendor repository
  is never added a second time: under ``auto``, a file the host already has for
  the same origin (any URL below the setting's, any file name) is used as it is.
- Each repository is a deb822 ``.sources`` file with its own ``Signed-By``
  keyring. The key is fetched on the host, its primary fingerprint compared with
  the setting, and only that key is written to the keyring. Repository and key
  URLs are settings, with ``{os}``, ``{codename}`` and ``{arch}`` filled in from
  the host (``/etc/os-release``, ``dpkg --print-architecture``), so a fleet can
  point at its own mirror.
- ``/etc/docker/daemon.json`` is merged, never overwritten: the ``nvidia``
  runtime is registered (an existing registration, such as ``nvidia-ctk``'s, is
  kept), optionally made the default, and every other key stays as the user set
  it. The result is checked with ``dockerd --validate`` (or parsed as JSON where
  dockerd is older than 23.0) before it replaces the old file, whose copy is kept
  as ``daemon.json.sparkrig-old``; Docker restarts only when it changed.
- CDI: where the toolkit ships ``nvidia-cdi-refresh.path`` (1.18+), it is enabled
  and keeps ``/var/run/cdi/nvidia.yaml`` current; otherwise, on a host with a GPU
  and ``nvidia-ctk``, ``/etc/cdi/nvidia.yaml`` is generated once.
- Users named in ``containers_docker_users`` join the ``docker`` group. That group
  is root-equivalent: its members can start a privileged container.

The concern reads the host once, with two facts (:class:`ContainerHost`,
:class:`SparkrigAptRepositories`: one remote command each), and adds an operation
only where they show work to do; that operation reads its own state again when it
runs. A converged host costs those two commands.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "containers"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "containers")
