"""
Serving: model endpoints the fleet keeps alive, off unless a host lists models in
``serving_models``. docs/serving.md says what is decided where and what is proven where.

- One unit per model, ``spark-serve-NAME.service`` (templates/serving/spark-serve.service.j2):
  the venv's ``vllm serve`` (python_venv_path), as the venv's owner (never root), from ``/``,
  with the CUDA env file and ``HF_HUB_OFFLINE=1``; restarted on failure with back-off, a start
  timeout sized for cold starts, a stop that lets requests in flight finish.
- Before each start the memory guard (``sparkrig-serving guard``, run by systemd as root): the
  page cache dropped and memory compacted (``serving_drop_caches``), then spark-preflight with
  the model's own requirement; a refused start says why in the journal and as a metric.
- The unit counts as started once one completion of one token came back
  (``sparkrig-serving ready``), not when the port opens.
- ``sparkrig-serving-probe.timer`` runs the forward-progress probe: requests running while vLLM's
  generated-token counter stays still for ``serving_stall_s``, or ``/health`` failing
  ``serving_health_failures`` times in a row: the unit is restarted, the reason in the journal,
  counted in node exporter's textfile directory (sparkrig_serving.prom).
- Loopback by default; another address only with an allow-list (systemd's IP filter) and an
  API key made on the host (root's, 0600), handed to the unit alone by systemd's credentials.
- ``spark-jobs drain`` stops the endpoints (gracefully, bounded), and they stay stopped while
  the host is drained, also across a reboot; ``spark-jobs undrain`` starts them.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "serving"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "serving")
