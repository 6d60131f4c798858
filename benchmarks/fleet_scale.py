"""
The controller at fleet scale: what it spends per host on a no-change run and on the
compliance suite, at 1, 8, 64 and 256 hosts.

    SPARKRIG_LAB_ID=8 uv run python -m benchmarks.fleet_scale --converge      # record, then 1,8,64,256
    SPARKRIG_LAB_ID=8 uv run python -m benchmarks.fleet_scale --sizes 1,8 --runs 3 --suite ""

On a running lab (``python -m lab up``; it boots nothing), converged with the benchmark's own
inventory (``--converge`` does it: the aliases are in no cluster, so neither are the hosts):

1. it RECORDS every remote command's answer from the lab's real hosts: one no-change run of
   the deploy (which must change nothing) and one run of the compliance suite's read-only
   controls (``-m read``), through ``benchmarks/replay.py``;
2. for each fleet size it writes an inventory of N names, each an alias of a recorded host
   (``lab-deb12~7``: the lab's data for that host, cluster keys left out, as no cluster spans
   aliases), and runs the same two commands against it with the hosts REPLAYED from the
   recording: a STAND-IN for the hosts, so the controller's cost is what is measured, not the
   network's or the hosts' (here they would share the controller's 2 cores);
3. it reports, per size, the controller's CPU time (user + system of pyinfra's process, or of
   pytest and its xdist workers: all descendants, from ``wait4``), its peak memory (the
   largest process's maximum RSS, and the sum over the process tree sampled every 50 ms),
   both per host, and whether the replayed run agreed with the recorded one (the deploy:
   zero changes; the suite: the same outcome, passed/failed/skipped, per control for every
   alias as on the host it stands for).

The compliance side takes the suite's commands from a run (the recording), so it measures
whatever the suite sends after it changes: record again and rerun. Not a test: nothing
here passes or fails on a time; a replayed run that disagrees with the recorded one stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path

import lab
from benchmarks.replay import ALIAS, recorded_host
from benchmarks.suite_command import read_only_suite

REPO = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")
TIMEOUT_S = 3600


def fleet_names(real: list[str], size: int) -> list[str]:
    """``size`` aliases, cycling over the recorded hosts: REAL~0, OTHER~0, REAL~1..."""
    return [f"{real[i % len(real)]}{ALIAS}{i // len(real)}" for i in range(size)]


def write_inventory(directory: Path, real: list[str], size: int) -> Path:
    """The lab inventory's data of the ``real`` hosts, under ``size`` alias names; the
    cluster keys left out (a cluster is its members' own addresses: no alias joins it), and
    the Prometheus server (it names a lab host, which no alias is; its targets would be
    every alias, so each fleet size would deploy another configuration)."""
    path = directory / f"fleet_{size}.py"
    path.write_text(
        "from inventory.lab import lab as _lab\n"
        "_data = {_n: {_k: _v for _k, _v in _d.items() if not _k.startswith('cluster_') and _k != 'prometheus_server'}"
        " for _n, _d in _lab}\n"
        f"lab = [(_name, _data[_name.split({ALIAS!r})[0]]) for _name in {fleet_names(real, size)!r}]\n"
    )
    return path


class Sampler(threading.Thread):
    """The largest sum of RSS over a process and its descendants, sampled every 50 ms."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def tree_rss(self) -> int:
        parents, rss = {}, {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                statm = Path(f"/proc/{entry}/statm").read_text().split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(statm[1]) * PAGE
        total, todo = 0, [self.pid]
        while todo:
            pid = todo.pop()
            total += rss.get(pid, 0)
            todo += [child for child, parent in parents.items() if parent == pid]
        return total

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.peak = max(self.peak, self.tree_rss())


def measured(argv: list[str], env: dict | None = None) -> dict:
    """Run ``argv`` from the repository: its output, exit status, wall time, CPU time (its
    own and its reaped descendants', from wait4), the largest process's maximum RSS and the
    process tree's sampled peak RSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        process = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err, env={**os.environ, **(env or {})})
        sampler = Sampler(process.pid)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - started
        sampler.done.set()
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "rc": process.returncode,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "maxrss_mib": usage.ru_maxrss / 1024,
            "tree_mib": sampler.peak / 2**20,
        }


# --- the deploy --------------------------------------------------------------------------


def deploy_argv(mode: str, recording: Path, inventory: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.replay",
        mode,
        str(recording),
        "--",
        "-y",
        "--json",
        str(inventory),
        "deploy.py",
    ]


def changes(stdout: str) -> int:
    """Operations that changed something, from ``pyinfra --json``'s report."""
    report = json.loads(stdout)
    return sum(len(op["success"]) for op in report["results"]["operations"])


def deploy(mode: str, recording: Path, inventory: Path) -> dict:
    """One no-change run (recorded from the lab or replayed); it must change nothing."""
    result = measured(deploy_argv(mode, recording, inventory))
    if result["rc"] != 0 or changes(result["stdout"]):
        said = [line for line in result["stderr"].splitlines() if "Error" in line or "replay:" in line]
        raise RuntimeError(
            f"the {mode}ed no-change run failed or changed something:\n"
            + "\n".join(line[:500] for line in said[-10:])
            + f"\n{result['stderr'][-1500:]}"
        )
    return result


# --- the compliance suite -----------------------------------------------------------------


def suite_argv(inventory: Path, junit: Path, marker: str) -> list[str]:
    return [*read_only_suite(inventory, plugins=["benchmarks.replay"], marker=marker), "--junitxml", str(junit)]


def outcomes(junit: Path) -> dict[tuple[str, str], str]:
    """(host, control) -> passed/failed/skipped, from the suite's JUnit report; the host the
    control ran against as testinfra names it (``ssh://NAME``)."""
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        name = case.get("name", "")
        if "[ssh://" not in name:
            continue
        control, _, rest = name.partition("[ssh://")
        host = next((n for n in _HOSTS if rest == f"{n}]" or rest.startswith(f"{n}-")), None)
        if host is None:
            continue
        params = rest[len(host) :]
        kind = (
            "failed"
            if case.find("failure") is not None or case.find("error") is not None
            else "skipped"
            if case.find("skipped") is not None
            else "passed"
        )
        found[(host, f"{case.get('classname')}::{control}[{params}")] = kind
    return found


_HOSTS: list[str] = []  # the names outcomes() looks for, longest first


def suite(mode: str, recording: Path, inventory: Path, names: list[str], marker: str, tmp: Path) -> dict:
    """One run of the compliance suite's ``marker`` controls, recorded from the lab or
    replayed; its outcome per control for each host as ``result["outcomes"]``."""
    junit = tmp / f"junit-{mode}-{len(names)}.xml"
    result = measured(suite_argv(inventory, junit, marker), env={"SPARKRIG_REPLAY": f"{mode}:{recording}"})
    _HOSTS[:] = sorted(names, key=len, reverse=True)
    if not junit.exists():
        raise RuntimeError(f"the {mode}ed compliance suite wrote no report:\n{result['stdout'][-3000:]}")
    result["outcomes"] = outcomes(junit)
    result["summary"] = (result["stdout"].strip().splitlines() or ["?"])[-1].strip("= ")
    return result


def disagreements(recorded: dict, replayed: dict, names: list[str]) -> list[str]:
    """Controls whose replayed outcome on an alias is not the recorded one on its host."""
    wrong = []
    for name in names:
        mine = {control: kind for (host, control), kind in replayed.items() if host == name}
        theirs = {
            control: kind for (host, control), kind in recorded.items() if recorded_host(host) == recorded_host(name)
        }
        if mine != theirs:
            differ = sorted(c for c in set(mine) | set(theirs) if mine.get(c) != theirs.get(c))
            wrong.append(
                f"{name}: {len(differ)} controls differ, e.g. "
                + "; ".join(f"{c}: {theirs.get(c)} -> {mine.get(c)}" for c in differ[:3])
            )
    return wrong


# --- the table ------------------------------------------------------------------------------


def row(side: str, size: int, runs: list[dict], check: str) -> str:
    cpu = statistics.median(r["cpu_s"] for r in runs)
    wall = statistics.median(r["wall_s"] for r in runs)
    maxrss = max(r["maxrss_mib"] for r in runs)
    tree = max(r["tree_mib"] for r in runs)
    each = ", ".join(f"{r['cpu_s']:.2f}" for r in runs)
    return (
        f"| {side} | {size} | {wall:.2f} s | {cpu:.2f} s | {each} | "
        f"{1000 * cpu / size:.1f} ms | {maxrss:.0f} MiB | {tree:.0f} MiB | {tree / size:.2f} MiB"
        f" | {check} |"
    )


def summary(runs: list[dict]) -> tuple[float, float]:
    """The median CPU time and the largest process-tree peak of a size's runs."""
    return statistics.median(r["cpu_s"] for r in runs), max(r["tree_mib"] for r in runs)


HEADER = (
    "| side | hosts | wall (median) | controller CPU (median) | runs | CPU per host | "
    "largest process (max RSS) | process tree (peak RSS) | memory per host | replay agrees |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--sizes", default="1,8,64,256")
    parser.add_argument("--runs", type=int, default=3, help="runs of the deploy per size (median)")
    parser.add_argument("--suite-runs", type=int, default=1, help="runs of the compliance suite per size")
    parser.add_argument("--suite", default="1,8,64,256", help="sizes at which the suite runs ('' for none)")
    parser.add_argument("--marker", default="read", help="the controls the suite runs (-m): the read-only ones")
    parser.add_argument("--hosts", default="lab-deb12,lab-deb13", help="the lab hosts recorded")
    parser.add_argument(
        "--recording",
        type=Path,
        help="replay this recording instead of recording now; a path that does not exist yet is "
        "recorded into first and kept, for later runs against the same lab (its data is in the commands)",
    )
    parser.add_argument(
        "--converge",
        action="store_true",
        help="converge the recorded hosts with the benchmark's inventory first (it takes the "
        "lab's cluster apart: no alias is in a cluster)",
    )
    args = parser.parse_args(argv)
    real = args.hosts.split(",")
    if not lab.inventory_path().exists():
        raise SystemExit("the lab is not up: `python -m lab up` and a converge first")
    rows = [HEADER]
    medians: dict[str, dict[int, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="sparkrig-fleet-") as tmp:
        tmp = Path(tmp)
        recording = args.recording or tmp / "recording.json"
        recorded_suite = {}
        base = write_inventory(tmp, real, len(real))  # the real hosts, under their first alias
        if args.converge:
            converge = measured(deploy_argv("record", tmp / "converge.json", base))
            if converge["rc"] != 0:
                raise RuntimeError(f"the converge failed:\n{converge['stderr'][-3000:]}")
        if args.recording is None or not args.recording.exists():
            print(f"recording the lab's answers ({', '.join(real)})", file=sys.stderr, flush=True)
            deploy("record", recording, base)
            if args.suite:
                result = suite("record", recording, base, fleet_names(real, len(real)), args.marker, tmp)
                recorded_suite = result["outcomes"]
                print(f"recorded suite: {result['summary']}", file=sys.stderr, flush=True)
        suite_sizes = {int(n) for n in args.suite.split(",") if n}
        for size in (int(n) for n in args.sizes.split(",")):
            inventory = write_inventory(tmp, real, size)
            runs = [deploy("replay", recording, inventory) for _ in range(args.runs)]
            rows.append(row("no-change deploy", size, runs, "0 changes"))
            medians.setdefault("no-change deploy", {})[size] = summary(runs)
            print(rows[-1], file=sys.stderr, flush=True)
            if size in suite_sizes:
                names = fleet_names(real, size)
                runs = [suite("replay", recording, inventory, names, args.marker, tmp) for _ in range(args.suite_runs)]
                wrong = disagreements(recorded_suite, runs[-1]["outcomes"], names) if recorded_suite else []
                if wrong:
                    raise RuntimeError("the replayed suite disagrees with the recorded one:\n" + "\n".join(wrong[:10]))
                check = f"{runs[-1]['summary']}; same per control" if recorded_suite else runs[-1]["summary"]
                rows.append(row(f"compliance suite (-m {args.marker})", size, runs, check))
                medians.setdefault("compliance suite", {})[size] = summary(runs)
                print(rows[-1], file=sys.stderr, flush=True)
    print(f"{date.today()}: python -m benchmarks.fleet_scale {' '.join(argv or sys.argv[1:])}")
    print("\n".join(rows))
    print(
        "\n".join(
            [
                "",
                "| side | from | to | CPU per added host | memory per added host (process tree) |",
                "| --- | --- | --- | --- | --- |",
                *added(medians),
            ]
        )
    )
    return 0


def added(medians: dict[str, dict[int, tuple[float, float]]]) -> list[str]:
    """What each host past the smaller fleet costs: (CPU, memory) differences over host differences."""
    lines = []
    for side, sizes in medians.items():
        ordered = sorted(sizes)
        for small, large in zip(ordered, ordered[1:]):
            (cpu_a, mem_a), (cpu_b, mem_b) = sizes[small], sizes[large]
            lines.append(
                f"| {side} | {small} | {large} | {1000 * (cpu_b - cpu_a) / (large - small):.1f} ms | "
                f"{(mem_b - mem_a) / (large - small):.2f} MiB |"
            )
    return lines


if __name__ == "__main__":
    sys.exit(main())
