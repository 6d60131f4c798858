"""
Memory watchdog: earlyoom kills the biggest (preferably a training) process while
the host still has memory to spare, instead of letting it freeze.

On GB10 a GPU allocation that fails can wedge the whole machine before the kernel
OOM killer acts, so the defence must act early. earlyoom comes from the
distribution (Debian 12: 1.7, Debian 13: 1.8, Ubuntu 24.04/DGX OS 7: 1.7). Its
arguments live in ``/etc/default/earlyoom`` (``EARLYOOM_ARGS``), which the
packaged unit reads with ``EnvironmentFile=`` and splits into words:

- ``-M watchdog_min_available_kib``: SIGTERM once MemAvailable falls to this
  many KiB, SIGKILL at half of it;
- ``-s 100``: free swap never holds it back (earlyoom acts only when memory AND
  swap are low);
- ``--prefer``/``--avoid``: regexes on the process name (``/proc/PID/comm``);
- ``-r``: how often it logs a memory report.

A drop-in gives earlyoom itself ``OOMScoreAdjust=-1000`` and ``Nice=-20``: the
kernel never kills the watchdog, and it keeps polling under CPU load. earlyoom
forks nothing, so nothing inherits the -1000 (unlike sshd's sessions). The
service is restarted only when one of the two files changed.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "watchdog"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "watchdog")
