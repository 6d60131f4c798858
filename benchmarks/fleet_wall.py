"""
Eight hosts against one: the read-only suite's wall time where each host reads on its own CPU.

    SPARKRIG_LAB_ID=8 uv run python -m benchmarks.fleet_wall --converge --rtt-ms 50 --fleets 1,8 --runs 5

The lab's hosts share this machine's two cores with the controller, so eight of them (or eight
aliases of two) read one after the other, where a fleet's hosts each read on their own CPU: the
lab cannot show what eight hosts cost. Here the hosts are STAND-INS, the controller is real:

1. on a running lab (``python -m lab up``; ``--converge`` first converges its hosts with this
   benchmark's inventory: aliases ``NAME~N`` of the lab's hosts, in no cluster and scraped by no
   Prometheus, as ``benchmarks.fleet_scale`` makes them), through ``benchmarks.relay`` at the
   added round-trip time, it runs the read-only suite (``pytest tests/compliance --inventory
   -m read``, with what ``sparkrig check`` adds to it) against ONE alias of each lab host, alone,
   ``--runs`` + 1 times, with ``benchmarks/standin-ssh`` as the suite's ``ssh``: the real ssh,
   each command's answer and its wall time kept (the host's reading and the round trips in it);
2. for each fleet size it runs the same suite against N aliases, with the stand-in answering
   each alias's commands as its lab host answered them, after the time they took: N hosts that
   each take what one real host took, side by side, contacting nothing. A fleet is N aliases
   of one lab host, each lab host's apart: a fleet waits for its slowest host's reading, so N
   hosts are compared with one host like them. Everything on the
   controller runs as against real hosts: the early reads, one ``ssh`` process per host and
   round (the stand-in's, a bash script, where ssh would be), pytest, the prefetch, the controls.

It reports the wall time per size (median of ``--runs``, after one unmeasured run that leaves
the early reads, as a user's earlier run does), its ratio to one host, the controller's CPU,
and the real one-host runs of step 1 beside it. Every alias must get its lab host's per-host
row (passed, failed, skipped) and no command may go unanswered. Not a test: nothing here passes
or fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.fleet_scale import fleet_names
from benchmarks.replay import ALIAS
from benchmarks.suite_command import read_only_suite
from tests.support import TABLE_TITLE

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "benchmarks" / "standin-ssh"


def alias_inventory(base: Path, names: list[str], path: Path) -> Path:
    """``base`` (the lab inventory through the relays), its hosts renamed to ``names``: each
    alias the data of its lab host, the cluster keys and the Prometheus server left out."""
    path.write_text(
        base.read_text()
        + f"_by = dict(lab)\n_names = {names!r}\n"
        + "lab = [(_n, {_k: _v for _k, _v in _by[_n.split("
        + repr(ALIAS)
        + ")[0]].items() if not _k.startswith('cluster_') and _k != 'prometheus_server'}) for _n in _names]\n"
    )
    return path


def per_host(stdout: str) -> dict[str, tuple[int, int, int]]:
    """The per-host table a compliance run ends with: NAME -> (passed, failed, skipped)."""
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if TABLE_TITLE in line), None)
    rows = {}
    for line in lines[start + 2 :] if start is not None else []:
        fields = line.split()
        if len(fields) != 4 or not all(f.isdigit() for f in fields[1:]):
            break
        rows[fields[0]] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return rows


def suite(inventory: Path, env: dict) -> tuple[float, float, subprocess.CompletedProcess]:
    """One run: its wall time, the controller's CPU (pytest and every process it started,
    the stand-in's included) and the run."""
    before = os.times()
    started = time.monotonic()
    result = subprocess.run(read_only_suite(inventory), cwd=REPO, capture_output=True, text=True, timeout=1800, env=env)
    wall = time.monotonic() - started
    after = os.times()
    return wall, (after.children_user + after.children_system) - (before.children_user + before.children_system), result


def standin_env(directory: Path, mode: str) -> dict:
    """The environment in which ``ssh`` is the stand-in (``mode``: record or play)."""
    bin_dir = directory / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "ssh").symlink_to(STANDIN)
    real = shutil.which("ssh")
    if real is None:
        raise SystemExit("no ssh on PATH: the recording runs the real one")
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SPARKRIG_STANDIN": str(directory / "answers"),
        "SPARKRIG_STANDIN_MODE": mode,
        "SPARKRIG_STANDIN_SSH": real,
    }


