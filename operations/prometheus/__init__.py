"""
The fleet's Prometheus (off unless ``prometheus_server`` names a host): Debian's
``prometheus`` on that one host, scraping every host of the inventory at its node exporter
(the metrics concern's ``metrics_listen``), each named by its inventory name, and
evaluating sparkrig's alert rules: memory available below a threshold (a freeze is near),
an earlyoom kill, GPU thermal or power throttling, a failed compliance control, a pending
reboot, a host down (docs/monitoring.md).

- ``/etc/prometheus/sparkrig.rules.yml`` and ``/etc/prometheus/prometheus.yml`` are written
  atomically: the new file is checked by ``promtool check rules`` / ``promtool check config``
  beside the live one and only then renamed over it; Prometheus is reloaded (SIGHUP, samples
  kept) when either changed.
- ``/etc/default/prometheus`` gives it its listen address (loopback by default: Prometheus
  has no authentication) and retention; a change restarts it.
- A fresh install is masked until sparkrig's files are in place: Debian's package would
  otherwise start Prometheus at once on every address with its own configuration.

On every other host it reads and does nothing. Which hosts it scrapes and where is worked
out on the controller from the inventory (:func:`.settings.scrape_targets`); the settings are
checked across the inventory before any host is contacted.
"""

from sparkrig.operations import deploy_on_demand

from .settings import FLEET_CHECKS, SETTINGS

__all__ = ["DOC", "FLEET_CHECKS", "SETTINGS", "prometheus"]

DOC = "docs/monitoring.md"
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "prometheus")
