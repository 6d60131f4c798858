"""
The host's reading, timed on the host itself: the deploy's one reading (sparkrig.reading)
and the compliance suite's prefetch (tests/compliance/reads.py), on a running lab.

    SPARKRIG_LAB_ID=1 uv run python -m benchmarks.host_reading [--runs 5] [--limit lab-deb12]
    SPARKRIG_LAB_ID=1 PYTHONPATH=/path/to/old/tree uv run python -m benchmarks.host_reading --tree /path/to/old/tree
    SPARKRIG_LAB_ID=1 uv run python -m benchmarks.host_reading --runs 1 --suite-runs 3 --unit-reads 1

Each run wraps the script the tree would send in ``date +%s%N`` on the host (the deploy's as
root through sudo, the suite's as its login user, as each really runs), so the figure is the
host's time alone: no round trip, no controller. The deploy's reading is built inside a
pyinfra run of this file (the host's settings as the deploy resolves them); the suite's is
the real suite's (``-m "not action"``), this file loaded as a pytest plugin that times each
prefetch round. Not a test: nothing here passes or fails on a time.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.context import ctx_host

from sparkrig import reading
from tests.compliance import reads

REPO = Path(__file__).resolve().parent.parent
OUT = "SPARKRIG_HOST_READING_OUT"
RUNS = "SPARKRIG_HOST_READING_RUNS"
PARTS = "SPARKRIG_HOST_READING_PARTS"
UNIT_READS = "SPARKRIG_HOST_READING_UNIT_READS"
TIMING = "sparkrig-timing"


def timed(script: str) -> str:
    """``script`` run by sh, its output printed after one line saying how long it took (ns)
    and the CPU its processes used (the shell's ``times``: its children's line, which holds
    every process of the script that ended)."""
    return (
        f"t0=$(date +%s%N); o=$(sh -c {shlex.quote(script)}); t1=$(date +%s%N); "
        f'echo "{TIMING} $((t1 - t0))"; times; printf "%s\\n" "$o"'
    )


def _record(kind: str, host: str, found: tuple[float, float | None]) -> None:
    seconds, cpu = found
    with open(os.environ[OUT], "a") as out:
        out.write(json.dumps({"kind": kind, "host": host, "s": seconds, "cpu": cpu, "run": os.getpid()}) + "\n")


_CPU = re.compile(r"(\d+)m([\d.]+)s")


def _seconds(lines: list[str]) -> tuple[float, float | None] | None:
    """The wall seconds and the CPU seconds (user and system) :func:`timed` printed."""
    for index, line in enumerate(lines):
        if line.startswith(TIMING + " "):
            spent = _CPU.findall(lines[index + 2]) if len(lines) > index + 2 else []
            cpu = sum(int(m) * 60 + float(s) for m, s in spent) if len(spent) == 2 else None
            return int(line.split()[1]) / 1e9, cpu
    return None


# The deploy's reading: this file as pyinfra's deploy file ------------------------------


def _deploy_reading() -> None:
    parts = reading.planned(reading._host_settings())
    fact = reading.reading_of(parts)
    if "nonce" in inspect.signature(fact.command).parameters:  # a tree from before the executor
        command = fact().command(parts=parts, nonce=fact.nonce)
    else:
        command = fact().command(parts=parts)
    if os.environ.get(PARTS):  # each part alone, one after another: which are slow
        for each in parts:
            part_command = each.fact().command(**dict(each.kwargs))
            text = part_command.get_raw_value() if isinstance(part_command, StringCommand) else str(part_command)
            ok, output = host.run_shell_command(StringCommand(timed(text)), _sudo=True)
            found = _seconds([line.line for line in output if line.buffer_name == "stdout"])
            if found is not None:
                _record("part", f"{host.name} {each.describe()[:100]}", found)
    for _ in range(int(os.environ.get(RUNS, "5"))):
        ok, output = host.run_shell_command(StringCommand(timed(command.get_raw_value())), _sudo=True)
        found = _seconds([line.line for line in output if line.buffer_name == "stdout"])
        if ok and found is not None:
            _record("deploy", host.name, found)


# The suite's prefetch: this file as a pytest plugin ------------------------------------


def pytest_configure(config):
    if not os.environ.get(OUT):
        return
    if os.environ.get(UNIT_READS):
        reads.UNIT_READS = int(os.environ[UNIT_READS])
    real = reads._ssh_output

    def timing(argv, name=""):
        output = real([*argv[:-1], timed(argv[-1])], name)
        if output is None:
            return None
        lines = output.splitlines()
        found = _seconds(lines)
        if found is not None:
            _record("suite", name or "@local", found)
        return "\n".join(line for line in lines if not line.startswith(TIMING + " ")) + "\n"  # times: a preamble

    reads._ssh_output = timing


# The driver --------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="deploy readings per host (the suite: one run)")
    parser.add_argument("--limit", default="", help="lab hosts (pyinfra's --limit)")
    parser.add_argument("--tree", type=Path, default=REPO, help="the tree whose reading is timed")
    parser.add_argument("--suite-runs", type=int, default=2, help="runs of the read-only suite")
    parser.add_argument("--parts", action="store_true", help="also time each part of the deploy's reading alone")
    parser.add_argument("--unit-reads", type=int, help="the suite's reads to a unit of the executor (reads.UNIT_READS)")
    args = parser.parse_args()
    out = Path(f"/tmp/sparkrig-host-reading-{os.getpid()}.jsonl")
    # Each round as the suite plans and sends it (no first round sent early, which this
    # file's timing would not wrap).
    env = {
        **os.environ,
        OUT: str(out),
        RUNS: str(args.runs),
        "PYTHONPATH": f"{args.tree}:{REPO}",
        "SPARKRIG_COMPLIANCE_EARLY": "0",
    }
    if args.parts:
        env[PARTS] = "1"
    if args.unit_reads:
        env[UNIT_READS] = str(args.unit_reads)
    limit = ["--limit", args.limit] if args.limit else []
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *limit, "inventory/lab.py", str(REPO / "benchmarks/host_reading.py")],
        cwd=args.tree,
        env=env,
        capture_output=True,
        check=False,
    )
    for _ in range(args.suite_runs):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "benchmarks.host_reading",
                "tests/compliance",
                "--inventory",
                "inventory/lab.py",
                *(["--limit", args.limit] if args.limit else []),
                "-m",
                "not action",
            ],
            cwd=args.tree,
            env=env,
            capture_output=True,
            check=False,
        )
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    out.unlink(missing_ok=True)
    print(f"tree {args.tree} ({time.monotonic() - started:.0f} s)")
    for row in sorted((row for row in rows if row["kind"] == "part"), key=lambda row: -row["s"]):
        print(f"  part {row['host']}: {row['s']:.3f} s")
    for name in sorted({row["host"] for row in rows if row["kind"] != "part"}):
        deploy = [row for row in rows if row["kind"] == "deploy" and row["host"] == name]
        rounds = [row for row in rows if row["kind"] == "suite" and row["host"] == name]
        runs = sorted({r["run"] for r in rounds})
        suite = [
            {key: sum(row.get(key) or 0 for row in rounds if row["run"] == run) for key in ("s", "cpu")} for run in runs
        ]
        for label, found in (("deploy's reading", deploy), ("suite's prefetch (its rounds summed)", suite)):
            if found:
                times = [row["s"] for row in found]
                cpu = [row["cpu"] for row in found if row.get("cpu") is not None]
                print(
                    f"  {name} {label}: median {statistics.median(times):.3f} s, "
                    f"min {min(times):.3f} s, max {max(times):.3f} s ({len(times)} runs)"
                    + (f"; CPU on the host median {statistics.median(cpu):.2f} s" if cpu else "")
                )


if __name__ == "__main__":
    main()
elif os.environ.get(OUT) and ctx_host.isset():
    _deploy_reading()
