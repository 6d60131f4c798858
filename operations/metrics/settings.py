"""Metrics (node exporter and sparkrig's textfile collector): the settings, declared once, and
their checks."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from sparkrig import stack_locks
from sparkrig.operations.updates import settings as updates_settings
from sparkrig.settings import Setting, boolean, declare, defaults, int_range

# HOST:PORT, HOST an IPv4 address or a bracketed IPv6 one (node exporter's --web.listen-address).
_LISTEN = re.compile(r"(?P<host>[0-9.]{7,15}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>[1-9][0-9]{0,4})")
# An address or a network as systemd's IPAddressAllow= takes it.
_NETWORK = re.compile(r"[0-9A-Fa-f:.]{2,45}(/[0-9]{1,3})?")


def listen_address(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a valid metrics_listen, else None."""
    match = _LISTEN.fullmatch(value) if isinstance(value, str) else None
    if not match or int(match["port"]) > 65535:
        return None
    try:
        return ipaddress.ip_address(match["host"].strip("[]"))
    except ValueError:
        return None


def listen_check(value: Any, data: Mapping[str, Any]) -> str | None:
    address = listen_address(value)
    if address is None:
        return 'ADDRESS:PORT, an IPv4 address or a bracketed IPv6 one, such as "127.0.0.1:9100" or "[::]:9100"'
    if not address.is_loopback and not data.get("metrics_allow"):
        return (
            "a loopback address while metrics_allow is empty (name the scrapers in metrics_allow to listen "
            "on another address)"
        )
    return None


def allow_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = 'a list of IP addresses or networks (CIDR) of the scrapers, such as ["192.168.1.10", "10.0.0.0/24"]'
    if not isinstance(value, (list, tuple)):
        return allowed
    for each in value:
        if not isinstance(each, str) or not _NETWORK.fullmatch(each):
            return allowed
        try:
            ipaddress.ip_network(each, strict=False)
        except ValueError:
            return allowed
    return None


SETTINGS = (
    Setting(
        "metrics_enabled",
        True,
        "Serve the host's metrics: Debian's prometheus-node-exporter, and sparkrig's textfile "
        "collector (sparkrig-metrics.timer: unified memory, GPU, earlyoom kills, jobs, a pending "
        "reboot, compliance, versions; docs/metrics.md). False stops and disables both; the "
        "package and files stay.",
        boolean,
    ),
    Setting(
        "metrics_listen",
        "127.0.0.1:9100",
        "Where node exporter listens (--web.listen-address): ADDRESS:PORT. The default, the "
        "loopback, serves only the host itself (and an SSH tunnel). Any other address needs "
        "metrics_allow.",
        listen_check,
    ),
    Setting(
        "metrics_allow",
        [],
        "The scrapers (IP addresses or CIDR networks) node exporter answers besides the host "
        "itself: systemd's IPAddressAllow= on its unit, with IPAddressDeny=any, so every other "
        "address gets no answer at all. Node exporter's own web config has no allow-list.",
        allow_check,
    ),
    Setting(
        "metrics_interval_s",
        30,
        "Seconds between two runs of the textfile collector (sparkrig-metrics.timer). Prometheus "
        "reads the file as it was last written: scrape no faster than this.",
        int_range(5, 3600, "seconds"),
    ),
)

declare(__name__, SETTINGS)

# The deploy's data_defaults: its own settings, python_venv_path (the venv whose torch and
# vLLM versions the collector reports) and updates' boot history (how many boots it counts).
_BOOTS = ("updates_boot_history", "updates_boot_count")
DEFAULTS = defaults(
    (
        *SETTINGS,
        *(s for s in stack_locks.SETTINGS if s.key == "python_venv_path"),
        *(s for s in updates_settings.SETTINGS if s.key in _BOOTS),
    )
)
