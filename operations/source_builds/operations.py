"""Source builds: the build on its builder, as a detached systemd unit (its script, its
environment, the unit's limits), the wait for it and the end of an attempt."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from io import BytesIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import atomic, messages, rendering, user_files
from sparkrig.packages import DEFAULT_TIMEOUT_S, install_command
from sparkrig.prefix import ARCHIVE, installed_dir, installed_stamp, need_variable
from sparkrig.units import TRAINING_SLICE
from sparkrig.venv import UV, UV_ENV
from sparkrig.wheelhouse import WHEELHOUSE

from .catalogue import (
    build_dir,
    env_file,
    public_inputs,
    stamp_inputs,
    unit_name,
    wheelhouse_dir,
    work_dir,
)
from .facts import RESULT_LIMIT
from .settings import COMMIT

TAIL_LINES = 30
PROGRESS_EVERY_S = 60
# The build's unit: nice, first to die under memory pressure, never in swap, and stopped
# (a failed build) when it runs longer than any real build should, so no deploy waits forever.
UNIT_NICE = 10
UNIT_RUNTIME_MAX = "6h"


def render_build_script(name: str, key: str, data: Mapping[str, Any]) -> str:
    spec = data["source_builds"][name]
    inputs = stamp_inputs(name, data)
    common = dict(
        name=name,
        key=key,
        unit=unit_name(name, key),
        url=spec["url"],
        ref=spec["ref"],
        commit_ref=bool(COMMIT.fullmatch(spec["ref"])),
        submodules=spec["submodules"],
        subdirectory=spec["subdirectory"],
        steps=spec["steps"],
        build_dir=work_dir(name, key),
        wheelhouse_dir=wheelhouse_dir(name, key),
        stamp=json.dumps({**public_inputs(inputs), "url": spec["url"], "key": key}, sort_keys=True),
    )
    if spec["kind"] == "prefix":
        return rendering.render(
            "source_builds/build-prefix.sh.j2",
            **common,
            install_dir=installed_dir(name, key),
            archive=ARCHIVE,
            needs=[
                (need_variable(need), installed_dir(need, need_key), installed_stamp(need, need_key))
                for need, need_key in inputs["needs"].items()
            ],
        )
    venv = data["python_venv_path"]
    return rendering.render(
        "source_builds/build.sh.j2",
        **common,
        build_requirements=["pip", "setuptools", "wheel", *spec["build_requirements"]],
        venv=venv,
        venv_python=posixpath.join(venv, "bin", "python"),
        uv=UV,
        index_url=data["python_index_url"],
    )


def report(message: str) -> None:
    """A build's state, shown without -v (pyinfra shows a noop's message only with -v)."""
    logger.warning(f"{host.print_prefix}{message}")


# The end of an attempt, and the wait for it: build-wait runs build-result once the unit stops.
_RESULT_ARGS = dict(result=user_files.user_read('"$d/work/result"', RESULT_LIMIT), tail_lines=TAIL_LINES)
RESULT_SCRIPT = rendering.script("source_builds/build-result.sh.j2", **_RESULT_ARGS)
WAIT_SCRIPT = rendering.script("source_builds/build-wait.sh.j2", **_RESULT_ARGS, progress_every_s=PROGRESS_EVERY_S)


def _attempt_command(script: str, label: str, name: str, key: str) -> StringCommand:
    """``script`` run on the attempt at build ``name`` of ``key``: :data:`RESULT_SCRIPT` succeeds
    if the wheel is there, else prints the journal's tail, clears the attempt and fails;
    :data:`WAIT_SCRIPT` first waits while the unit runs (a progress line every minute)."""
    return StringCommand(
        "sh -c",
        QuoteString(script),
        label,
        QuoteString(unit_name(name, key)),
        QuoteString(build_dir(name, key)),
        QuoteString(wheelhouse_dir(name, key)),
        QuoteString(name),
    )


def _env_text(env: Mapping[str, str]) -> str:
    """A systemd EnvironmentFile of ``env`` (values hold no quotes or newlines: settings)."""
    return "".join(f"{k}='{v}'\n" for k, v in env.items())


@operation()
def build(
    build_name: str,
    key: str,
    script: str,
    owner: str,
    env: Mapping[str, str],
    packages: Sequence[str],
    memory_max: str | None,
    oom_score_adj: int,
    cuda_env_file: str,
    launch: bool = True,
    wait: bool = True,
    dpkg_lock_timeout_s: int = DEFAULT_TIMEOUT_S,
):
    """
    Start source build ``name`` as a detached systemd unit, and wait for it.

    + build_name: the build's name
    + key: its stamp key (names the unit and its directories)
    + script: the build script, written to the build directory (validated with ``sh -n``)
    + owner: the user the build runs as (the venv's owner)
    + env: the build's environment (on top of ``cuda_env_file``)
    + packages: apt packages the build needs, installed before it starts
    + memory_max: the unit's MemoryMax, or None (training.slice caps it anyway)
    + oom_score_adj: the unit's OOMScoreAdjust (killed before the rest of the host)
    + cuda_env_file: the CUDA env file the unit reads (ignored where missing)
    + launch: start the unit (False: it runs already)
    + wait: wait until the unit ends; fail with the journal's tail if no wheel came of it
    + dpkg_lock_timeout_s: how long the packages' install waits for the dpkg lock

    The unit, ``sparkrig-build-NAME-KEY.service``, runs under ``training.slice`` and is
    started only when it is not active, so a second deploy never starts it twice.
    """
    name = build_name
    unit, d, w = unit_name(name, key), build_dir(name, key), wheelhouse_dir(name, key)
    q_d, q_work, q_env = QuoteString(d), QuoteString(work_dir(name, key)), QuoteString(env_file(name, key))
    if launch:
        messages.detail(f"source build {name}: starting {unit}")
        script_path = f"{d}/build.sh"
        temp = atomic.temp_path(script_path)
        if packages:
            # As every concern installs: a bounded wait for the dpkg lock, then the install.
            yield install_command(packages, dpkg_lock_timeout_s)
        # The build directory is root's (an earlier layout gave it to the owner: taken back,
        # and the names root writes cleared first); the owner gets work/ and the wheelhouse
        # entry's parent, each made in a root-owned directory. Nothing of root's goes through
        # a path the owner can change.
        yield StringCommand(
            "install -d -m 755 -o root -g root",
            QuoteString(posixpath.dirname(d)),
            q_d,
            QuoteString(WHEELHOUSE),
            "&& rm -rf",
            QuoteString(temp),
            QuoteString(f"{d}/attempt"),
            q_env,
            QuoteString(f"{d}/env.new"),
            "&& install -d -m 755 -o",
            QuoteString(owner),
            "-g",
            f'"$(id -gn {rendering.quote_literal(owner)})"',
            q_work,
            QuoteString(posixpath.dirname(w)),
            "&& install -m 600 -o root -g root /dev/null",
            QuoteString(f"{d}/env.new"),
        )
        yield atomic.Upload(BytesIO(script.encode()), temp)
        yield atomic.Upload(BytesIO(_env_text(env).encode()), f"{d}/env.new")
        properties = [
            f"Nice={UNIT_NICE}",
            f"OOMScoreAdjust={oom_score_adj}",
            "MemorySwapMax=0",
            f"EnvironmentFile=-{cuda_env_file}",
            f"EnvironmentFile={env_file(name, key)}",
            f"WorkingDirectory={work_dir(name, key)}",
            f"RuntimeMaxSec={UNIT_RUNTIME_MAX}",
        ]
        if memory_max:
            properties.append(f"MemoryMax={memory_max}")
        setenv = dict(v.split("=", 1) for v in UV_ENV)
        yield StringCommand(
            "sh -n",
            QuoteString(temp),
            "&& chmod 644",
            QuoteString(temp),
            "&& mv -f",
            QuoteString(temp),
            QuoteString(script_path),
            "&& chmod 600",
            QuoteString(f"{d}/env.new"),
            "&& mv -f",
            QuoteString(f"{d}/env.new"),
            q_env,
            "&& if systemctl is-active --quiet",
            QuoteString(unit),
            "; then echo",
            QuoteString(f"sparkrig: {unit} runs already"),
            "; else",
            "touch",
            QuoteString(f"{d}/attempt"),
            "&& rm -f",
            QuoteString(f"{work_dir(name, key)}/result"),
            "&& { systemctl reset-failed",
            QuoteString(unit),
            "2>/dev/null; true; }",
            "&& systemd-run --quiet --collect --unit",
            QuoteString(unit),
            "--description",
            QuoteString(f"sparkrig source build {name}"),
            "--slice",
            QuoteString(TRAINING_SLICE),
            "--uid",
            QuoteString(owner),
            *[arg for p in properties for arg in ("--property", QuoteString(p))],
            *[arg for k, v in setenv.items() for arg in ("--setenv", QuoteString(f"{k}={v}"))],
            "/bin/sh",
            QuoteString(script_path),
            "; fi",
        )
    if wait:
        yield _attempt_command(WAIT_SCRIPT, "build-wait", name, key)


@operation()
def report_failure(build_name: str, key: str):
    """
    Fail the host with the journal's tail of a failed source build, and clear the
    attempt so that the next deploy tries again.

    + build_name: the build's name
    + key: its stamp key
    """
    name = build_name
    yield _attempt_command(RESULT_SCRIPT, "build-result", name, key)
