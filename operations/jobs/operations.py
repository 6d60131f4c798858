"""Job wrappers: where the commands, the slice and the records' clean-up go, and what they say."""

from __future__ import annotations

from collections.abc import Mapping

from sparkrig import atomic, rendering
from sparkrig.units import (
    JOB_DRAIN,
    JOB_RECORDS,
    JOB_UNIT_PREFIX,
    SERVE_UNIT_PREFIX,
    SPARK_RUN,
    TRAINING_SLICE,
    WATCHDOG_SERVICE,
)

SLICE = TRAINING_SLICE
SLICE_FILE = f"/etc/systemd/system/{SLICE}"
BIN_DIR = "/usr/local/bin"
SLICE_DESCRIPTION = "Training jobs started by spark-run"
# The smallest order of /proc/buddyinfo that spark-preflight counts as a large free block
# (512 pages: 2 MiB with 4 KiB pages), as the metrics' alert does.
LARGE_ORDER = 9

COMMAND_NAMES = ("spark-run", "spark-jobs", "spark-preflight", "spark-drop-caches")
PATHS = {name: f"{BIN_DIR}/{name}" for name in COMMAND_NAMES}
# spark-run --detach NAME starts UNIT_PREFIX + NAME + ".service"; spark-jobs records how it ended.
UNIT_PREFIX = JOB_UNIT_PREFIX
RECORDS = JOB_RECORDS
RECORDS_CLEAN = "/etc/tmpfiles.d/sparkrig-jobs.conf"
# spark-jobs drain writes it (root's, in root's directory, kept across a reboot: a rollout
# undrains the host once it proved it); spark-run refuses new jobs while it exists.
DRAIN = JOB_DRAIN


SLICE_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Slice"],
    {
        "Description": SLICE_DESCRIPTION,
        "MemoryMax": r"infinity|[0-9]+[KMGT]?|[0-9]+%",
        "MemorySwapMax": "0",
    },
)


def render_slice(memory_max: str) -> str:
    return rendering.render("jobs/training.slice.j2", description=SLICE_DESCRIPTION, memory_max=memory_max)


# A file of sparkrig's single line, nothing else (comments aside).
RECORDS_CLEAN_VALIDATOR = (
    "sh",
    "-c",
    rendering.script("jobs/records-clean-check.sh"),
    rf"#.*|d {RECORDS} 0755 root root mM:[1-9][0-9]*[hdw]",
)


def render_records_clean(max_age: str) -> str:
    """The tmpfiles.d line that ages out job records. ``mM:`` counts from a record's (and a
    user directory's) last change only: spark-jobs reading a record moves its atime, and
    root's writes move ctime, neither of which says when the job ended."""
    return rendering.render("jobs/sparkrig-jobs.tmpfiles.j2", records=RECORDS, max_age=max_age)


def render_commands(
    memory_max: str,
    oom_score_adj: int,
    min_available_kib: int,
    watchdog_enabled: bool,
    drop_caches: bool = False,
    env: Mapping[str, str] | None = None,
    drain: str = DRAIN,
    min_large_blocks: int = 0,
    compact: bool = True,
    preflight: str = PATHS["spark-preflight"],
) -> dict[str, str]:
    """Each command's name and script."""
    return {
        "spark-run": rendering.render(
            "jobs/spark-run.sh.j2",
            slice=SLICE,
            memory_max=memory_max,
            oom_score_adj=oom_score_adj,
            drop_caches="yes" if drop_caches else "no",
            env=sorted((env or {}).items()),
            unit_prefix=UNIT_PREFIX,
            jobs_command=PATHS["spark-jobs"],
            self_path=SPARK_RUN,
            drain=drain,
            min_large_blocks=min_large_blocks,
            large_order=LARGE_ORDER,
            compact="yes" if compact else "no",
            preflight=preflight,
        ),
        "spark-jobs": rendering.render(
            "jobs/spark-jobs.sh.j2",
            unit_prefix=UNIT_PREFIX,
            records=RECORDS,
            drain=drain,
            serve_prefix=SERVE_UNIT_PREFIX,
        ),
        "spark-preflight": rendering.render(
            "jobs/spark-preflight.sh.j2",
            min_available_kib=min_available_kib,
            min_large_blocks=min_large_blocks,
            large_order=LARGE_ORDER,
            watchdog_service=WATCHDOG_SERVICE if watchdog_enabled else "",
        ),
        "spark-drop-caches": rendering.render("jobs/spark-drop-caches.sh.j2"),
    }
