"""The metrics concern alone, for tests that change only it (quicker than deploy.py;
config.py still validates every setting before any host is contacted)."""

from sparkrig.operations.metrics import metrics

metrics()
