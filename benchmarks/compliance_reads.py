"""
What the compliance suite costs on a running, converged lab, two trees side by side.

    SPARKRIG_LAB_ID=7 uv run python -m benchmarks.compliance_reads --before /path/to/old/tree

For each tree (``--before``, a checkout of an earlier commit run with this venv, and this
one), each added round-trip time and each fleet, it runs ``pytest tests/compliance
--inventory`` (``-m "not action"``: the read-only controls; ``--all`` adds the whole suite)
and reports the wall time, the controller's CPU time (pytest and its xdist workers, all
children of this process) and the remote commands per host, counted by
``benchmarks/count_commands.py`` (by kind where the tree counts kinds). A fleet of N
names each lab host N / (lab hosts) times (aliases of the same host, as separate inventory
hosts): the controller's cost per host is what it measures, not the hosts'. Unlike
``noop_run`` it boots nothing. Not a test: nothing here passes or fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lab
from benchmarks.noop_run import Relays, children_cpu_s, write_inventory

REPO = Path(__file__).resolve().parent.parent


# The read-only controls, selected as a user selects them (both trees mark the others action).
READ_ONLY = "not action"


def fleet_names(hosts: list[dict], size: int) -> list[str]:
    """The first ``size`` names: the lab's hosts, then aliases of them (NAME-aliasI)."""
    return [hosts[i % len(hosts)]["name"] + ("" if i < len(hosts) else f"-alias{i}") for i in range(size)]


def fleet_inventory(directory: Path, hosts: list[dict], ports: dict[str, int], size: int) -> Path:
    """``write_inventory``'s, plus aliases of the lab's hosts up to ``size`` names (an alias
    is in no cluster: a cluster's addresses are its own); ``--limit`` picks the fleet."""
    base = write_inventory(directory, hosts, ports)
    text = base.read_text() + (
        f"_names = {fleet_names(hosts, size)!r}\n"
        "_by = dict(lab)\n"
        "lab = lab + [(n, {k: v for k, v in _by[n.split('-alias')[0]].items() if not k.startswith('cluster_')})\n"
        "             for n in _names if '-alias' in n]\n"
    )
    inventory = directory / f"fleet_{size}.py"
    inventory.write_text(text)
    return inventory


def suite(tree: Path, inventory: Path, names: list[str], marker: str, counts: Path) -> tuple[float, float, dict, str]:
    cpu, started = children_cpu_s(), time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "benchmarks.count_commands",
            "-p",
            "no:cacheprovider",
            "tests/compliance",
            "--inventory",
            str(inventory),
            "--limit",
            ",".join(names),
            *(["-m", marker] if marker else []),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "SPARKRIG_BENCH_COUNTS": str(counts)},
    )
    wall, cpu = time.monotonic() - started, children_cpu_s() - cpu
    outcome = (result.stdout.strip().splitlines() or ["?"])[-1].strip("= ")
    return wall, cpu, json.loads(counts.read_text()) if counts.exists() else {}, outcome


def per_host(counts: dict, names: list[str]) -> str:
    """Commands per host: prefetch + read (+ action), or the old tree's single total."""
    cells = []
    for name in names:
        kinds = {k.split(" (")[1].rstrip(")"): v for k, v in counts.items() if k.split(" (")[0] == name and " (" in k}
        if kinds:
            cells.append(
                f"{kinds.get('prefetch', 0)}+{kinds.get('read', 0)}"
                + (f" (+{kinds['action']} actions)" if kinds.get("action") else "")
            )
        else:
            cells.append(str(counts.get(name, "?")))
    return ", ".join(sorted(set(cells)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier tree")
    parser.add_argument("--rtt-ms", default="0,50")
    parser.add_argument("--fleets", default="1,8", help="inventory sizes (names cycle over the lab's hosts)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--all", action="store_true", help="also the whole suite, actions included (1 host)")
    args = parser.parse_args(argv)
    hosts = json.loads(lab.inventory_path().read_text())["hosts"]
    rows = [
        "| tree | controls | hosts | added RTT | wall (median) | runs | controller CPU (median) | "
        "remote commands per host | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rtt in (float(r) for r in args.rtt_ms.split(",")):
        relays = Relays(hosts, rtt)
        try:
            with tempfile.TemporaryDirectory(prefix="sparkrig-bench-") as tmp:
                for size in (int(n) for n in args.fleets.split(",")):
                    inventory = fleet_inventory(Path(tmp), hosts, relays.ports, size)
                    names = fleet_names(hosts, size)
                    kinds = [(READ_ONLY, "read-only")] + ([("", "all")] if args.all and size == 1 else [])
                    for marker, label in kinds:
                        for tree, tree_name in ((args.before, "before"), (REPO, "after")):
                            walls, cpus, counts, outcome = [], [], {}, ""
                            for _ in range(args.runs):
                                counts_file = Path(tmp) / "counts.json"
                                counts_file.unlink(missing_ok=True)
                                wall, cpu, counts, outcome = suite(tree, inventory, names, marker, counts_file)
                                walls.append(wall)
                                cpus.append(cpu)
                            row = (
                                f"| {tree_name} | {label} | {size} | {rtt:g} ms | {statistics.median(walls):.1f} s | "
                                f"{', '.join(f'{w:.1f}' for w in walls)} | {statistics.median(cpus):.1f} s | "
                                f"{per_host(counts, names)} | {outcome} |"
                            )
                            rows.append(row)
                            print(row, file=sys.stderr, flush=True)
        finally:
            relays.close()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
