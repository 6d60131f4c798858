"""Metrics and the fleet's Prometheus alone, for lab tests that watch an alert fire (quicker
than deploy.py; config.py still validates every setting before any host is contacted)."""

from sparkrig.operations.metrics import metrics
from sparkrig.operations.prometheus import prometheus

metrics()
prometheus()
