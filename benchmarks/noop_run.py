"""
How fast a converged fleet is checked: the no-change run and the compliance suite.

    uv run python -m benchmarks.noop_run                    # hosts 1,4,8; RTT 0 and 50 ms
    uv run python -m benchmarks.noop_run --hosts 1 --runs 3 --rtt-ms 50

For each fleet size it boots a fresh lab fleet (Debian 12 and 13 alternating), converges
it, checks that a second run changes nothing, then, for each added round-trip time,
measures:

- the no-change run of the full deploy (`pyinfra -y inventory deploy.py`): wall time,
  median of ``--runs`` runs, each of which must report zero changes, with the CPU time of
  pyinfra's process (the controller's own cost) and of the whole machine in that run
  (the lab hosts included: here they share the controller's cores, on a fleet each host
  does its own part on its own CPU);
- the remote commands per host, counted from pyinfra's own debug output (one
  "Running command on HOST" line per command; the SSH connection itself is not one);
- the compliance suite (`pytest tests/compliance --inventory`): wall time (median of up to
  three runs), per host,
  and the commands testinfra ran per host (counted by ``benchmarks/count_commands.py``).

``--baseline DIR`` (repeatable) also times another checkout's no-change run (DIR, with its own ``.venv``:
say, a worktree of the commit before a change) on the same converged fleet, its runs and this
checkout's taking turns, so both see the same machine; its rows are marked "baseline".

Latency comes from ``benchmarks/relay.py``, a delaying TCP relay on 127.0.0.1 in front of
each lab host's sshd (``netem`` is not available here). It prints one Markdown table and
tears the lab down. Not a test: nothing here passes or fails on a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import lab
from lab.config import KNOWN_HOSTS
from lab.stack import make_locks

REPO = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
COMMAND_LINE = re.compile(r"Running command on ([^:]+):")
FLAVOURS = ("debian12", "debian13")
COMPLIANCE_RUNS = 3  # at most: the suite's median of that many runs (8 hosts take a minute each)


@dataclass
class Row:
    hosts: int
    rtt_ms: float
    deploy_s: float
    deploy_runs: list[float]
    commands: dict[str, int]
    compliance_s: float
    compliance_commands: dict[str, int]
    compliance_outcome: str
    controller_cpu_s: float = float("nan")
    machine_cpu_s: float = float("nan")
    compliance_runs: list[float] = field(default_factory=list)
    code: str = "this checkout"


def fleet(size: int) -> list[tuple[str, str]]:
    return [(f"bench-{i}", FLAVOURS[(i - 1) % 2]) for i in range(1, size + 1)]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, **kwargs)


def machine_cpu_s() -> float:
    """CPU time the whole machine has spent busy so far (/proc/stat's first line)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def deploy(inventory: Path | str, *args: str, tree: Path = REPO) -> tuple[float, subprocess.CompletedProcess]:
    """``pyinfra -y ARGS INVENTORY deploy.py`` of the checkout ``tree`` (its own .venv), from there."""
    pyinfra = PYINFRA if tree == REPO else str(tree / ".venv" / "bin" / "pyinfra")
    started = time.monotonic()
    result = subprocess.run(
        [pyinfra, "-y", *args, str(inventory), "deploy.py"], cwd=tree, capture_output=True, text=True, timeout=3600
    )
    return time.monotonic() - started, result


def deploy_costs(
    inventory: Path | str, *args: str, tree: Path = REPO
) -> tuple[float, float, float, subprocess.CompletedProcess]:
    """One deploy: its wall time, pyinfra's CPU time and the whole machine's CPU time."""
    controller, machine = children_cpu_s(), machine_cpu_s()
    seconds, result = deploy(inventory, *args, tree=tree)
    return seconds, children_cpu_s() - controller, machine_cpu_s() - machine, result


def changes(result: subprocess.CompletedProcess) -> int:
    """Operations that changed something, from `pyinfra --json`'s report."""
    report = json.loads(result.stdout)
    return sum(len(op["success"]) for op in report["results"]["operations"])


class Relays:
    """``benchmarks.relay`` in front of every host, or nothing at RTT 0."""

    def __init__(self, hosts: list[dict], rtt_ms: float):
        self.process = None
        self.ports: dict[str, int] = {}
        if rtt_ms <= 0:
            return
        pairs = [f"127.0.0.1:0={host['address']}:22" for host in hosts]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.relay", "--rtt-ms", str(rtt_ms), *pairs],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline().split()
        if not line or line[0] != "ready":
            self.close()
            raise RuntimeError("the relay did not start")
        for host, pair in zip(hosts, line[1:]):
            self.ports[host["name"]] = int(pair.split("=")[0].rsplit(":", 1)[1])

    def close(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=10)


def write_inventory(directory: Path, hosts: list[dict], ports: dict[str, int]) -> Path:
    """The lab inventory, with each host reached through its relay port (when there is one)."""
    known = Path(KNOWN_HOSTS).read_text().splitlines()
    lines = []
    for host in hosts:
        port = ports.get(host["name"])
        for line in known:
            if port and line.split(" ", 1)[0] == host["address"]:
                lines.append(f"[127.0.0.1]:{port} {line.split(' ', 1)[1]}")
    (directory / "known_hosts").write_text("\n".join(lines + known) + "\n")
    inventory = directory / "bench_inventory.py"
    inventory.write_text(
        "from inventory.lab import lab as _lab\n"
        f"_ports = {dict(ports)!r}\n"
        "lab = []\n"
        "for _name, _data in _lab:\n"
        "    if _name in _ports:\n"
        "        _data = {**_data, 'ssh_hostname': '127.0.0.1', 'ssh_port': _ports[_name],\n"
        f"                 'ssh_known_hosts_file': {str(directory / 'known_hosts')!r}}}\n"
        "    lab.append((_name, _data))\n"
    )
    return inventory


def measure(
    size: int, rtt_ms: float, runs: int, hosts: list[dict], compliance: bool, baselines: list[Path] = ()
) -> list[Row]:
    """This checkout's row (after each baseline's, when there are some) at one RTT."""
    relays = Relays(hosts, rtt_ms)
    trees = [*baselines, REPO]
    try:
        with tempfile.TemporaryDirectory(prefix="sparkrig-bench-") as tmp:
            inventory = write_inventory(Path(tmp), hosts, relays.ports)
            times, controller_cpu, machine_cpu = ({tree: [] for tree in trees} for _ in range(3))
            for _ in range(runs):
                for tree in trees:  # taking turns: both see the same machine
                    seconds, controller, machine, result = deploy_costs(inventory, "--json", tree=tree)
                    if result.returncode != 0 or changes(result):
                        raise RuntimeError(f"the no-change run changed something or failed:\n{result.stderr[-3000:]}")
                    times[tree].append(seconds)
                    controller_cpu[tree].append(controller)
                    machine_cpu[tree].append(machine)
            commands = {}
            for tree in trees:
                _, debug = deploy(inventory, "--debug", tree=tree)
                commands[tree] = Counter(COMMAND_LINE.findall(debug.stderr + debug.stdout))
            compliance_s, compliance_runs, counted, outcome = float("nan"), [], {}, "not measured"
            if compliance:
                counts = Path(tmp) / "counts.json"
                for _ in range(min(runs, COMPLIANCE_RUNS)):
                    started = time.monotonic()
                    result = run(
                        [
                            sys.executable,
                            "-m",
                            "pytest",
                            "-q",
                            "--durations=8",
                            "-p",
                            "benchmarks.count_commands",
                            "-p",
                            "no:cacheprovider",
                            "tests/compliance",
                            "--inventory",
                            str(inventory),
                        ],
                        timeout=3600,
                        env={**os.environ, "SPARKRIG_BENCH_COUNTS": str(counts)},
                    )
                    compliance_runs.append(time.monotonic() - started)
                    outcome = (result.stdout.strip().splitlines() or ["?"])[-1].strip("= ")
                    slowest = result.stdout.split("slowest", 1)[-1].split("\n\n", 1)[0]
                    print(f"bench: slowest controls at {rtt_ms:g} ms:{slowest}", file=sys.stderr, flush=True)
                    counted = json.loads(counts.read_text()) if counts.exists() else {}
                compliance_s = statistics.median(compliance_runs)
    finally:
        relays.close()
    rows = []
    for tree in trees:
        ours = tree == REPO
        rows.append(
            Row(
                size,
                rtt_ms,
                statistics.median(times[tree]),
                times[tree],
                dict(commands[tree]),
                compliance_s if ours else float("nan"),
                counted if ours else {},
                outcome if ours else "not measured",
                statistics.median(controller_cpu[tree]),
                statistics.median(machine_cpu[tree]),
                compliance_runs if ours else [],
                "this checkout" if ours else f"baseline {tree}",
            )
        )
    return rows


def _seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f} s"


