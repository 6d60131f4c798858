"""
Job wrappers: commands in /usr/local/bin that start, check for and clean up after
training runs, and the slice that caps the memory of every job.

- ``spark-run [--memory-max SIZE] -- CMD…`` runs CMD as the caller, with the
  caller's environment, in a transient scope below ``training.slice``
  (``MemoryMax=jobs_memory_max``, ``MemorySwapMax=0``) and with
  ``oom_score_adj`` ``jobs_oom_score_adj`` (``choom``), so the job dies first.
  Only root can create the scope: for another user spark-run runs ``busctl``
  through sudo, asking systemd to move spark-run's own process into the scope.
  ``--detach NAME`` runs it instead as the transient service
  ``spark-job-NAME.service`` (the same caps, the caller's user, environment and
  directory, output in the journal), which outlives the SSH session; its
  ``ExecStopPost`` (``spark-jobs record``, as root) keeps how it ended.
  ``--drop-caches`` (the default with ``jobs_drop_caches``) runs
  spark-drop-caches first; ``jobs_env`` is set for every job.
- ``spark-jobs``: the detached jobs (state, start, memory now and peak, exit
  status), their logs; stops a job of the caller's.
- ``spark-preflight``: memory, swap, watchdog, stray vLLM/Ray processes, GPU; one
  line per check, the failed checks' codes summed into the exit status.
- ``spark-drop-caches``: ``sync`` and drop the page cache (root only).

``/etc/systemd/system/training.slice`` caps all jobs together; systemd re-reads
it only when it changed. On GB10 the caps count CPU-side memory and page cache,
not CUDA allocations: the watchdog (operations/watchdog.py) covers those.

Records of ended detached jobs older than ``jobs_records_max_age`` are removed by
systemd-tmpfiles' daily clean (``/etc/tmpfiles.d/sparkrig-jobs.conf``).

``jobs_model_cache`` (off by default) is a model cache shared by a group: the
directory, root's and the group's (setgid, 2775), the group and its members.
cuda_env exports it as ``HF_HOME``; spark-container mounts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy
from pyinfra.operations import files, server

from sparkrig import atomic, reading
from sparkrig.settings import (
    ALL_DEFAULTS,
)
from sparkrig.units import JOB_UNIT_PREFIX, SPARK_RUN, TRAINING_SLICE, WATCHDOG_SERVICE

from .settings import _AGE, _CACHE_PATH, SETTINGS, SYSTEM_DIRS, _cache_path_check  # noqa: F401 (re-exported)

SLICE = TRAINING_SLICE
SLICE_FILE = f"/etc/systemd/system/{SLICE}"
BIN_DIR = "/usr/local/bin"
SLICE_DESCRIPTION = "Training jobs started by spark-run"
COMMAND_NAMES = ("spark-run", "spark-jobs", "spark-preflight", "spark-drop-caches")
PATHS = {name: f"{BIN_DIR}/{name}" for name in COMMAND_NAMES}
# spark-run --detach NAME starts UNIT_PREFIX + NAME + ".service"; spark-jobs records how it ended.
UNIT_PREFIX = JOB_UNIT_PREFIX
RECORDS = "/var/lib/sparkrig/jobs"
RECORDS_CLEAN = "/etc/tmpfiles.d/sparkrig-jobs.conf"
# Everything the concern decides from, in the host's one reading.
STATE = reading.part(atomic.HostState, paths=(SLICE_FILE, *PATHS.values(), RECORDS_CLEAN))








class ModelCache(FactBase):
    """
    Returns the shared model cache directory (mode, owner, group; ``"link"`` when it is a
    symbolic link, ``None`` when missing) and its group (``None`` when missing).

    .. code:: python

        {"directory": {"mode": 0o2775, "user": "root", "group": "sparkrig-models"},
         "group": {"gid": 998, "members": ["spark"]}}
    """

    def command(self, path: str, group: str) -> StringCommand:
        q, g = QuoteString(path), QuoteString(group)
        return StringCommand(
            "if [ -L", q, "]; then echo link; elif [ -d", q, "]; then echo dir $(stat -c '%a %U %G'", q, ");",
            "else echo nodir; fi; echo group $(getent group", g, "|| true)",
        )

    @atomic.parses
    def process(self, output: list[str]) -> dict:
        found: dict = {"directory": None, "group": None}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "link":
                found["directory"] = "link"
            elif kind == "dir":
                mode, user, group = rest.split(" ")
                found["directory"] = {"mode": int(mode, 8), "user": user, "group": group}
            elif kind == "group" and rest:
                _name, _x, gid, members = rest.split(":")
                found["group"] = {"gid": int(gid), "members": [m for m in members.split(",") if m]}
            elif kind not in ("nodir", "group"):
                raise ValueError(f"unexpected line {line!r}")
        return found

    @staticmethod
    def default() -> dict:
        return {"directory": None, "group": None}


def cache_part(settings: Mapping[str, Any]) -> reading.Part:
    return reading.part(ModelCache, path=settings["jobs_model_cache"], group=settings["jobs_model_cache_group"])


@reading.planner
def reads(settings):
    return [STATE, *([cache_part(settings)] if settings.get("jobs_model_cache") else [])]


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


# A file of sparkrig's single line, nothing else (comments aside).
RECORDS_CLEAN_VALIDATOR = (
    "sh", "-c", '! grep -Evx "$0" "$1"', rf"#.*|d {RECORDS} 0755 root root mM:[1-9][0-9]*[hdw]",
)


def render_records_clean(max_age: str) -> str:
    """The tmpfiles.d line that ages out job records. ``mM:`` counts from a record's (and a
    user directory's) last change only: spark-jobs reading a record moves its atime, and
    root's writes move ctime, neither of which says when the job ended."""
    return atomic.render("jobs/sparkrig-jobs.tmpfiles.j2", records=RECORDS, max_age=max_age)


