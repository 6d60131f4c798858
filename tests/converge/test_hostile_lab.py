"""
The hostile host (lab/hostile.py): its local users attack the deploy, the compliance suite
and the metrics collector on purpose, every run. After one clean converge every attack of
lab.hostile.ATTACKS is armed; then each play must end within its bound, refuse the input or
fail the host with a named reason, leave every canary as it was, print no raw terminal
escape and nothing of the root-only canary, and keep the controller's memory and temporary
disk bounded. The host is no member of inventory/lab.py's fleet: the other hosts' results do
not see it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import lab
from lab import hostile
from sparkrig.tools import check
from tests.conftest import lab_says, start_hostile_converge
from tests.support import PYINFRA, REPO

pytestmark = pytest.mark.lab
INVENTORY = "inventory/lab_hostile.py"
DEPLOY_BOUND_S = 600  # a fresh host's clean converge takes about 190 s on the lab's controller
# The attacked plays: a deploy that refuses or fails the host takes seconds, the suite on this
# host about 2 minutes, a rollout both; each bound is what a hung play costs the run.
ATTACKED_DEPLOY_BOUND_S = 180
SUITE_BOUND_S = 300
ROLLOUT_BOUND_S = 300
RSS_BOUND_KIB = 1 << 20  # 1 GiB for pyinfra or pytest and every process they waited for
TMP_BOUND_BYTES = 64 << 20  # the controller's temporary directory, at its fullest


def _root_sh(host: str, script: str, timeout: float = 300) -> str:
    return lab.run_ssh(host, f"sudo sh -c {shlex.quote(script)}", timeout=timeout).stdout


@dataclass
class Played:
    returncode: int
    output: str
    seconds: float
    timed_out: bool
    peak_rss_kib: int
    peak_tmp_bytes: int


def _size(top: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(top):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def play(argv: list[str], bound_s: float, tmp: Path) -> Played:
    """``argv`` from the repository with its own TMPDIR, killed at ``bound_s``: its output, its
    time, the peak RSS of it and every process it waited for (wait4), its TMPDIR at its fullest."""
    tmp.mkdir()
    out = tmp.parent / f"{tmp.name}.out"
    started = time.monotonic()
    peak_tmp, timed_out = 0, False
    with open(out, "wb") as sink:
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": str(tmp)},
            start_new_session=True,
        )
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - started > bound_s:
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(process.pid, 0)
                break
            peak_tmp = max(peak_tmp, _size(tmp))
            time.sleep(0.5)
    process.returncode = os.waitstatus_to_exitcode(status)
    return Played(
        process.returncode,
        out.read_bytes().decode(errors="replace"),
        time.monotonic() - started,
        timed_out,
        usage.ru_maxrss,
        max(peak_tmp, _size(tmp)),
    )


@pytest.fixture(scope="module")
def armed(request, hostile_host, lab_locks, say):
    """The hostile host converged clean once (beside the fleet's first converge, when that ran
    in this session: tests/conftest.py), its canaries read, then every attack armed."""
    host = hostile_host
    started = time.monotonic()
    background = getattr(request.config, "sparkrig_hostile_converge", None)
    if background is None:
        background = start_hostile_converge()
    say(f"hostile: waiting for the clean converge of {host}")
    try:
        background.wait(timeout=DEPLOY_BOUND_S)
    finally:
        if background.poll() is None:
            background.kill()
    background.output.seek(0)
    output = background.output.read().decode(errors="replace")
    say(f"hostile: clean converge, exit status {background.returncode} (waited {time.monotonic() - started:.0f} s)")
    assert background.returncode == 0, output[-4000:]
    canaries = _root_sh(host, hostile.CANARIES)
    armed = lab.run_ssh(host, f"sudo sh -c {shlex.quote(hostile.arm_all())}", check=False)
    assert armed.returncode == 0 and "arming" not in armed.stderr, armed.stderr[-3000:]
    say(f"hostile: {len(hostile.ATTACKS)} attacks armed on {host}")
    yield host, canaries
    _root_sh(host, hostile.DISARM)


@pytest.fixture(scope="module")
def say(request):
    return lambda message: lab_says(request.config, message)


def _lines_with(text: str, needle: str) -> str:
    """The lines of ``text`` holding ``needle``, with the line before each, escaped (repr)."""
    lines = text.splitlines()
    found = [f"{i}: {lines[i - 1]!r}\n{i + 1}: {line!r}" for i, line in enumerate(lines) if needle in line and i]
    return "\n".join(found[:12])


def _assert_survived(host: str, canaries: str, played: Played, what: str) -> None:
    tail = played.output[-4000:]
    assert not played.timed_out, f"{what} ran past its bound ({played.seconds:.0f} s):\n{tail}"
    assert _root_sh(host, hostile.CANARIES) == canaries, f"a canary changed during {what}"
    assert _root_sh(host, hostile.proofs()) == "", f"an attack achieved something during {what}"
    assert hostile.SECRET_LINE not in played.output, f"{what} printed the root-only canary:\n" + _lines_with(
        played.output, hostile.SECRET_LINE
    )
    assert "\x1b" not in played.output, f"{what} printed a raw ESC (a host's bytes reached the terminal):\n" + (
        _lines_with(played.output, "\x1b")
    )
    assert played.peak_rss_kib < RSS_BOUND_KIB, f"{what} peaked at {played.peak_rss_kib} KiB"
    assert played.peak_tmp_bytes < TMP_BOUND_BYTES, f"{what}'s TMPDIR peaked at {played.peak_tmp_bytes} bytes"


def test_the_attacked_deploy_ends_refusing_or_failing_the_host_and_every_canary_survives(armed, tmp_path, say):
    host, canaries = armed
    played = play([PYINFRA, "-y", INVENTORY, "deploy.py"], ATTACKED_DEPLOY_BOUND_S, tmp_path / "deploy")
    say(
        f"hostile: attacked deploy, exit status {played.returncode} in {played.seconds:.0f} s, "
        f"peak RSS {played.peak_rss_kib >> 10} MiB, TMPDIR peak {played.peak_tmp_bytes >> 10} KiB"
    )
    for line in played.output.splitlines():
        if f"[{host}]" in line and ("rror" in line or "stops" in line or "refuse" in line):
            say(f"hostile: the deploy said {line.strip()[:300]!r}")
    if played.timed_out:  # name what the host's run waited on
        waiting = _root_sh(host, hostile.leftovers())
        assert _root_sh(host, hostile.CANARIES) == canaries, "a canary changed during the deploy"
        assert _root_sh(host, hostile.proofs()) == "", "an attack achieved something during the deploy"
        pytest.fail(f"the deploy ran past its bound; the venv owner's processes then:\n{waiting[:3000]}")
    _assert_survived(host, canaries, played, "the deploy")
    # The host either converged (every input refused) or failed itself, saying why.
    assert played.returncode == 0 or f"[{host}]" in played.output, played.output[-4000:]


def test_the_attacked_suite_ends_names_its_refusals_and_leaves_no_process_behind(armed, tmp_path, say):
    host, canaries = armed
    # What earlier plays left running (the deploy's reading runs the venv's python too).
    _root_sh(host, hostile.STOP_OWNER)
    junit = tmp_path / "junit.xml"
    played = play(
        check.command(
            INVENTORY, [host], junitxml=str(junit), extra=["-n", "0", "-q", "-rfs", "--tb=line", "-m", "not action"]
        ),
        SUITE_BOUND_S,
        tmp_path / "suite",
    )
    say(
        f"hostile: attacked suite, exit status {played.returncode} in {played.seconds:.0f} s, "
        f"peak RSS {played.peak_rss_kib >> 10} MiB, TMPDIR peak {played.peak_tmp_bytes >> 10} KiB"
    )
    _assert_survived(host, canaries, played, "the suite")
    report = junit.read_text(errors="replace")
    assert hostile.SECRET_LINE not in report and "\x1b" not in report
    # Each refusal is named: the venv past its cap fails its controls saying which.
    assert "*.dist-info folders" in played.output, played.output[-4000:]
    time.sleep(2)
    assert _root_sh(host, hostile.leftovers()).strip() == "", "the venv owner's programs outlived the suite"


def test_the_report_fails_the_hostile_host_naming_its_nccl_link_and_reads_nothing_through_it(armed, tmp_path, say):
    """The fleet report reads every host's NCCL builds as root: the venv owner's libnccl.so.2,
    a link to the root-only canary, fails that host, named, and nothing behind it is read."""
    host, canaries = armed
    played = play(
        [sys.executable, "-m", "sparkrig.tools", "report", INVENTORY], ATTACKED_DEPLOY_BOUND_S, tmp_path / "report"
    )
    say(f"hostile: report, exit status {played.returncode} in {played.seconds:.0f} s")
    _assert_survived(host, canaries, played, "the report")
    assert "NCCL's venv library not read" in played.output and "libnccl.so.2" in played.output, played.output[-3000:]


def test_the_collector_never_writes_where_the_prometheus_user_points(armed):
    """While the prometheus user swaps its directory for a link to /etc in a loop, the collector
    runs again and again: its file lands in root's directory, never through the link."""
    host, canaries = armed
    # The collector itself, as its unit runs it (systemd would refuse starts this close together).
    _root_sh(host, "for i in 1 2 3 4 5 6 7 8; do cd / && /usr/local/sbin/sparkrig-metrics || exit 1; sleep 0.1; done")
    assert _root_sh(host, hostile.proofs()) == ""
    age = _root_sh(host, "echo $(( $(date +%s) - $(stat -c %Y /var/lib/sparkrig/metrics/sparkrig.prom) ))")
    assert int(age) < 60
    assert _root_sh(host, hostile.CANARIES) == canaries


def test_a_rollout_batch_of_the_hostile_host_ends_and_names_the_host(armed, tmp_path, say):
    """sparkrig rollout (its deploy, then the suite that proves it) over the hostile host alone."""
    host, canaries = armed
    _root_sh(host, hostile.STOP_OWNER)
    played = play(
        [
            sys.executable,
            "-m",
            "sparkrig.tools.rollout",
            INVENTORY,
            "--limit",
            host,
            "--batch",
            "1",
            "--state",
            str(tmp_path / "rollout-state" / "hostile.json"),
        ],
        ROLLOUT_BOUND_S,
        tmp_path / "rollout",
    )
    say(
        f"hostile: rollout batch, exit status {played.returncode} in {played.seconds:.0f} s, "
        f"peak RSS {played.peak_rss_kib >> 10} MiB, TMPDIR peak {played.peak_tmp_bytes >> 10} KiB"
    )
    _assert_survived(host, canaries, played, "the rollout")
    # The rollout's table names a failed host with why, under "failed:" ("  HOST (batch 1): why").
    said = [line.strip() for line in played.output.splitlines() if line.startswith(f"  {host} (batch 1): ")]
    assert played.returncode == 0 or (played.returncode == 1 and said), played.output[-4000:]
