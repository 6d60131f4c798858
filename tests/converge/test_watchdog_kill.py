"""
The watchdog acts: earlyoom kills a preferred memory hog (a python3 process) before
MemAvailable falls below its threshold, and the host stays reachable.

The lab's hosts see the controller's whole memory (about 24 GiB, shared with other
work), so the test does not fill it. Beside the deployed earlyoom it starts a second,
transient one with the deployed --prefer and --avoid and a threshold just below the
current MemAvailable, then a hog that grows by 50 MiB steps to at most 2 GiB: the
kill is due after about 300 MiB, and the rest is room for what other work on the
controller frees meanwhile (in one CI run MemAvailable stayed flat while the hog grew
from 550 to 800 MiB, and the hog reached an 800 MiB limit before the threshold).
Nothing is left behind: the deployed earlyoom, its process and its files are
untouched, so the idempotence check and the compliance suite see what the converge did.
"""

from __future__ import annotations

import base64
import re
import shlex
import time

import pytest

import lab

pytestmark = pytest.mark.lab

STEP_MIB = 50
MAX_MIB = 2048
# The transient earlyoom's threshold: this far below MemAvailable when it starts.
HEADROOM_MIB = 300
# How far below the threshold MemAvailable may be seen before the kill lands: one
# poll of earlyoom (100 ms near the threshold) is at most one 50 MiB step of the hog,
# plus what other work on the controller moves meanwhile.
MARGIN_MIB = 256
UNIT = "sparkrig-killtest"
SIGNALLED = {143: "SIGTERM", 137: "SIGKILL"}

# Holds one step, says so, waits for the go file, then grows a step every 0.2 s and
# logs "MiB-held MemAvailable-KiB" after each step; sleeps (bounded) once at the limit.
HOG = b"""\
import os, sys, time
step, limit, log = int(sys.argv[1]) << 20, int(sys.argv[2]) << 20, sys.argv[3]

def available():
    with open("/proc/meminfo") as meminfo:
        return next(int(l.split()[1]) for l in meminfo if l.startswith("MemAvailable:"))

held = []
with open(log, "w", buffering=1) as out:
    out.write(f"pid {os.getpid()}\\n")
    while True:
        held.append(b"\\1" * step)
        out.write(f"{len(held) * step >> 20} {available()}\\n")
        while not os.path.exists(log + ".go"):
            time.sleep(0.05)
        if len(held) * step >= limit:
            break
        time.sleep(0.2)
    time.sleep(60)
"""


def _run(name: str, command: str) -> str:
    return lab.run_ssh(name, command).stdout


def _meminfo(name: str) -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1]) for line in _run(name, "cat /proc/meminfo").splitlines()}