def render_commands(
    memory_max: str,
    oom_score_adj: int,
    min_available_kib: int,
    watchdog_enabled: bool,
    drop_caches: bool = False,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Each command's name and script."""
    return {
        "spark-run": atomic.render(
            "jobs/spark-run.sh.j2", slice=SLICE, memory_max=memory_max, oom_score_adj=oom_score_adj,
            drop_caches="yes" if drop_caches else "no", env=sorted((env or {}).items()),
            unit_prefix=UNIT_PREFIX, jobs_command=PATHS["spark-jobs"], self_path=SPARK_RUN,
        ),
        "spark-jobs": atomic.render("jobs/spark-jobs.sh.j2", unit_prefix=UNIT_PREFIX, records=RECORDS),
        "spark-preflight": atomic.render(
            "jobs/spark-preflight.sh.j2",
            min_available_kib=min_available_kib,
            watchdog_service=WATCHDOG_SERVICE if watchdog_enabled else "",
        ),
        "spark-drop-caches": atomic.render("jobs/spark-drop-caches.sh.j2"),
    }


@deploy("Job wrappers", data_defaults=ALL_DEFAULTS)
def jobs():
    """
    Write training.slice, install spark-run, spark-jobs, spark-preflight and
    spark-drop-caches, and make the shared model cache.

    Settings: ``jobs_*``, and ``watchdog_enabled`` (spark-preflight skips its watchdog
    check when it is False); see docs/settings.md.
    """
    commands = render_commands(
        host.data.jobs_memory_max,
        host.data.jobs_oom_score_adj,
        host.data.jobs_preflight_min_available_kib,
        host.data.watchdog_enabled,
        host.data.jobs_drop_caches,
        host.data.jobs_env,
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
    if host.data.jobs_records_max_age:
        clean = render_records_clean(host.data.jobs_records_max_age)
        if not atomic.up_to_date(state.get(RECORDS_CLEAN), clean):
            atomic.file(
                name=f"Job records older than jobs_records_max_age are removed ({RECORDS_CLEAN})",
                dest=RECORDS_CLEAN, current=state.get(RECORDS_CLEAN), content=clean,
                validate=RECORDS_CLEAN_VALIDATOR,
            )
    elif state.get(RECORDS_CLEAN):
        files.file(name=f"Job records are kept ({RECORDS_CLEAN})", path=RECORDS_CLEAN, present=False)
    if host.data.jobs_model_cache:
        model_cache(host.data.jobs_model_cache, host.data.jobs_model_cache_group,
                    host.data.jobs_model_cache_users)


def model_cache(path: str, group: str, users: list[str]) -> None:
    """The shared model cache: its group with its members, the directory root's and the group's."""
    found = reading.get(ModelCache, path=path, group=group)
    if found["directory"] == "link":
        atomic.refused(name="Model cache directory (jobs_model_cache)",
                       message=f"{path} is a symbolic link: root would follow it (make it a directory)")
        return
    if found["group"] is None:
        server.shell(name="Model cache group (jobs_model_cache_group)",
                     commands=[StringCommand("groupadd", "--system", QuoteString(group))])
    members = (found["group"] or {}).get("members", [])
    joining = [user for user in users if user not in members]
    if joining:
        atomic.detail(f"{', '.join(joining)} join {group}")
        server.shell(name="Model cache group members (jobs_model_cache_users)", commands=[
            StringCommand("usermod", "--append", "--groups", QuoteString(group), QuoteString(user))
            for user in joining
        ])
    if found["directory"] != {"mode": 0o2775, "user": "root", "group": group}:
        files.directory(name="Model cache directory (jobs_model_cache, root and the group's, 2775)",
                        path=path, user="root", group=group, mode="2775")
