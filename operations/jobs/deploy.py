"""Job wrappers: the host's one reading and the deploy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, deploy
from pyinfra.operations import files, server

from sparkrig import atomic, host_settings, messages, reading

from .facts import ModelCache
from .operations import (
    PATHS,
    RECORDS_CLEAN,
    RECORDS_CLEAN_VALIDATOR,
    SLICE,
    SLICE_FILE,
    SLICE_VALIDATOR,
    render_commands,
    render_records_clean,
    render_slice,
)
from .settings import DEFAULTS

# Everything the concern decides from, in the host's one reading.
STATE = reading.part(atomic.HostState, paths=(SLICE_FILE, *PATHS.values(), RECORDS_CLEAN))


def cache_part(settings: Mapping[str, Any]) -> reading.Part:
    return reading.part(ModelCache, path=settings["jobs_model_cache"], group=settings["jobs_model_cache_group"])


@reading.planner
def reads(settings):
    return [STATE, *([cache_part(settings)] if settings.get("jobs_model_cache") else [])]


@deploy("Job wrappers", data_defaults=DEFAULTS)
def jobs():
    """
    Write training.slice, install spark-run, spark-jobs, spark-preflight and
    spark-drop-caches, and make the shared model cache.

    Settings: ``jobs_*``, and ``watchdog_enabled`` (spark-preflight skips its watchdog
    check when it is False); see docs/settings.md.
    """
    settings = host_settings.current()
    commands = render_commands(
        settings.jobs_memory_max,
        settings.jobs_oom_score_adj,
        settings.jobs_preflight_min_available_kib,
        settings.watchdog_enabled,
        settings.jobs_drop_caches,
        settings.jobs_env,
        min_large_blocks=settings.jobs_preflight_min_large_blocks,
        compact=settings.jobs_preflight_compact,
    )
    slice_text = render_slice(settings.jobs_memory_max)
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
        atomic.file_if_changed(
            name=f"{name} command ({paths[name]})",
            dest=paths[name],
            current=state.get(paths[name]),
            content=script,
            mode=0o755,
            validate=("sh", "-n"),
        )
    atomic.file_if_changed(
        name=f"Job records older than jobs_records_max_age are removed ({RECORDS_CLEAN})",
        absent=f"Job records are kept ({RECORDS_CLEAN})",
        dest=RECORDS_CLEAN,
        current=state.get(RECORDS_CLEAN),
        content=render_records_clean(settings.jobs_records_max_age) if settings.jobs_records_max_age else None,
        validate=RECORDS_CLEAN_VALIDATOR,
    )
    if settings.jobs_model_cache:
        model_cache(settings.jobs_model_cache, settings.jobs_model_cache_group, settings.jobs_model_cache_users)


def model_cache(path: str, group: str, users: list[str]) -> None:
    """The shared model cache: its group with its members, the directory root's and the group's."""
    found = reading.get(ModelCache, path=path, group=group)
    if found["directory"] == "link":
        messages.refused(
            name="Model cache directory (jobs_model_cache)",
            message=f"{path} is a symbolic link: root would follow it (make it a directory)",
        )
        return
    if found["group"] is None:
        server.shell(
            name="Model cache group (jobs_model_cache_group)",
            commands=[StringCommand("groupadd", "--system", QuoteString(group))],
        )
    members = (found["group"] or {}).get("members", [])
    joining = [user for user in users if user not in members]
    if joining:
        messages.detail(f"{', '.join(joining)} join {group}")
        server.shell(
            name="Model cache group members (jobs_model_cache_users)",
            commands=[
                StringCommand("usermod", "--append", "--groups", QuoteString(group), QuoteString(user))
                for user in joining
            ],
        )
    if found["directory"] != {"mode": 0o2775, "user": "root", "group": group}:
        files.directory(
            name="Model cache directory (jobs_model_cache, root and the group's, 2775)",
            path=path,
            user="root",
            group=group,
            mode="2775",
        )