def misses(directory: Path) -> list[str]:
    found = directory / "answers" / "misses"
    return found.read_text().splitlines() if found.exists() else []


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main(argv: list[str] | None = None) -> int:
    import lab  # noqa: PLC0415 - the runner alone needs the lab
    from benchmarks.noop_run import Relays, deploy, write_inventory  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="round-trip time the relays add")
    parser.add_argument("--fleets", default="1,8", help="fleet sizes played (aliases cycle over --hosts)")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per size (median)")
    parser.add_argument("--hosts", default="lab-deb12,lab-deb13", help="the lab hosts recorded")
    parser.add_argument("--converge", action="store_true", help="converge the recorded hosts with this inventory first")
    parser.add_argument(
        "--keep", type=Path, help="work in this new directory and keep it (the answers, the inventories, to profile)"
    )
    args = parser.parse_args(argv)
    if not lab.inventory_path().exists():
        raise SystemExit("the lab is not up: `python -m lab up` first")
    real = args.hosts.split(",")
    hosts = [h for h in json.loads(lab.inventory_path().read_text())["hosts"] if h["name"] in real]
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as suite_phases: bytecode written once, read after
    relays = Relays(hosts, args.rtt_ms)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="sparkrig-wall-") as tmp:
            tmp = Path(tmp)
            if args.keep:
                args.keep.mkdir()
                tmp = args.keep
            base = write_inventory(tmp, hosts, relays.ports)
            if args.converge:
                inventory = alias_inventory(base, fleet_names(real, len(real)), tmp / "converge.py")
                _seconds, result = deploy(inventory)
                if result.returncode != 0:
                    raise RuntimeError(f"the converge failed:\n{result.stderr[-3000:]}")
            expected: dict[str, tuple[int, int, int]] = {}
            recorded_walls = []
            record = standin_env(tmp, "record")
            for name in real:
                inventory = alias_inventory(base, [f"{name}{ALIAS}0"], tmp / f"record_{name}.py")
                for run in range(args.runs + 1):
                    wall, _cpu, result = suite(inventory, record)
                    if run:
                        recorded_walls.append(wall)
                table = per_host(result.stdout)
                if f"{name}{ALIAS}0" not in table:
                    raise RuntimeError(f"no per-host row for {name}:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
                expected[name] = table[f"{name}{ALIAS}0"]
                print(f"recorded {name} at +{args.rtt_ms:g} ms: {expected[name]}", file=sys.stderr, flush=True)
            play = standin_env(tmp, "play")
            header = (
                "| fleet | hosts | wall (median) | runs | to one host | controller CPU (median) "
                "| every alias as its host |\n"
                "| --- | --- | --- | --- | --- | --- | --- |"
            )
            # Each recorded host's fleets apart: a fleet waits for its slowest host's reading, so
            # N hosts are compared with one host like them.
            for fleet in [[name] for name in real]:
                one = None
                for size in (int(n) for n in args.fleets.split(",")):
                    names = fleet_names(fleet, size)
                    inventory = alias_inventory(base, names, tmp / f"fleet_{'+'.join(fleet)}_{size}.py")
                    suite(inventory, play)  # unmeasured: it leaves the early reads, as a user's last run did
                    walls, cpus = [], []
                    for _ in range(args.runs):
                        wall, cpu, result = suite(inventory, play)
                        walls.append(wall)
                        cpus.append(cpu)
                        table = per_host(result.stdout)
                        wrong = [n for n in names if table.get(n) != expected[n.split(ALIAS)[0]]]
                        if wrong or misses(tmp):
                            raise RuntimeError(
                                f"the stand-ins answered other than their hosts ({', '.join(wrong[:4])}; "
                                f"unanswered: {misses(tmp)[:4]}):\n{result.stdout[-3000:]}"
                            )
                    one = one or _median(walls)
                    rows.append(
                        f"| {' and '.join(fleet)} | {size} | {_median(walls):.2f} s | "
                        f"{', '.join(f'{w:.2f}' for w in walls)} | {_median(walls) / one:.2f} | "
                        f"{_median(cpus):.2f} s | yes |"
                    )
                    print(rows[-1], file=sys.stderr, flush=True)
    finally:
        relays.close()
    print(f"python -m benchmarks.fleet_wall {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(
        f"real lab hosts, one at a time at +{args.rtt_ms:g} ms (the recording runs): "
        f"{_median(recorded_walls):.2f} s median ({', '.join(f'{w:.2f}' for w in recorded_walls)})"
    )
    print(header)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
