"""./test runs its two halves side by side and loses neither's failure: the script itself is
run, in a scratch copy, with stand-ins for .ci/install and uv that record what they were asked
and take the time and exit status a test gives them."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A stand-in uv: records its arguments and start time, sleeps and exits as STANDIN_<half> says
# (half: "unit" for -m "not lab", "lab" for -m lab, "build" for the lab's llama-server build,
# "options" otherwise).
UV = """#!/bin/sh
case "$*" in
    *"lab.llamacpp build"*) half=build ;;
    *"not lab"*) half=unit ;;
    *"-m lab"*) half=lab ;;
    *) half=options ;;
esac
echo "$half $(date +%s.%N) $*" >> "$STANDIN_LOG"
echo "output of the $half half"
eval "sleep \\${STANDIN_SLEEP_$half:-0}; exit \\${STANDIN_EXIT_$half:-0}"
"""


def _run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    root = tmp_path / "repo"
    (root / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / "test", root / "test")
    (root / ".ci" / "install").write_text('#!/bin/sh\necho installed >> "$STANDIN_LOG"\n')
    (root / ".ci" / "install").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(UV)
    (bin_dir / "uv").chmod(0o755)
    log = tmp_path / "calls"
    result = subprocess.run(
        [str(root / "test"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STANDIN_LOG": str(log), **env},
    )
    return result, [line.split() for line in log.read_text().splitlines()]


def test_without_options_the_unit_tests_run_beside_the_lab_s_phases(tmp_path):
    started = time.monotonic()
    result, calls = _run(tmp_path, STANDIN_SLEEP_unit="1", STANDIN_SLEEP_lab="1", STANDIN_SLEEP_build="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - started < 1.9  # side by side, not one after the other
    assert calls[0] == ["installed"]
    halves = {call[0]: call[2:] for call in calls[1:]}
    assert halves == {
        # The lab's engine built in the background from the start (a cached one at once).
        "build": ["run", "python", "-m", "lab.llamacpp", "build"],
        "unit": ["run", "pytest", "-m", "not", "lab", "-n", "2", "--durations=15"],
        "lab": ["run", "pytest", "-m", "lab", "--durations=40"],
    }
    # The unit tests' output after the lab's, whole.
    assert result.stdout.index("output of the lab half") < result.stdout.index("output of the unit half")


@pytest.mark.parametrize(("unit", "lab", "status"), [("3", "0", 3), ("0", "4", 4), ("3", "4", 3), ("0", "0", 0)])
def test_either_half_s_failure_is_the_exit_status(tmp_path, unit, lab, status):
    result, _calls = _run(tmp_path, STANDIN_EXIT_unit=unit, STANDIN_EXIT_lab=lab)
    assert result.returncode == status, result.stdout + result.stderr
    assert "output of the unit half" in result.stdout


def test_a_failed_engine_build_is_shown_and_the_lab_half_says_the_rest(tmp_path):
    result, _calls = _run(tmp_path, STANDIN_EXIT_build="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "./test: the lab's llama-server build failed:" in result.stdout
    assert "output of the build half" in result.stdout


def test_options_or_serial_run_one_pytest_with_them(tmp_path):
    result, calls = _run(tmp_path, "-m", "not lab", "-x")
    assert result.returncode == 0 and [call[0] for call in calls] == ["installed", "unit"]
    assert calls[1][2:] == ["run", "pytest", "-m", "not", "lab", "-x"]
    result, calls = _run(tmp_path / "serial", SPARKRIG_TEST_SERIAL="1")
    assert result.returncode == 0 and [call[2:] for call in calls[1:]] == [["run", "pytest"]]
