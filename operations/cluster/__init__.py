"""
Clusters: two or more boxes linked through their ConnectX-7 ports, as one cluster.

Off unless a host has ``cluster_name``. A cluster is a group of the inventory: every
host with the same ``cluster_name``. Per host:

- **The link.** Each rail (each interface of ``cluster_interfaces`` and, with
  ``cluster_rails`` 'twins', the twin of each that the host has: a Spark's QSFP port is two
  interfaces) gets its static address and ``cluster_mtu``: a systemd-networkd ``.network``
  file, or ``/etc/netplan/40-sparkrig-cluster.yaml`` (mode 600, rendered by networkd) where
  the host has netplan. The file is validated before it takes effect. A change is applied
  node after node, to those interfaces alone, and kept only when a NEW SSH connection
  confirms it; else the node puts the old files back by itself (:func:`link`). The interface
  the deploy's own SSH connection arrives on is never one of them, and settings validation
  keeps every cluster subnet clear of the controller's path to each node.
- **Trust.** One key pair per node, made on the controller once per install of the node
  (``cluster_key_dir/NAME/NODE/id_ed25519``, 0600; a node whose SSH host keys changed,
  reinstalled, gets a new one). A node's private half is its cluster
  user's ``/etc/sparkrig/cluster/id_ed25519``; every node's public half is a line of the
  cluster user's ``~/.ssh/authorized_keys`` on every node (written as them), restricted with
  ``from=`` to that node's addresses; every node's host keys are pinned in
  ``/etc/sparkrig/cluster/known_hosts``,
  which ``/etc/ssh/ssh_config.d/50-sparkrig-cluster.conf`` makes the only host keys the
  cluster user's ssh accepts for those addresses (``StrictHostKeyChecking yes``).
- **NCCL's environment** (``NCCL_IB_HCA``: the rails' RoCE devices, ``NCCL_SOCKET_IFNAME``,
  ``MASTER_ADDR``, ...) in ``cluster_env_file``,
  read by login shells and units, and an MPI hostfile, ``/etc/sparkrig/cluster/hostfile``.
- ``spark-cluster-check``: per peer, link up, MTU, a jumbo ping that must not fragment,
  SSH as the cluster user without a prompt; with ``--bandwidth``, ib_write_bw on each rail
  to each peer against ``cluster_rail_floor_gbits``; with ``--nccl``, nccl-tests' ``all_reduce_perf``
  (a prefix source build named ``nccl-tests``, in ``/opt/sparkrig/builds/nccl-tests/current/bin``)
  across the nodes with mpirun.

Every node's host keys come from its own reading (a peer's reading is its one reading,
made early), so a node added to the inventory is trusted by the others after one run,
a node removed is no longer trusted (its key's line leaves every authorized_keys, its
host keys the pinned file), and a node reinstalled is pinned anew with a new key pair in
place of its old one, in one run.
"""

from sparkrig.operations import deploy_on_demand

from .settings import FLEET_CHECKS, SETTINGS

__all__ = ["FLEET_CHECKS", "SETTINGS", "cluster"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "cluster")
