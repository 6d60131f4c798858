"""
systemd units that one concern makes and another names: the watchdog's service (spark-preflight
checks it) and the slice every job runs in (source builds run there too).
"""

WATCHDOG_SERVICE = "earlyoom.service"  # operations/watchdog.py installs and configures it
TRAINING_SLICE = "training.slice"  # operations/jobs.py writes it; spark-run and the builds use it
