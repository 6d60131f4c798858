"""
systemd units that one concern makes and another names: the watchdog's service (spark-preflight
checks it), the slice every job runs in (source builds run there too), and the detached jobs
spark-run starts (spark-container --detach hands its launch to spark-run); and paths alike.
"""

WATCHDOG_SERVICE = "earlyoom.service"  # operations/watchdog/ installs and configures it
TRAINING_SLICE = "training.slice"  # operations/jobs/ writes it; spark-run and the builds use it
JOB_UNIT_PREFIX = "spark-job-"  # spark-run --detach NAME starts spark-job-NAME.service (operations/jobs/)
SPARK_RUN = "/usr/local/bin/spark-run"  # operations/jobs/ installs it; spark-container --detach runs it
JOB_RECORDS = (
    "/var/lib/sparkrig/jobs"  # spark-jobs records how detached jobs ended (operations/jobs/); metrics counts them
)
# spark-jobs drain writes it (operations/jobs/); spark-run and spark-container start no job while it exists.
JOB_DRAIN = "/var/lib/sparkrig/drain"
# operations/serving/ starts one spark-serve-NAME.service per served model; spark-jobs drain stops them.
SERVE_UNIT_PREFIX = "spark-serve-"
# node exporter's textfile directory (operations/metrics/ points it there, root's alone); the
# serving probe writes its metrics into it too.
METRICS_TEXTFILE_DIR = "/var/lib/sparkrig/metrics"
