"""Job wrappers (training runs' commands and the slice capping their memory): the settings,
declared once, and their checks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkrig.operations.watchdog import settings as watchdog_settings
from sparkrig.settings import (
    USER_NAME,
    Setting,
    absolute_path,
    boolean,
    declare,
    defaults,
    env_mapping,
    int_range,
    memory_max_check,
)

_AGE = re.compile(r"[1-9][0-9]{0,3}[hdw]")


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
        "jobs_drop_caches",
        False,
        "spark-run drops the page cache (spark-drop-caches) before every job, as if given "
        "--drop-caches (--no-drop-caches skips it once). NVIDIA's playbooks flush it between runs;"
        " vLLM's start-up on unified memory can fail without (vllm issue 35313).",
        boolean,
    ),
    Setting(
        "jobs_env",
        {},
        "Variables set for every spark-run job (foreground or detached) and spark-container, "
        "unless the caller's environment sets them, e.g. "
        '{"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} (reported to leave several GiB '
        "more memory available on Sparks). Names are variable names; values are literal strings "
        "without single quotes or newlines.",
        env_mapping,
    ),
    Setting(
        "jobs_records_max_age",
        "30d",
        "How long spark-jobs keeps the record of an ended detached job (how it ended, listed by "
        "spark-jobs), counted from its end: systemd-tmpfiles' daily clean removes older ones "
        '(/etc/tmpfiles.d/sparkrig-jobs.conf). Hours, days or weeks: "12h", "30d", "8w". "": '
        "records stay until spark-jobs forget.",
        lambda value, _data: None
        if value == "" or (isinstance(value, str) and _AGE.fullmatch(value))
        else ('hours, days or weeks such as "12h", "30d" or "8w" (1 to 9999), or "" to keep records'),
    ),
    Setting(
        "jobs_model_cache",
        "",
        'A model cache shared by the users of jobs_model_cache_group, e.g. "/srv/models/huggingface":'
        " the directory is made root's and the group's, mode 2775 (setgid: what members write "
        "there stays the group's), HF_HOME names it in the CUDA env file, and spark-container "
        "mounts it in place of ngc_hf_cache. Members need umask 002 for others to write into what"
        ' they downloaded. "": none (each user keeps ~/.cache/huggingface).',
        lambda value, data: None if value == "" else _cache_path_check(value, data),
    ),
    Setting(
        "jobs_model_cache_group",
        "sparkrig-models",
        "The group that owns jobs_model_cache (made a system group when missing).",
        lambda value, _data: None
        if isinstance(value, str) and USER_NAME.fullmatch(value)
        else ("a group name ([a-z_][a-z0-9_-]*, 32 characters at most)"),
    ),
    Setting(
        "jobs_model_cache_users",
        [],
        "Users added to jobs_model_cache_group (users in it already stay; none is removed).",
        lambda value, _data: None
        if isinstance(value, (list, tuple)) and all(isinstance(u, str) and USER_NAME.fullmatch(u) for u in value)
        else "a list of user names",
    ),
    Setting(
        "jobs_preflight_min_available_kib",
        64 * 1024 * 1024,
        "spark-preflight fails its memory check below this much MemAvailable, in KiB (64 GiB: half"
        " of a Spark; an idle one has about 115 GiB). spark-preflight --min-available-kib "
        "overrides it for one run.",
        int_range(0, 1 << 40, "KiB; 67108864 is 64 GiB"),
    ),
    Setting(
        "jobs_preflight_min_large_blocks",
        0,
        "spark-preflight fails its fragmentation check with fewer free memory blocks than this of "
        "order 9 and up (/proc/buddyinfo: 2 MiB and larger with 4 KiB pages, every zone), where a "
        "large allocation (a model's weights, NCCL's buffers) fails after hours of serving. 0: no "
        "such check (and no line for it). spark-run --detach refuses a job, and a served model's memory "
        "guard a start, on the same check. spark-preflight --min-large-blocks overrides it for one run, "
        "and --compact (root) compacts memory before refusing.",
        int_range(0, 1 << 30, "blocks"),
    ),
    Setting(
        "jobs_preflight_compact",
        True,
        "Where jobs_preflight_min_large_blocks is above 0, spark-run --detach and each served "
        "model's memory guard (serving) run spark-preflight with --compact: below the minimum, "
        "memory is compacted (/proc/sys/vm/compact_memory) and counted again before the start is "
        "refused. False: refused at once.",
        boolean,
    ),
)


declare(__name__, SETTINGS)

# The deploy's data_defaults: its own settings, and watchdog_enabled (spark-preflight's
# watchdog check).
DEFAULTS = defaults((*SETTINGS, *watchdog_settings.SETTINGS))


def _cache_path_check(value: Any, data: Mapping[str, Any]) -> str | None:
    # One word wherever it goes: the env file, docker's --volume (':'), a unit's arguments.
    ok = isinstance(value, str) and _CACHE_PATH.fullmatch(value) and absolute_path(value, data) is None
    return (
        None
        if ok and value.rstrip("/") not in SYSTEM_DIRS
        else (
            "a normalised absolute path of letters, digits and ._-/ (no spaces or ':'), "
            "not / or a system directory such as /usr or /home"
        )
    )


_CACHE_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+")


SYSTEM_DIRS = {
    "",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/usr/local",
    "/var/lib",
}
