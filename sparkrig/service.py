"""
The lifecycle of a systemd unit a concern keeps, decided from the deploy's reading (the
unit's ``is-active`` / ``is-enabled`` in :class:`sparkrig.atomic.HostState`): stopped and
disabled when its concern is off, enabled and running when on, restarted (or reloaded) when
a file it reads changed in this run. A converged unit adds no operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed


def _state(units: Mapping[str, Mapping[str, str]], unit: str) -> tuple[str | None, str | None]:
    now = units.get(unit) or {}
    return now.get("active"), now.get("enabled")


def stopped(unit: str, units: Mapping[str, Mapping[str, str]], why: str) -> None:
    """``unit`` stopped and disabled (``why``: the setting that turned it off), where it
    runs or starts at boot."""
    active, enabled = _state(units, unit)
    if active == "active" or enabled == "enabled":
        systemd.service(name=f"{unit} is stopped and disabled ({why})", service=unit, running=False, enabled=False)


def kept_running(
    unit: str,
    units: Mapping[str, Mapping[str, str]],
    restart_on: Iterable = (),
    reload_on: Iterable = (),
    fresh: bool = False,
    title: str | None = None,
    why: str = "its files changed",
) -> None:
    """``unit`` enabled and running; restarted when one of the operations ``restart_on``
    changed a file it reads, reloaded when one of ``reload_on`` did (None entries: files that
    were up to date). ``fresh``: its package was installed in this run, and may have started it
    with the package's own files. ``title``: how the operations name it (the unit's name);
    ``why``: what the restart's name says it follows.

    A unit found stopped (and not fresh) starts with the new files: no restart follows. A
    running one, or one a fresh package may have started with the package's own files, is
    restarted only when a write did change something (``_if=``)."""
    title = title or unit
    active, enabled = _state(units, unit)
    if fresh or (active, enabled) != ("active", "enabled"):
        systemd.service(name=f"{title} is enabled and running", service=unit, running=True, enabled=True)
    if not fresh and active != "active":
        return
    for ops, action, what in (
        (restart_on, "restarted", f"Restart {title}: {why}"),
        (reload_on, "reloaded", f"Reload {title}: its configuration changed"),
    ):
        changed = [op for op in ops if op is not None]
        if changed:
            systemd.service(name=what, service=unit, running=True, _if=any_changed(*changed), **{action: True})
