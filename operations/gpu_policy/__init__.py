"""
GPU policy: persistence mode, a cap on the SM clock and a power limit, held at every boot.

Off unless set: with ``gpu_persistence`` False and no clock cap or power limit nothing is
written. Otherwise the deploy writes a root-owned settings file
(``/etc/sparkrig/gpu-policy.env``), a script (``/usr/local/sbin/sparkrig-gpu-policy``) and a
oneshot unit (``sparkrig-gpu-policy.service``) that runs the script at every boot, once the
driver answers: ``nvidia-smi -pm 1``, ``-lgc 0,MAX``, ``-pl W``. nvidia-smi's settings do not
survive a reboot (or a driver reload), so applying them once from the deploy would hold only
until the next boot; the deploy enables the unit and runs it when its files changed or the
GPU no longer holds what was asked.

A cap of the SM clock is what owners of DGX Spark use against heat: ``nvidia-smi -lgc 0,2100``
took a heavy GB10 run from 91 °C to 65 °C with no failures (open-gpu-kernel-modules issue
1358). Each value may differ per hardware profile (``{"gb10": 2100}``). Before anything changes
the values are checked against what the GPU allows (:class:`GpuState`: ``clocks.max.sm``,
``power.min_limit``, ``power.max_limit``); a value out of range, or a limit the GPU does not
report (``[N/A]``), fails that host naming the key, the value and the range. A setting the
driver refuses when the unit runs (as some are said to be on GB10) fails the unit with
nvidia-smi's own message in its journal, never silently.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "gpu_policy"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "gpu_policy")
