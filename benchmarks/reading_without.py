"""
What a part of the compliance suite's reading costs a host: the reading timed on the host,
whole and with the reads that match a pattern left out, side by side.

    SPARKRIG_LAB_ID=8 uv run python -m benchmarks.reading_without --limit lab-deb12 \\
        --without spark-cluster-check --without " ssh -n " --runs 7

On a running, converged lab: one read-only run of the real suite (this file loaded as a
pytest plugin) records every read of the host, every round's; then each variant's reads go to
the host as the one script the suite sends (``reads.prefetch_script``), wrapped in
``date +%s%N`` and the shell's ``times`` on the host, the variants one after another in each
of ``--runs`` turns (the host's load falls on all of them alike). Variants: every read, each
``--without`` pattern's matches left out, and all the patterns' left out together. A read
left out is what a control would not ask: the figures say what asking it costs, no control
is changed. Not a test: nothing here passes or fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from tests.compliance import reads

REPO = Path(__file__).resolve().parent.parent
OUT = "SPARKRIG_READING_WITHOUT_OUT"


def pytest_configure(config):
    """The plugin: each round's reads of each host, appended to the file $OUT names."""
    if not os.environ.get(OUT):
        return
    real = reads._read

    def recording(ssh_config, name, commands):
        with open(os.environ[OUT], "a") as out:
            out.write(json.dumps({"host": name, "ssh_config": ssh_config, "commands": list(commands)}) + "\n")
        return real(ssh_config, name, commands)

    reads._read = recording


def recorded(limit: str) -> tuple[str, list[str]]:
    """The SSH config and every read of host ``limit`` in one read-only run of the suite."""
    out = Path(f"/tmp/sparkrig-reading-without-{os.getpid()}.jsonl")
    out.unlink(missing_ok=True)
    # Every round as the suite plans and sends it: none sent early, which nothing here records.
    env = {**os.environ, OUT: str(out), "SPARKRIG_COMPLIANCE_EARLY": "0"}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.reading_without"]
        + ["tests/compliance", "--inventory", "inventory/lab.py", "--limit", limit, "-m", "not action"],
        cwd=REPO,
        env=env,
        capture_output=True,
        check=False,
    )
    rounds = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    out.unlink(missing_ok=True)
    mine = [r for r in rounds if r["host"] == limit]
    if not mine:
        raise SystemExit(f"the suite read nothing of {limit}: is the lab up and converged?")
    return mine[0]["ssh_config"], [command for r in mine for command in r["commands"]]


def timed(ssh_config: str, host: str, commands: list[str]) -> tuple[float, float]:
    """The host's wall seconds and CPU seconds (its processes' user and system) for the one
    script reading ``commands``."""
    script = reads.prefetch_script(commands)
    wrapped = (
        f't0=$(date +%s%N); sh -c {shlex.quote(script)} >/dev/null 2>&1; t1=$(date +%s%N); echo "$((t1 - t0))"; times'
    )
    lines = subprocess.run(
        ["ssh", "-F", ssh_config, host, wrapped], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    # times: the shell's own user and system time, then its children's (every process of the script).
    children = [int(m) * 60 + float(s) for m, s in (t.rstrip("s").split("m") for t in lines[2].split())]
    return int(lines[0]) / 1e9, sum(children)


def each(ssh_config: str, host: str, commands: list[str], runs: int, shown: int) -> None:
    """Every read timed alone, ``runs`` turns, less a read of ``true``: the ``shown`` costliest in CPU."""
    found: dict[str, list[tuple[float, float]]] = {c: [] for c in ["true", *commands]}
    for _ in range(runs):
        for command in found:
            found[command].append(timed(ssh_config, host, [command]))
    medians = {c: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for c, ts in found.items()}
    base_wall, base_cpu = medians.pop("true")
    ranked = sorted(medians.items(), key=lambda item: item[1][1], reverse=True)
    total = sum(max(0.0, cpu - base_cpu) for _wall, cpu in medians.values())
    print(f"{host}: each read alone, medians of {runs}, less a read of true ({base_wall:.3f} s, {base_cpu:.3f} s CPU)")
    print(f"  the {len(medians)} reads' CPU alone, summed: {total:.2f} s")
    for command, (wall, cpu) in ranked[:shown]:
        text = " ".join(command.split())
        print(f"  {cpu - base_cpu:6.3f} s CPU {wall - base_wall:6.3f} s wall  {text[:150]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", required=True, help="the lab host whose reading is timed")
    parser.add_argument("--without", action="append", default=[], help="leave out the reads holding this text")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--each",
        type=int,
        default=0,
        metavar="N",
        help="also time every read alone (the script of that one read, less the script of a read of "
        "`true`) and print the N that cost the host the most CPU",
    )
    args = parser.parse_args()
    ssh_config, commands = recorded(args.limit)
    if args.each:
        each(ssh_config, args.limit, commands, args.runs, args.each)
    variants = {"every read": commands}
    for pattern in args.without:
        variants[f"without {pattern!r}"] = [c for c in commands if pattern not in c]
    if len(args.without) > 1:
        variants["without all of them"] = [c for c in commands if not any(p in c for p in args.without)]
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.runs):
        for name, chosen in variants.items():
            found[name].append(timed(ssh_config, args.limit, chosen))
    print(f"{args.limit}: the suite's reading on the host, medians of {args.runs}")
    for name, times in found.items():
        wall = statistics.median(t[0] for t in times)
        cpu = statistics.median(t[1] for t in times)
        left = len(commands) - len(variants[name])
        print(f"  {name}: {wall:.3f} s wall, {cpu:.2f} s CPU ({len(variants[name])} reads, {left} left out)")


if __name__ == "__main__":
    main()
