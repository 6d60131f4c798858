"""The fleet's Prometheus: Debian's package on the host prometheus_server names, scraping every
host of the inventory, with sparkrig's alert rules; its files validated by promtool before
they take effect."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, deploy
from pyinfra.operations import server

from sparkrig import atomic, host_settings, reading, rendering, service
from sparkrig.packages import installed as install_packages

from .settings import DEFAULTS, scrape_targets, serving_targets

PACKAGE = "prometheus"
SERVICE = "prometheus.service"
CONFIG = "/etc/prometheus/prometheus.yml"
RULES = "/etc/prometheus/sparkrig.rules.yml"
DEFAULT_FILE = "/etc/default/prometheus"
JOB = "sparkrig"
SERVING_JOB = "sparkrig-serving"  # each served model's engine, its own /metrics
# The GPU's clocks event reasons (the metrics concern's names) that SparkGpuThrottled counts:
# thermal and power, not idling or an application's own clock setting.
THROTTLE_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
# promtool reads the file to be before it takes the place of the live one (atomic.file appends
# the new file's path); `check config` also checks the rule files the configuration names.
CHECK_CONFIG = ("promtool", "check", "config")
CHECK_RULES = ("promtool", "check", "rules")


def render_rules(memory_available_min_bytes: int) -> str:
    return rendering.render(
        "prometheus/sparkrig.rules.yml.j2",
        job=JOB,
        memory_available_min_bytes=memory_available_min_bytes,
        throttle_reasons="|".join(THROTTLE_REASONS),
    )


def render_config(
    targets: list[tuple[str, str]],
    scrape_interval_s: int,
    evaluation_interval_s: int,
    serving: list[tuple[str, str, str]] | None = None,
) -> str:
    return rendering.render(
        "prometheus/prometheus.yml.j2",
        job=JOB,
        serving_job=SERVING_JOB,
        targets=targets,
        serving=serving or [],
        rules_file=RULES,
        scrape_interval_s=scrape_interval_s,
        evaluation_interval_s=evaluation_interval_s,
        # A scrape may take at most the interval (Prometheus refuses a longer timeout), 10 s at most.
        scrape_timeout_s=min(10, scrape_interval_s),
    )


def prometheus_args(listen: str, retention_days: int) -> list[str]:
    """Prometheus' arguments beyond Debian's defaults (its configuration and storage paths)."""
    return [f"--web.listen-address={listen}", f"--storage.tsdb.retention.time={retention_days}d"]


def render_default_file(args: list[str]) -> str:
    # Each argument is one word of letters, digits and '.-=:' (validated settings): no quoting.
    return rendering.render("prometheus/prometheus.default.j2", args=" ".join(args))


STATE = reading.part(atomic.HostState, paths=(CONFIG, RULES, DEFAULT_FILE), units=(SERVICE,), packages=(PACKAGE,))


@reading.planner
def reads(settings):
    # Nothing where no host runs Prometheus; where one does, every host's one reading holds
    # this part (the planner knows settings, not which host it plans for), the server alone uses it.
    return [STATE] if settings["prometheus_server"] is not None else []


def _everyone() -> list[tuple[str, dict]]:
    # Each host's settings over its data: metrics_listen resolved, ssh_hostname kept.
    return [(peer.name, {**peer.data.dict(), **host_settings.known(peer)}) for peer in host.inventory]


def _targets() -> list[tuple[str, str]]:
    return scrape_targets(_everyone(), host.name)


@deploy("Fleet Prometheus", data_defaults=DEFAULTS)
def prometheus():
    """
    On the host ``prometheus_server`` names: Debian's Prometheus, scraping every host of the
    inventory, with sparkrig's alert rules; nothing on any other host.

    Settings: ``prometheus_server``, ``prometheus_listen``, ``prometheus_scrape_interval_s``,
    ``prometheus_evaluation_interval_s``, ``prometheus_retention_days``,
    ``prometheus_memory_available_min_bytes``; see docs/settings.md.
    """
    settings = host_settings.current()
    if settings.prometheus_server != host.name:
        return
    state = reading.value(STATE)
    unit = state["units"].get(SERVICE, {})
    installed = state["packages"].get(PACKAGE) is not None
    if not installed:
        # Debian's package starts Prometheus at once, on every address with its own
        # configuration: masked, it starts only once sparkrig's files are in place.
        server.shell(
            name="Prometheus waits for its configuration (masked while installed)",
            commands=[StringCommand("systemctl", "mask", SERVICE)],
        )
        install_packages(name="Install Prometheus", packages=[PACKAGE])
    files = state["files"]
    rules_text = render_rules(settings.prometheus_memory_available_min_bytes)
    config_text = render_config(
        _targets(),
        settings.prometheus_scrape_interval_s,
        settings.prometheus_evaluation_interval_s,
        serving_targets(_everyone(), host.name),
    )
    default_text = render_default_file(prometheus_args(settings.prometheus_listen, settings.prometheus_retention_days))
    reload_on = []
    # Rules first: `promtool check config` of a new configuration checks the rules it names.
    for what, dest, text, check in (
        ("Alert rules", RULES, rules_text, CHECK_RULES),
        ("Scrape configuration", CONFIG, config_text, CHECK_CONFIG),
    ):
        reload_on.append(
            atomic.file_if_changed(
                name=f"{what} ({dest}), checked by promtool",
                dest=dest,
                content=text,
                current=files.get(dest),
                validate=check,
            )
        )
    arguments = atomic.file_if_changed(
        name=f"Prometheus' arguments ({DEFAULT_FILE})",
        dest=DEFAULT_FILE,
        content=default_text,
        current=files.get(DEFAULT_FILE),
        validate=("sh", "-n"),
    )
    # Also where a run stopped between the mask and here (a file promtool refused).
    if not installed or unit.get("enabled") == "masked":
        server.shell(name="Prometheus may start (unmasked)", commands=[StringCommand("systemctl", "unmask", SERVICE)])
    # Masked while installed, a fresh Prometheus first starts here, with these files: no
    # restart then. A reload (SIGHUP) reads the configuration and rules again, keeping the samples.
    service.kept_running(
        SERVICE,
        state["units"],
        restart_on=[arguments],
        reload_on=reload_on,
        title="Prometheus",
        why="its arguments changed",
    )
