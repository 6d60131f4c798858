"""Metrics: node exporter where the owner says, and sparkrig's textfile collector on a timer;
the files they are made of and the host's one reading."""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra.api import deploy

from sparkrig import atomic, host_settings, reading, rendering, service, user_files
from sparkrig.packages import installed as install_packages
from sparkrig.units import JOB_RECORDS, JOB_UNIT_PREFIX, METRICS_TEXTFILE_DIR, WATCHDOG_SERVICE

from .settings import DEFAULTS

PACKAGE = "prometheus-node-exporter"
EXPORTER = "prometheus-node-exporter.service"
# The textfile directory node exporter is pointed at (the drop-in): root's, below root's
# /var/lib/sparkrig, made by the collector. Not Debian's /var/lib/prometheus/node-exporter,
# whose parent is the prometheus user's (who could swap it for a link).
TEXTFILE_DIR = METRICS_TEXTFILE_DIR
TEXTFILE = "sparkrig.prom"
DROP_IN = f"/etc/systemd/system/{EXPORTER}.d/50-sparkrig.conf"
COLLECTOR = "/usr/local/sbin/sparkrig-metrics"
SERVICE = "sparkrig-metrics.service"
TIMER = "sparkrig-metrics.timer"
SERVICE_FILE = f"/etc/systemd/system/{SERVICE}"
TIMER_FILE = f"/etc/systemd/system/{TIMER}"
DESCRIPTION = "sparkrig textfile collector for node exporter, see docs/metrics.md"  # a regex of itself: no ()
# Seconds any one program the collector runs may take (nvidia-smi, systemctl, journalctl, a
# read), and the whole run (the unit's TimeoutStartSec=).
PROGRAM_TIMEOUT_S = 5
RUN_TIMEOUT_S = 60
REBOOT_REQUIRED = "/run/reboot-required"  # Debian's and Ubuntu's flag of a pending reboot
# Lines "CONCERN PASSED FAILED EPOCH": the last compliance outcome per concern, root's, where a
# rollout puts it (docs/metrics.md); none: no compliance metrics.
COMPLIANCE_FILE = "/var/lib/sparkrig/compliance-last"
# torch's METADATA is about 30 KB.
METADATA_LIMIT = 1 << 20
# nvidia-smi's field of the active clock event ("throttle") reasons, a bit mask; drivers from
# 535 on also call it clocks_event_reasons.active.
THROTTLE_FIELD = "clocks_throttle_reasons.active"


# Where the collector finds its programs: root's directories alone (systemd's default PATH).
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def render_collector(venv: str, boot_count: int = 0, **paths: object) -> str:
    """The collector script; ``venv`` is the venv whose torch and vLLM it reports ("": none).
    ``paths`` replaces where it looks (``path``, ``records``, ``reboot_file``,
    ``compliance_file``, ``textfile_dir``, ``proc``: where /proc's meminfo, buddyinfo and vmstat
    are read) and ``timeout_s``: the unit tests' own."""
    timeout_s = int(paths.pop("timeout_s", PROGRAM_TIMEOUT_S))
    values = {
        "path": PATH,
        "records": JOB_RECORDS,
        "reboot_file": REBOOT_REQUIRED,
        "compliance_file": COMPLIANCE_FILE,
        "textfile_dir": TEXTFILE_DIR,
        "proc": "/proc",
        **paths,
    }
    return rendering.render(
        "metrics/sparkrig-metrics.sh.j2",
        name=TEXTFILE,
        timeout_s=timeout_s,
        throttle_field=THROTTLE_FIELD,
        watchdog_service=WATCHDOG_SERVICE,
        unit_prefix=JOB_UNIT_PREFIX,
        venv=venv or "/nonexistent",
        boot_count=int(boot_count),
        user_read_root=user_files.user_read('"$f"', METADATA_LIMIT, timeout_s=timeout_s),
        user_read_owner=user_files.user_read('"$f"', METADATA_LIMIT, as_user='"$OWNER"', timeout_s=timeout_s),
        **values,
    )


def allow_list(allow: Sequence[str]) -> str:
    """IPAddressAllow='s value: the host itself, then the scrapers."""
    return " ".join(["localhost", *allow])


def render_drop_in(listen: str, allow: Sequence[str]) -> str:
    return rendering.render(
        "metrics/node-exporter.conf.j2", listen=listen, textfile_dir=TEXTFILE_DIR, allow=allow_list(allow)
    )


