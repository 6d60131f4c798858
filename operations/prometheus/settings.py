"""The fleet's Prometheus: the settings, declared once, their checks, and the scrape targets
worked out from the inventory (pure: the deploy, the fleet check and the controls share them)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sparkrig.operations.metrics import settings as metrics_settings
from sparkrig.operations.metrics.settings import listen_address
from sparkrig.operations.serving import settings as serving_settings
from sparkrig.settings import Setting, declare, defaults, int_range

# Where the metrics concern's node exporter listens unless a host's data says otherwise.
DEFAULT_METRICS_LISTEN = metrics_settings.DEFAULTS["metrics_listen"]
_HOST_PORT = re.compile(r"(?P<address>[0-9.]+|localhost)?:(?P<port>[0-9]{1,5})")
_NAME = re.compile(r"[A-Za-z0-9@][A-Za-z0-9_.@/:-]{0,252}")


def _said(key: str, value: Any, allowed: str) -> str:
    return f"{key} = {value!r}: allowed is {allowed}"


def split_listen(value: Any) -> tuple[str, int] | None:
    """``ADDRESS:PORT`` (ADDRESS an IPv4 address, ``localhost`` or empty for every address) as
    (address, port), or None when it is no such thing."""
    match = _HOST_PORT.fullmatch(value) if isinstance(value, str) else None
    if not match or not 1 <= int(match["port"]) <= 65535:
        return None
    address = match["address"] or ""
    if address not in ("", "localhost"):
        try:
            if str(ipaddress.IPv4Address(address)) != address:
                return None
        except ValueError:
            return None
    return address, int(match["port"])


# Checks --------------------------------------------------------------------


def server_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    if value is None or (isinstance(value, str) and _NAME.fullmatch(value)):
        return None
    return "None (no Prometheus) or the inventory name of the host that runs it, the same on every host"


def listen_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    if split_listen(value) is not None:
        return None
    return (
        "ADDRESS:PORT with an IPv4 address (127.0.0.1:9090, the default, keeps it on loopback) "
        "or ':PORT' for every address"
    )


def bytes_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (64 << 20) <= value <= (1 << 50)
    return None if ok else "an integer number of bytes from 67108864 (64 MiB) to 2**50"


SETTINGS = (
    Setting(
        "prometheus_server",
        None,
        "The inventory name of the host that runs the fleet's Prometheus (Debian's `prometheus`), "
        "which scrapes every host of the inventory at its node exporter (metrics_listen) and "
        "evaluates sparkrig's alert rules (docs/monitoring.md). None: no Prometheus, and this "
        "concern does nothing. Set it for every host (group_data/all.py): every host of the "
        "inventory must name the same one, and each host other than it must serve its metrics on "
        "an address it can reach (metrics_listen not on loopback).",
        server_check,
    ),
    Setting(
        "prometheus_listen",
        "127.0.0.1:9090",
        "Where Prometheus serves its web UI and HTTP API (--web.listen-address). Loopback by "
        "default: Prometheus has no authentication, so reach it through SSH "
        "(`ssh -L 9090:127.0.0.1:9090 HOST`) unless you mean others to read it.",
        listen_check,
    ),
    Setting(
        "prometheus_scrape_interval_s",
        15,
        "How often Prometheus scrapes each host's node exporter, in seconds.",
        int_range(1, 3600, "seconds"),
    ),
    Setting(
        "prometheus_evaluation_interval_s",
        15,
        "How often Prometheus evaluates the alert rules, in seconds. A memory alert fires at "
        "the first evaluation that sees MemAvailable below its threshold.",
        int_range(1, 3600, "seconds"),
    ),
    Setting(
        "prometheus_retention_days",
        15,
        "How long Prometheus keeps its samples (--storage.tsdb.retention.time), in days.",
        int_range(1, 3650, "days"),
    ),
    Setting(
        "prometheus_memory_available_min_bytes",
        8 << 30,
        "The SparkMemoryLow alert fires on any host whose MemAvailable (node exporter's "
        "node_memory_MemAvailable_bytes) falls below this many bytes: a freeze is near. 8 GiB, "
        "twice earlyoom's default floor (watchdog_min_available_kib), warns before earlyoom kills. "
        "Read from the Prometheus host's settings; one threshold for the fleet.",
        bytes_check,
    ),
)

# The settings this concern's deploy reads: its own, where each host's metrics are served, and
# the models each host serves (their engines are scraped too).
DEFAULTS = defaults(
    (*SETTINGS, *metrics_settings.SETTINGS, *(s for s in serving_settings.SETTINGS if s.key == "serving_models"))
)


# The fleet: who scrapes whom -------------------------------------------------------------


def target(name: str, data: Mapping[str, Any], server: str) -> str | None:
    """Where the Prometheus on ``server`` scrapes host ``name``'s node exporter: its
    metrics_listen address; on loopback only the server's own; every address (0.0.0.0, [::]):
    the address the deploy reaches it at (ssh_hostname, else its name). None: it cannot."""
    listen = data.get("metrics_listen", DEFAULT_METRICS_LISTEN)
    address = listen_address(listen)
    if address is None:
        return None
    port = listen.rsplit(":", 1)[1]
    if address.is_unspecified:
        return f"{data.get('ssh_hostname') or name}:{port}"
    if address.is_loopback:
        return listen if name == server else None
    return listen


def scrape_targets(everyone: Sequence[tuple[str, Mapping[str, Any]]], server: str) -> list[tuple[str, str]]:
    """(inventory name, address) of every host the Prometheus on ``server`` scrapes, in
    inventory order: every host that serves metrics (metrics_enabled) where it can reach them."""
    return [
        (name, found)
        for name, data in everyone
        if data.get("metrics_enabled", True) and (found := target(name, data, server)) is not None
    ]


def serving_targets(everyone: Sequence[tuple[str, Mapping[str, Any]]], server: str) -> list[tuple[str, str, str]]:
    """(host's inventory name, model, HOST:PORT) of each served model (serving_models) the
    server can scrape: vLLM's own /metrics, which its API key does not guard (llama.cpp's key
    guards its /metrics: a keyed llama.cpp model is not scraped). A model on the
    loopback is scraped on the server alone; one on every address at the address the deploy
    reaches its host at; any other at its listen address (its allow must name the server)."""
    found = []
    for name, data in everyone:
        for model in data.get("serving_models") or []:
            if model.get("engine") == "llama.cpp" and model.get("key"):
                # llama.cpp's key guards its /metrics too: the probe's series alone tell of it.
                continue
            try:
                address = ipaddress.ip_address(model.get("listen", "127.0.0.1"))
            except ValueError:
                continue
            if address.is_loopback:
                if name != server:
                    continue
                where = f"[{address}]" if address.version == 6 else str(address)
            elif address.is_unspecified:
                where = str(data.get("ssh_hostname") or name)
            else:
                where = f"[{address}]" if address.version == 6 else str(address)
            found.append((name, model["name"], f"{where}:{model['port']}"))
    return found


def fleet_problems(
    targeted: Sequence[tuple[str, Mapping[str, Any]]], everyone: Sequence[tuple[str, Mapping[str, Any]]]
) -> list[tuple[str, str]]:
    """(host, problem): prometheus_server names a host of the inventory, the same on every
    host, and every host serves its metrics where that host can reach them."""
    servers = {data.get("prometheus_server") for _, data in everyone}
    if servers <= {None}:  # none set, or an inventory without hosts
        return []
    names = [name for name, _ in everyone]
    found: list[tuple[str, str]] = []
    first_name, first = everyone[0][0], everyone[0][1].get("prometheus_server")
    for name, data in targeted:
        server = data.get("prometheus_server")
        if len(servers) > 1:
            found.append(
                (
                    name,
                    _said(
                        "prometheus_server",
                        server,
                        (f"the same host on every host of the inventory ({first_name} has {first!r})"),
                    ),
                )
            )
        elif server not in names:
            found.append(
                (
                    name,
                    _said("prometheus_server", server, (f"the inventory name of one of its hosts: {', '.join(names)}")),
                )
            )
    if found:
        return found
    (server,) = servers
    if server not in {name for name, _ in targeted}:
        return []  # a run without the server writes no scrape configuration
    for name, data in everyone:
        if data.get("metrics_enabled", True) and target(name, data, server) is None:
            found.append(
                (
                    name,
                    _said(
                        "metrics_listen",
                        data.get("metrics_listen", DEFAULT_METRICS_LISTEN),
                        (f"an address {server} (prometheus_server) can reach: not loopback on a host other than it"),
                    ),
                )
            )
    return found


FLEET_CHECKS = (fleet_problems,)
declare(__name__, SETTINGS, FLEET_CHECKS)
