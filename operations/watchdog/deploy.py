"""The memory watchdog's deploy: earlyoom installed, configured from the settings, protected,
running; the files it writes and the reading it decides from."""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra.api import deploy

from sparkrig import atomic, host_settings, reading, rendering, service
from sparkrig.packages import installed as install_packages
from sparkrig.units import WATCHDOG_SERVICE

from .settings import DEFAULTS

PACKAGE = "earlyoom"
SERVICE = WATCHDOG_SERVICE
DEFAULT_FILE = "/etc/default/earlyoom"
DROP_IN = "/etc/systemd/system/earlyoom.service.d/50-sparkrig.conf"
OOM_SCORE_ADJUST = -1000
NICE = -20
# earlyoom's own -s: act on memory alone, however much swap is free.
SWAP_PERCENT = 100


def earlyoom_args(min_available_kib: int, report_interval_s: int, prefer: str, avoid: str) -> list[str]:
    """earlyoom's arguments, as the words of its command line."""
    return [
        "-M",
        str(min_available_kib),
        "-s",
        str(SWAP_PERCENT),
        "-r",
        str(report_interval_s),
        "--prefer",
        prefer,
        "--avoid",
        avoid,
    ]


def render_default_file(args: Sequence[str]) -> str:
    """``EARLYOOM_ARGS="..."``: each argument plain or single-quoted, which sh (``.``),
    systemd (``EnvironmentFile=`` then ``$EARLYOOM_ARGS`` split with quote removal) and
    Debian's init script (``bash -c "exec earlyoom $EARLYOOM_ARGS"``) all turn back into
    the bare word; settings validation keeps quotes, backslashes and whitespace out."""
    return rendering.render("watchdog/earlyoom.default.j2", args=" ".join(map(rendering.quote_literal, args)))


def render_drop_in() -> str:
    return rendering.render("watchdog/earlyoom.conf.j2", oom_score_adjust=OOM_SCORE_ADJUST, nice=NICE)


DROP_IN_VALIDATOR = atomic.unit_file_validator(
    ["Service"], {"OOMScoreAdjust": str(OOM_SCORE_ADJUST), "Nice": str(NICE)}
)


# Everything the concern decides from, in the host's one reading.
STATE = reading.part(atomic.HostState, paths=(DROP_IN, DEFAULT_FILE), units=(SERVICE,), packages=(PACKAGE,))


@reading.planner
def reads(_settings):
    return [STATE]


@deploy("Memory watchdog", data_defaults=DEFAULTS)
def watchdog():
    """
    Install earlyoom, configure it from the settings, protect it, keep it running.

    Settings: ``watchdog_enabled``, ``watchdog_min_available_kib``, ``watchdog_prefer``,
    ``watchdog_avoid``, ``watchdog_report_interval_s``; see docs/settings.md.
    """
    settings = host_settings.current()
    state = reading.value(STATE)
    if not settings.watchdog_enabled:
        service.stopped(SERVICE, state["units"], "watchdog_enabled is False")
        return

    installed = state["packages"].get(PACKAGE) is not None
    if not installed:
        install_packages(name="Install earlyoom", packages=[PACKAGE])
    drop_in_text = render_drop_in()
    arguments_text = render_default_file(
        earlyoom_args(
            settings.watchdog_min_available_kib,
            settings.watchdog_report_interval_s,
            settings.watchdog_prefer,
            settings.watchdog_avoid,
        )
    )
    drop_in = atomic.unit_file(
        name=f"earlyoom is never OOM-killed ({DROP_IN})",
        dest=DROP_IN,
        content=drop_in_text,
        validate=DROP_IN_VALIDATOR,
        reload_name="Reload systemd: the earlyoom drop-in changed",
        state=state["files"].get(DROP_IN),
    )
    arguments = atomic.file_if_changed(
        name=f"earlyoom arguments ({DEFAULT_FILE})",
        dest=DEFAULT_FILE,
        current=state["files"].get(DEFAULT_FILE),
        content=arguments_text,
        validate=("sh", "-n"),
    )
    service.kept_running(
        SERVICE,
        state["units"],
        restart_on=[drop_in, arguments],
        fresh=not installed,
        title="earlyoom",
        why="its arguments or drop-in changed",
    )
