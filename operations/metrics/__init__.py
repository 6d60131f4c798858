"""
Metrics on every host: Debian's prometheus-node-exporter, and sparkrig's textfile collector
fed by a timer, for a fleet's Prometheus to graph and alert on between compliance runs.

- Node exporter listens on ``metrics_listen`` (the loopback by default). Its unit gets a
  drop-in: the listen address, the textfile directory, and systemd's IP filter
  (``IPAddressDeny=any``, ``IPAddressAllow=`` the host itself and ``metrics_allow``), so a
  scraper not allowed gets no answer. Node exporter's web config has no allow-list.
- ``sparkrig-metrics`` (templates/metrics/sparkrig-metrics.sh.j2), run as root by
  ``sparkrig-metrics.timer`` every ``metrics_interval_s``, writes ``sparkrig.prom``
  atomically into node exporter's textfile directory: unified memory as the box sees it
  (MemAvailable, page cache, what CUDA processes hold), the GPU's temperature, power, SM
  clock, utilization and throttle reasons, earlyoom's kills since boot, spark-jobs' jobs by
  state, a pending reboot, the last compliance outcome per concern (when a results file is
  on the host), and the versions as ``sparkrig_versions_info``. Every program it runs is
  under timeout; it runs no user's program (nvidia-smi only when root's alone; the venv's
  torch and vLLM versions are read from their METADATA through the one bounded reader, as
  the venv's owner). docs/metrics.md lists the metrics.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "metrics"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "metrics")
