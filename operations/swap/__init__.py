"""
Swap off, and it stays off.

On GB10 the CPU and the GPU share one pool of memory and GPU allocations cannot be
swapped out: under pressure swap only delays and deepens the freeze that takes the
whole box down, instead of letting the OOM killer end the job (docs/swap.md). Off
means:

- every swap entry of ``/etc/fstab`` commented out, the rest of the file kept byte for
  byte; a backup of the old file is kept and findmnt validates the new one first;
- the swap units systemd knows (fstab-generated, gpt-auto, zram-generator, hand-written)
  and the zram services (zram-tools, zram-config, systemd-zram-generator) masked and
  stopped, so neither a reboot nor a dependency brings swap back;
- ``swapoff -a`` while ``/proc/swaps`` lists any swap;
- optionally (``swap_remove_files``) the swap files of the disabled entries deleted.

``swap.target`` itself is left alone: ``sysinit.target`` wants it and other units order
against it, and masking it would not stop swap that a service turns on with swapon(8).

A converged host costs one remote command: :class:`SwapSources` reads everything at once,
and the one operation, :func:`disabled`, decides every change from it.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "swap"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "swap")