def _deployed(name: str) -> dict:
    """The deployed earlyoom: its PID, its options, its version, its files' digest."""
    pid = int(_run(name, "systemctl show --property MainPID --value earlyoom.service"))
    argv = _run(name, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
    version = re.search(r"v(\d+)\.(\d+)", _run(name, "/usr/bin/earlyoom -v 2>&1"))
    digest = _run(name, "sha256sum /etc/default/earlyoom /etc/systemd/system/earlyoom.service.d/*.conf")
    return {
        "pid": pid,
        "options": dict(zip(argv[1::2], argv[2::2])),
        "version": (int(version[1]), int(version[2])),
        "digest": digest,
    }


def threshold_kib(target_kib: int, version: tuple[int, int], meminfo: dict[str, int]) -> int:
    """earlyoom's -M for a SIGTERM once MemAvailable reaches ``target_kib``.

    earlyoom turns -M into a percentage of MemTotal at startup. 1.7 compares it with
    MemAvailable/MemTotal; from 1.8 with MemAvailable/(MemAvailable + AnonPages), a total
    that stays put while a hog turns available memory into anonymous memory.
    """
    if version < (1, 8):
        return target_kib
    return target_kib * meminfo["MemTotal"] // (meminfo["MemAvailable"] + meminfo["AnonPages"])


def _wait_for(name: str, check: str, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while lab.run_ssh(name, check, check=False).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: {what} within {timeout_s:.0f} s")
        time.sleep(0.5)


def _start_hog(name: str, workdir: str) -> None:
    encoded = base64.b64encode(HOG).decode()
    _run(
        name,
        (
            f"cd {workdir} && echo {encoded} | base64 -d > hog.py && "
            f"{{ (python3 hog.py {STEP_MIB} {MAX_MIB} {workdir}/log; echo $? > {workdir}/status) "
            "</dev/null >/dev/null 2>&1 & }"
        ),
    )
    _wait_for(name, f"[ $(wc -l < {workdir}/log) -ge 2 ]", 30, "the hog did not start")


def _journal(name: str, since: str) -> str:
    """The transient earlyoom's journal from ``since`` (``@EPOCH``) on: the unit name is
    reused by every run of this test."""
    return f"sudo journalctl -u {UNIT} --since {since} -o cat"


def _start_watchdog(name: str, minimum_kib: int, options: dict[str, str], since: str) -> None:
    command = [
        "sudo",
        "systemd-run",
        f"--unit={UNIT}",
        "--collect",
        "--quiet",
        "/usr/bin/earlyoom",
        "-M",
        str(minimum_kib),
        "-s",
        "100",
        "-r",
        "1",
        "--prefer",
        options["--prefer"],
        "--avoid",
        options["--avoid"],
    ]
    _run(name, shlex.join(command))
    _wait_for(
        name,
        f"{_journal(name, since)} | grep -q 'sending SIGTERM when'",
        30,
        "the transient earlyoom did not report its thresholds",
    )


def _clean_up(name: str, workdir: str) -> None:
    lab.run_ssh(
        name,
        (
            f"sudo systemctl stop {UNIT}; sudo systemctl reset-failed {UNIT}; "
            f"pid=$(sed -n 's/^pid //p' {workdir}/log 2>/dev/null); "
            f'[ -z "$pid" ] || kill -KILL "$pid"; rm -rf {workdir}'
        ),
        check=False,
    )


@pytest.mark.parametrize("name", [name for name, _flavour in lab.DEFAULT_FLEET])
def test_earlyoom_kills_a_preferred_hog_before_the_threshold(lab_hosts, first_converge, name):
    assert first_converge.returncode == 0, "the first converge failed; see its test"
    before = _deployed(name)
    workdir = _run(name, "mktemp -d /tmp/sparkrig-killtest.XXXXXX").strip()
    try:
        _start_hog(name, workdir)
        since = "@" + _run(name, "date +%s").strip()
        meminfo = _meminfo(name)
        target_kib = meminfo["MemAvailable"] - HEADROOM_MIB * 1024
        _start_watchdog(name, threshold_kib(target_kib, before["version"], meminfo), before["options"], since)
        _run(name, f"touch {workdir}/log.go")
        _wait_for(name, f"[ -s {workdir}/status ]", 90, "the hog was neither killed nor done")
        status = int(_run(name, f"cat {workdir}/status"))
        log = _run(name, f"cat {workdir}/log").splitlines()
        journal = _run(name, _journal(name, since))
    finally:
        _clean_up(name, workdir)

    hog_pid = int(log[0].split()[1])
    steps = [tuple(map(int, line.split())) for line in log[1:]]
    lowest = min(available for _held, available in steps)
    report = f"earlyoom -M for {target_kib} KiB; hog steps (MiB, MemAvailable KiB) {steps}\n{journal}"
    assert status in SIGNALLED, f"the hog exited with {status}, not killed\n{report}"
    assert re.search(rf"sending SIG(TERM|KILL) to process {hog_pid}\b", journal), report
    assert steps[-1][0] < MAX_MIB, f"the hog reached its limit before it was killed\n{report}"
    assert lowest >= target_kib - MARGIN_MIB * 1024, f"MemAvailable fell to {lowest} KiB\n{report}"

    after = _deployed(name)
    assert after == before, "the deployed earlyoom was restarted, killed or reconfigured"
    assert _run(name, "systemctl is-active earlyoom.service").strip() == "active"
    assert UNIT not in _run(name, f"systemctl list-units --all --no-legend {UNIT}.service")
