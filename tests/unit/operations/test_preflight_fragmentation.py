"""spark-preflight's fragmentation check: the real script, run by sh against a fake /proc holding
this development machine's recorded /proc/buddyinfo (tests/unit/operations/data/memory), with a
stand-in /proc/sys/vm/compact_memory that a "compaction" answers by freeing large blocks; and
spark-run --detach, which runs it before a detached job starts (the serving guard's use of it:
tests/unit/operations/test_serving.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sparkrig import rendering
from sparkrig.operations.jobs import operations as jobs_ops
from tests.unit.operations.test_jobs import _fake_system, _preflight, _run

BUDDYINFO = (Path(__file__).parent / "data" / "memory" / "buddyinfo-dev-machine.txt").read_text()  # recorded
FRAGMENTED = (
    "Node 0, zone      DMA      0      0      0      0      0      0      0      0      0      0      0 \n"
    "Node 0, zone   Normal  91017 180819  98792  45937  17142  12987   3611   1443    568      0      0 \n"
)


def _large(text: str) -> int:
    return sum(int(n) for line in text.splitlines() for n in line.split()[4 + 9 :])


def _script(min_large_blocks: int = 0) -> str:
    return rendering.render(
        "jobs/spark-preflight.sh.j2",
        min_available_kib=1,
        min_large_blocks=min_large_blocks,
        large_order=9,
        watchdog_service="earlyoom.service",
    )


def _system(tmp_path, buddyinfo: str) -> dict[str, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = _fake_system(tmp_path)
    (Path(env["SPARK_PREFLIGHT_PROC"]) / "buddyinfo").write_text(buddyinfo)
    return env


def test_no_minimum_no_line_as_before(tmp_path):
    result = _preflight(tmp_path, _system(tmp_path, FRAGMENTED), script=_script(0))
    assert result.returncode == 0 and "fragmentation" not in result.stdout


def test_the_recorded_buddyinfo_passes_a_minimum_it_meets(tmp_path):
    large = _large(BUDDYINFO)
    result = _preflight(tmp_path, _system(tmp_path, BUDDYINFO), "--min-large-blocks", str(large), script=_script())
    assert result.returncode == 0, result.stdout
    assert f"OK fragmentation: {large} free blocks of order 9 and up >= {large}" in result.stdout


def test_a_fragmented_box_fails_with_its_own_code_from_the_setting_or_the_option(tmp_path):
    result = _preflight(tmp_path, _system(tmp_path / "a", FRAGMENTED), script=_script(16))
    assert result.returncode == 128, result.stdout
    assert "FAIL fragmentation: 0 free blocks of order 9 and up < 16: a large allocation may fail" in result.stdout
    again = _preflight(tmp_path, _system(tmp_path / "b", FRAGMENTED), "--min-large-blocks=1", script=_script())
    assert again.returncode == 128


def test_compact_writes_compact_memory_and_checks_again(tmp_path):
    env = _system(tmp_path, FRAGMENTED)
    proc = Path(env["SPARK_PREFLIGHT_PROC"])
    (proc / "sys" / "vm").mkdir(parents=True)
    knob = proc / "sys" / "vm" / "compact_memory"
    knob.write_text("")
    # The stand-in "kernel": the first sleep after the write frees large blocks.
    sleep = Path(env["PATH"]) / "sleep"
    sleep.unlink()
    compacted = tmp_path / "buddyinfo-after"
    compacted.write_text(BUDDYINFO)
    sleep.write_text(f"#!/bin/sh\n[ -s {knob} ] && /bin/cp {compacted} {proc / 'buddyinfo'}\nexit 0\n")
    sleep.chmod(0o755)
    result = _preflight(tmp_path, env, "--min-large-blocks", "16", "--compact", script=_script())
    assert knob.read_text() == "1\n"
    assert result.returncode == 0, result.stdout
    assert (
        f"OK fragmentation: {_large(BUDDYINFO)} free blocks of order 9 and up >= 16 (after compacting memory: 0 before)"
        in (result.stdout)
    )


def test_compact_that_cannot_write_says_so_and_fails(tmp_path):
    env = _system(tmp_path, FRAGMENTED)
    result = _preflight(tmp_path, env, "--min-large-blocks", "16", "--compact", script=_script())
    assert result.returncode == 128
    assert "compact_memory is not writable; run as root" in result.stdout


@pytest.mark.parametrize("bad", ["x", "-1", "12345678901"])
def test_a_bad_minimum_is_a_usage_error(tmp_path, bad):
    result = _preflight(tmp_path, _system(tmp_path, BUDDYINFO), "--min-large-blocks", bad, script=_script())
    assert result.returncode == 2 and "not a number of blocks" in result.stderr


def test_a_forged_buddyinfo_line_counts_nothing(tmp_path):
    forged = FRAGMENTED + "Node 0, zone   Normal  0 0 0 0 0 0 0 0 0 99x 99\n"
    result = _preflight(tmp_path, _system(tmp_path, forged), "--min-large-blocks", "1", script=_script())
    assert result.returncode == 128 and "FAIL fragmentation: 0 free blocks" in result.stdout


# spark-run --detach -------------------------------------------------------------


def _detach(tmp_path, buddyinfo: str, *args: str, min_large_blocks: int = 16, compact: bool = True):
    """spark-run (jobs_preflight_min_large_blocks, jobs_preflight_compact) run by root, as the lab
    and a Spark's owner through sudo do, with the real spark-preflight at its path and a fake
    /proc whose compact_memory is writable (and frees nothing): its result and the knob."""
    if os.getuid() != 0:
        pytest.skip("spark-run asks sudo for spark-preflight --compact unless root runs it")
    env = _system(tmp_path / "box", buddyinfo)
    for tool in ("wc", "sh"):
        (Path(env["PATH"]) / tool).symlink_to(shutil.which(tool))
    knob = Path(env["SPARK_PREFLIGHT_PROC"]) / "sys" / "vm" / "compact_memory"
    knob.parent.mkdir(parents=True)
    knob.write_text("")
    preflight = tmp_path / "spark-preflight"
    preflight.write_text(_script(0))
    preflight.chmod(0o755)
    scripts = jobs_ops.render_commands(
        "85%",
        500,
        1,
        True,
        drain=str(tmp_path / "drain"),
        min_large_blocks=min_large_blocks,
        compact=compact,
        preflight=str(preflight),
    )
    spark_run = tmp_path / "spark-run"
    spark_run.write_text(scripts["spark-run"])
    return _run(["/bin/sh", spark_run, *args, "--", "true"], env=env, cwd="/"), knob.read_text()


@pytest.mark.parametrize("compact", [True, False])
def test_a_detached_job_is_refused_on_fragmented_memory_compacting_first_as_set(tmp_path, compact):
    result, knob = _detach(tmp_path, FRAGMENTED, "--detach", "train", compact=compact)
    after = " (after compacting memory: 0 before)" if compact else ""
    assert (result.returncode, result.stderr) == (
        1,
        f"spark-run: train not started: FAIL fragmentation: 0 free blocks of order 9 and up < 16{after}: "
        "a large allocation may fail (spark-preflight --compact, as root, compacts memory)\n",
    )
    assert knob == ("1\n" if compact else "")


@pytest.mark.parametrize(
    ("buddyinfo", "args", "blocks"),
    [(BUDDYINFO, ("--detach", "train"), 16), (FRAGMENTED, (), 16), (FRAGMENTED, ("--detach", "train"), 0)],
    ids=["enough-large-blocks", "not-detached", "no-minimum"],
)
def test_a_detached_job_with_its_blocks_a_scope_and_no_minimum_go_on(tmp_path, buddyinfo, args, blocks):
    """Past the check, spark-run goes on to systemd (absent here: it says so)."""
    if os.path.isdir("/run/systemd/system"):
        pytest.skip("systemd runs here: spark-run would start a real job")
    result, knob = _detach(tmp_path, buddyinfo, *args, min_large_blocks=blocks)
    assert (result.returncode, result.stderr) == (
        1,
        "spark-run: systemd is not running on this host: no scope can be made\n",
    )
    assert knob == ""
