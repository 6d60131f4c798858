"""spark-preflight's fragmentation check: the real script, run by sh against a fake /proc holding
this development machine's recorded /proc/buddyinfo (tests/unit/operations/data/memory), with a
stand-in /proc/sys/vm/compact_memory that a "compaction" answers by freeing large blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkrig import rendering
from tests.unit.operations.test_jobs import _fake_system, _preflight

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
