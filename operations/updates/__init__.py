"""
Updates: kernel and NVIDIA driver held alike, upgrades on the owner's terms, versions read.

- ``updates_hold`` holds packages as data: ``NAME`` (a name or glob) is held with
  ``apt-mark hold`` (every installed package it matches); ``NAME=VERSION`` is pinned to
  that version in ``/etc/apt/preferences.d/sparkrig-holds`` (written atomically,
  checked by apt before it takes effect). What sparkrig held is recorded in
  ``/var/lib/sparkrig/updates-held``: a hold dropped from the setting is released
  (``apt-mark unhold``, or the pin removed) and the package upgraded in the same run.
  Holds made by hand are never released.
- ``updates_unattended``: ``off`` (the default: sparkrig's boxes are GPU boxes, where a
  kernel or driver upgrade must be the owner's decision), ``security`` or ``on``, in
  ``/etc/apt/apt.conf.d/99sparkrig-updates`` (read after the distribution's files, so
  it wins), with the apt-daily timers stopped or running to match. Held packages are
  never upgraded unattended.
- ``updates_expected_kernel`` / ``updates_expected_driver``: the running kernel and the
  loaded driver a box must have; with ``updates_stop_on_unexpected`` a box that runs
  another is refused before anything changes on it (other hosts go on).
- systemd-oomd is masked where earlyoom is the watchdog (see docs/updates.md).
- ``updates_boot_history`` / ``updates_boot_count``: the journal kept across boots (a journald
  drop-in) and systemd-pstore enabled where present, so the report tells how each of the last
  boots ended (operations/updates/boots.py; docs/updates.md).
- ``updates_reboot`` / ``updates_drain_timeout``: whether and how ``sparkrig rollout``
  reboots a box that needs it (drained first; the deploy itself never reboots).

:class:`Versions` reads, in the host's one reading, what the report
(``sparkrig report``) shows: OS and DGX OS release, running and installed
kernel, installed and loaded NVIDIA driver, CUDA, Docker, the container toolkit, and
the venv's torch and vLLM (from their ``.dist-info/METADATA``, read as the venv's
owner: root runs nothing the venv holds).
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "updates"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "updates")