def _spread(runs: list[float]) -> str:
    return f" ({', '.join(f'{t:.1f}' for t in runs)})" if len(runs) > 1 else ""


def _cpu(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f} s"


def _span(values) -> str:
    found = sorted(set(values))
    if not found:
        return "?"
    return str(found[0]) if len(found) == 1 else f"{found[0]}-{found[-1]}"


def table(rows: list[Row]) -> str:
    compared = any(row.code != "this checkout" for row in rows)
    lines = [
        "| "
        + "code | " * compared
        + "hosts | added RTT | no-change deploy (median) | runs | pyinfra CPU | machine CPU | "
        "remote commands per host | compliance suite | per host | testinfra commands per host | suite result |",
        "| " + "--- | " * compared + "--- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            "| " + f"{row.code} | " * compared + f"{row.hosts} | {row.rtt_ms:g} ms | {row.deploy_s:.2f} s | "
            f"{', '.join(f'{t:.2f}' for t in row.deploy_runs)} | "
            f"{_cpu(row.controller_cpu_s)} | {_cpu(row.machine_cpu_s)} | "
            f"{_span(row.commands.values())} | "
            f"{_seconds(row.compliance_s)}{_spread(row.compliance_runs)} | {_seconds(row.compliance_s / row.hosts)} | "
            f"{_span(row.compliance_commands.values())} | {row.compliance_outcome} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--hosts", default="1,4,8", help="fleet sizes, comma-separated")
    parser.add_argument("--rtt-ms", default="0,50", help="added round-trip times, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="no-change runs per measurement")
    parser.add_argument(
        "--compliance-hosts",
        default="1,4,8",
        help="fleet sizes at which the compliance suite is measured too (comma-separated, '' for none)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        action="append",
        default=[],
        help="another checkout (with its own .venv) whose no-change run is timed too, in turns (repeatable)",
    )
    args = parser.parse_args(argv)
    rows = []
    try:
        for size in (int(n) for n in args.hosts.split(",")):
            print(f"bench: {size} host(s): lab up and first converge", file=sys.stderr, flush=True)
            lab.up(fleet(size))
            make_locks()  # the lab's stand-in Python stack, locked as `python -m lab up` does
            hosts = json.loads(lab.inventory_path().read_text())["hosts"]
            seconds, first = deploy("inventory/lab.py")
            if first.returncode != 0:
                raise RuntimeError(f"the first converge failed:\n{first.stderr[-3000:]}")
            print(f"bench: first converge of {size} host(s) took {seconds:.0f} s", file=sys.stderr, flush=True)
            for rtt in (float(r) for r in args.rtt_ms.split(",")):
                compliance = str(size) in args.compliance_hosts.split(",")
                measured = measure(size, rtt, args.runs, hosts, compliance, [b.resolve() for b in args.baseline])
                rows += measured
                print("\n".join(table(measured).splitlines()[2:]), file=sys.stderr, flush=True)
    finally:
        lab.down()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
