"""
Job wrappers: commands in /usr/local/bin that start, check for and clean up after
training runs, and the slice that caps the memory of every job.

- ``spark-run [--memory-max SIZE] -- CMD…`` runs CMD as the caller, with the
  caller's environment, in a transient scope below ``training.slice``
  (``MemoryMax=jobs_memory_max``, ``MemorySwapMax=0``) and with
  ``oom_score_adj`` ``jobs_oom_score_adj`` (``choom``), so the job dies first.
  Only root can create the scope: for another user spark-run runs ``busctl``
  through sudo, asking systemd to move spark-run's own process into the scope.
- ``spark-preflight``: memory, swap, watchdog, stray vLLM/Ray processes, GPU; one
  line per check, the failed checks' codes summed into the exit status.
- ``spark-drop-caches``: ``sync`` and drop the page cache (root only).

``/etc/systemd/system/training.slice`` caps all jobs together; systemd re-reads
it only when it changed. On GB10 the caps count CPU-side memory and page cache,
not CUDA allocations: the watchdog (operations/watchdog.py) covers those.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from sparkrig import atomic, reading
from sparkrig.settings import ALL_DEFAULTS, Setting, int_range, memory_max_check

from . import watchdog

SLICE = "training.slice"
SLICE_FILE = f"/etc/systemd/system/{SLICE}"
BIN_DIR = "/usr/local/bin"
SLICE_DESCRIPTION = "Training jobs started by spark-run"
COMMAND_NAMES = ("spark-run", "spark-preflight", "spark-drop-caches")
PATHS = {name: f"{BIN_DIR}/{name}" for name in COMMAND_NAMES}
# Everything the concern decides from, in the host's one reading.
STATE = reading.part(atomic.HostState, paths=(SLICE_FILE, *PATHS.values()))


@reading.planner
def reads(_settings):
    return [STATE]



SETTINGS = (
    Setting(
        "jobs_memory_max",
        "85%",
        "MemoryMax of /etc/systemd/system/training.slice (all spark-run jobs together) and of each"
        " spark-run job (spark-run --memory-max overrides it per job): bytes with an optional K, "
        'M, G or T suffix (base 1024) such as "100G", a whole percentage of physical memory such '
        'as "85%", or "infinity". 85% is about 101 GiB on a 128 GB Spark, close to the usual 100G,'
        " and adapts to other boxes. On GB10 it caps CPU-side memory and page cache only, not CUDA"
        " allocations.",
        memory_max_check,
    ),
    Setting(
        "jobs_oom_score_adj",
        500,
        "oom_score_adj of every spark-run job (choom -n, 1 to 1000): the kernel's OOM killer and "
        "earlyoom pick the job before anything else.",
        int_range(1, 1000, "oom_score_adj"),
    ),
    Setting(
        "jobs_preflight_min_available_kib",
        64 * 1024 * 1024,
        "spark-preflight fails its memory check below this much MemAvailable, in KiB (64 GiB: half"
        " of a Spark; an idle one has about 115 GiB). spark-preflight --min-available-kib "
        "overrides it for one run.",
        int_range(0, 1 << 40, "KiB; 67108864 is 64 GiB"),
    ),
)

SLICE_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Slice"],
    {
        "Description": SLICE_DESCRIPTION,
        "MemoryMax": r"infinity|[0-9]+[KMGT]?|[0-9]+%",
        "MemorySwapMax": "0",
    },
)


def render_slice(memory_max: str) -> str:
    return atomic.render("jobs/training.slice.j2", description=SLICE_DESCRIPTION, memory_max=memory_max)


def render_commands(
    memory_max: str, oom_score_adj: int, min_available_kib: int, watchdog_enabled: bool
) -> dict[str, str]:
    """Each command's name and script."""
    return {
        "spark-run": atomic.render(
            "jobs/spark-run.sh.j2", slice=SLICE, memory_max=memory_max, oom_score_adj=oom_score_adj
        ),
        "spark-preflight": atomic.render(
            "jobs/spark-preflight.sh.j2",
            min_available_kib=min_available_kib,
            watchdog_service=watchdog.SERVICE if watchdog_enabled else "",
        ),
        "spark-drop-caches": atomic.render("jobs/spark-drop-caches.sh.j2"),
    }


@deploy("Job wrappers", data_defaults=ALL_DEFAULTS)
def jobs():
    """
    Write training.slice and install spark-run, spark-preflight and spark-drop-caches.

    Settings: ``jobs_memory_max``, ``jobs_oom_score_adj``, ``jobs_preflight_min_available_kib``,
    and ``watchdog_enabled`` (spark-preflight skips its watchdog check when it is False);
    see docs/settings.md.
    """
    commands = render_commands(
        host.data.jobs_memory_max,
        host.data.jobs_oom_score_adj,
        host.data.jobs_preflight_min_available_kib,
        host.data.watchdog_enabled,
    )
    slice_text = render_slice(host.data.jobs_memory_max)
    paths = PATHS
    state = reading.value(STATE)["files"]
    atomic.unit_file(
        name=f"Memory cap of every job ({SLICE_FILE})",
        dest=SLICE_FILE,
        content=slice_text,
        validate=SLICE_VALIDATOR,
        reload_name=f"Reload systemd: {SLICE} changed",
        state=state.get(SLICE_FILE),
    )
    # host.loop: each command keeps its place (and its row in pyinfra's table) on every host.
    for name, script in host.loop(commands.items()):
        if atomic.up_to_date(state.get(paths[name]), script, mode=0o755):
            continue
        atomic.file(
            name=f"{name} command ({paths[name]})",
            dest=paths[name],
            current=state.get(paths[name]),
            content=script,
            mode=0o755,
            validate=("sh", "-n"),
        )
