"""What serving needs and serving alone, for its lab test (quicker than deploy.py; config.py
still validates every setting before any host is contacted): earlyoom (spark-preflight checks
it), spark-preflight and spark-drop-caches (the memory guard runs them), the endpoints."""

from sparkrig.operations.jobs import jobs
from sparkrig.operations.serving import serving
from sparkrig.operations.watchdog import watchdog

watchdog()
jobs()
serving()
