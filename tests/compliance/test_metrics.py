"""
Metrics controls: node exporter serves the host's metrics where the owner said and answers the
allowed scrapers alone, and sparkrig's textfile collector keeps its file fresh.

What node exporter must run with is worked out here from the settings, independently of the
code that converges (operations/metrics/).
"""

from __future__ import annotations

import shlex
import time

import pytest

from .reads import need

EXPORTER = "prometheus-node-exporter.service"
TIMER = "sparkrig-metrics.timer"
TEXTFILE = "/var/lib/sparkrig/metrics/sparkrig.prom"
# The collector's file is a few KB; read through the one bounded reader (no link on its way,
# no FIFO, no device, capped), whoever may have changed the directory on a host not converged.
TEXTFILE_LIMIT = 1 << 20


@pytest.fixture
def enabled(settings):
    if not settings["metrics_enabled"]:
        pytest.skip("metrics_enabled is False for this host: node exporter is meant to be off")


@need
def state(r) -> dict:
    """What the metrics controls read of the host."""
    return {
        "package": r.package("prometheus-node-exporter"),
        "exporter": r.service("prometheus-node-exporter"),
        "timer": r.service("sparkrig-metrics.timer"),
        "filter": r.run(
            "systemctl show --property IPAddressDeny --property IPAddressAllow --property ExecStart %s", EXPORTER
        ),
        "textfile": r.user_file(shlex.quote(TEXTFILE), TEXTFILE_LIMIT),
        "now": r.run("date +%s"),
    }


def test_node_exporter_and_the_collector_run(read, enabled):
    """Protects against a fleet that is blind between compliance runs: no metrics served, or
    none of sparkrig's (memory, GPU, kills) fed."""
    found = read(state)
    assert found["package"].is_installed, "prometheus-node-exporter is not installed"
    for unit in ("exporter", "timer"):
        assert found[unit].is_enabled, f"{unit} would not start at boot"
        assert found[unit].is_running, f"{unit} is not running"


def test_node_exporter_listens_where_the_owner_said_and_answers_the_allowed_alone(read, settings, enabled):
    """Protects against metrics (job names, versions, memory) served to whoever asks: node
    exporter listens on metrics_listen, and systemd drops every address but the host's own and
    metrics_allow's."""
    shown = read(state)["filter"].check()
    assert f"--web.listen-address={settings['metrics_listen']} " in shown, shown
    lines = dict(line.split("=", 1) for line in shown.splitlines() if line.startswith("IPAddress"))
    # systemd prints "any" as both families' whole ranges, in either order.
    assert set(lines.get("IPAddressDeny", "").split()) in ({"any"}, {"0.0.0.0/0", "::/0"}), lines
    allowed = set(lines.get("IPAddressAllow", "").split())
    expected = {"127.0.0.0/8", "::1/128"} | {
        a if "/" in a else a + ("/128" if ":" in a else "/32") for a in settings["metrics_allow"]
    }
    assert allowed == expected, f"allowed {sorted(allowed)}, expected {sorted(expected)}"


def test_the_collectors_file_is_fresh(read, settings, enabled):
    """Protects against graphs that flatline on a stale file (a collector that stopped or
    hangs): sparkrig.prom was written within three of its intervals."""
    found = read(state)
    text = found["textfile"].check()
    stamp = [
        line.split()[1] for line in text.splitlines() if line.startswith("sparkrig_metrics_last_run_timestamp_seconds ")
    ]
    assert stamp, f"{TEXTFILE} holds no run's timestamp"
    now = int(found["now"].check() or time.time())
    age = now - int(stamp[0])
    assert age <= 3 * settings["metrics_interval_s"] + 60, f"{TEXTFILE} was written {age} s ago"