DROP_IN_VALIDATOR = atomic.unit_file_validator(
    ["Service"],
    {
        "ExecStart": "|/usr/bin/prometheus-node-exporter --web.listen-address=[][0-9A-Fa-f:.]+ "
        f"--collector.textfile.directory={TEXTFILE_DIR} \\$ARGS",
        "IPAddressDeny": "any",
        "IPAddressAllow": "localhost( [0-9A-Fa-f:./]+)*",
    },
)
SERVICE_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Service"],
    {
        "Description": DESCRIPTION,
        "Type": "oneshot",
        "ExecStart": COLLECTOR,
        "WorkingDirectory": "/",
        "Nice": "10",
        "TimeoutStartSec": "[0-9]+",
    },
)
TIMER_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Timer", "Install"],
    {
        "Description": DESCRIPTION,
        "OnActiveSec": "0",
        "OnUnitActiveSec": "[0-9]+s",
        "AccuracySec": "1s",
        "WantedBy": "timers.target",
    },
)

# Everything the concern decides from, in the host's one reading.
STATE = reading.part(
    atomic.HostState, paths=(DROP_IN, COLLECTOR, SERVICE_FILE, TIMER_FILE), units=(EXPORTER, TIMER), packages=(PACKAGE,)
)


@reading.planner
def reads(_settings):
    return [STATE]


@deploy("Metrics", data_defaults=DEFAULTS)
def metrics():
    """
    Install node exporter, listening where the owner says and answering the allowed scrapers
    alone, and the textfile collector with its timer; keep both running.

    Settings: ``metrics_enabled``, ``metrics_listen``, ``metrics_allow``, ``metrics_interval_s``,
    and ``python_venv_path`` (whose torch and vLLM versions are reported); see docs/settings.md.
    """
    settings = host_settings.current()
    state = reading.value(STATE)
    units = state["units"]
    if not settings.metrics_enabled:
        for unit in (TIMER, EXPORTER):
            service.stopped(unit, units, "metrics_enabled is False")
        return
    installed = state["packages"].get(PACKAGE) is not None
    if not installed:
        install_packages(name="Install prometheus-node-exporter", packages=[PACKAGE])
    files = state["files"]
    drop_in = atomic.unit_file(
        name=f"node exporter listens on metrics_listen, answers metrics_allow ({DROP_IN})",
        dest=DROP_IN,
        content=render_drop_in(settings.metrics_listen, settings.metrics_allow),
        validate=DROP_IN_VALIDATOR,
        reload_name="Reload systemd: node exporter's drop-in changed",
        state=files.get(DROP_IN),
    )
    # updates' settings: how many boots the report classifies, the gauge counts as many.
    boot_count = settings.updates_boot_count if settings.updates_boot_history else 0
    collector = render_collector(settings.python_venv_path, boot_count)
    atomic.file_if_changed(
        name=f"Textfile collector ({COLLECTOR})",
        dest=COLLECTOR,
        current=files.get(COLLECTOR),
        content=collector,
        mode=0o755,
        validate=("sh", "-n"),
    )
    collector_unit = atomic.unit_file(
        name=f"Textfile collector's unit ({SERVICE_FILE})",
        dest=SERVICE_FILE,
        content=rendering.render(
            "metrics/sparkrig-metrics.service.j2", description=DESCRIPTION, collector=COLLECTOR, timeout_s=RUN_TIMEOUT_S
        ),
        validate=SERVICE_VALIDATOR,
        reload_name="Reload systemd: the collector's unit changed",
        state=files.get(SERVICE_FILE),
    )
    timer = atomic.unit_file(
        name=f"Textfile collector every metrics_interval_s ({TIMER_FILE})",
        dest=TIMER_FILE,
        content=rendering.render(
            "metrics/sparkrig-metrics.timer.j2", description=DESCRIPTION, interval_s=settings.metrics_interval_s
        ),
        validate=TIMER_VALIDATOR,
        reload_name="Reload systemd: the collector's timer changed",
        state=files.get(TIMER_FILE),
    )
    service.kept_running(EXPORTER, units, restart_on=[drop_in], fresh=not installed)
    service.kept_running(TIMER, units, restart_on=[collector_unit, timer], fresh=not installed)
