"""
Where the read-only compliance suite's wall time goes, beside the deploy's no-change run.

    SPARKRIG_LAB_ID=8 uv run python -m benchmarks.suite_phases --fleets 1,8 --rtt-ms 0,50 --runs 3 [--cold]

On a running, converged lab (it boots nothing), for each added round-trip time (``benchmarks.relay``
in front of each host's sshd) and each fleet (the lab's hosts, then aliases of them, as
``benchmarks.compliance_reads`` makes them), it runs ``pytest tests/compliance --inventory
-m read`` with this module as a plugin, which records when each phase begins and ends:

- start-up: from the process's start (this runner's clock) to the end of pytest's configure
  (interpreter, pytest and the suite imported, the inventory loaded, the prefetch started);
- the host's reading: the prefetch, every host's rounds side by side, timed at the controller
  (so the round trips are in it), running beside collection;
- collection: pytest collecting the controls after configure;
- waiting: from the end of collection to the first control (the prefetch's remainder);
- the controls: first control's start to last control's end;
- the rest: what is left of the wall time (reports, the per-host table, exit).

and the no-change deploy of the same fleet (``pyinfra -y INVENTORY deploy.py``, which must
report no change) where the fleet is the lab's own hosts: an alias is no host Prometheus
scrapes, so a deploy to aliases would change the Prometheus host's targets. Medians of
``--runs``. Not a test: nothing here passes or fails on a time.
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

import pytest

from benchmarks.suite_command import read_only_suite

# --- the plugin (-p benchmarks.suite_phases), in pytest's process -----------------------

_MARKS: dict[str, float] = {}


def _mark(name: str, first: bool = True) -> None:
    if first and name in _MARKS:
        return
    _MARKS[name] = time.time()


def _wrap_prefetch() -> None:
    from tests.compliance import reads  # noqa: PLC0415 - only when pytest loads the plugin

    prefetch = reads.prefetch

    def timed(*args, **kwargs):
        _mark("prefetch_start")
        try:
            return prefetch(*args, **kwargs)
        finally:
            _mark("prefetch_end", first=False)

    reads.prefetch = timed


def pytest_load_initial_conftests(early_config, parser, args):
    _mark("plugin")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    # After the suite's first conftest sent the early reads, before its configure starts the
    # prefetch: importing reads.py at load_initial_conftests sent them late (one host at +50 ms
    # timed 1.09 s instead of 0.90 s, 2026-11-29).
    _wrap_prefetch()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    _mark("configured")  # after the suite's own configure: inventory loaded, prefetch started


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    _mark("collected")  # before the suite waits there for the host's reading


def pytest_runtest_call(item):
    _mark("first_call")


def pytest_runtest_teardown(item):
    _mark("last_call", first=False)


def pytest_unconfigure(config):
    path = os.environ.get("SPARKRIG_BENCH_PHASES")
    if path and not hasattr(config, "workerinput"):  # the controller's, not an xdist worker's
        Path(path).write_text(json.dumps(_MARKS))


# --- the runner -------------------------------------------------------------------------

PHASES = ("start-up", "host's reading", "collection", "waiting", "controls", "rest")


def phases(marks: dict[str, float], started: float, ended: float) -> dict[str, float]:
    """Each phase's seconds from the plugin's marks (epoch seconds) and the run's start and end."""
    configured = marks.get("configured", started)
    collected = marks.get("collected", configured)
    first, last = marks.get("first_call", collected), marks.get("last_call", collected)
    found = {
        "start-up": configured - started,
        "host's reading": marks.get("prefetch_end", configured) - marks.get("prefetch_start", configured),
        "collection": collected - configured,
        "waiting": max(0.0, first - collected),
        "controls": last - first,
        "rest": ended - last,
    }
    return {name: max(0.0, seconds) for name, seconds in found.items()}


def cold(names: list[str]) -> None:
    """End the suite's shared SSH connections to ``names`` (they persist 60 s after a run):
    the next run connects as a run a minute after the last one does."""
    for config in (REPO / ".pytest_cache").glob("sparkrig-ssh-config-*"):
        for name in names:
            subprocess.run(["ssh", "-F", str(config), "-O", "exit", name], capture_output=True, check=False)


def suite(inventory: Path, names: list[str], tmp: Path) -> tuple[float, dict[str, float], str]:
    marks_file = tmp / "phases.json"
    marks_file.unlink(missing_ok=True)
    started = time.time()
    result = subprocess.run(
        read_only_suite(inventory, plugins=["benchmarks.suite_phases"], limit=",".join(names)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "SPARKRIG_BENCH_PHASES": str(marks_file)},
    )
    ended = time.time()
    marks = json.loads(marks_file.read_text()) if marks_file.exists() else {}
    lines = result.stdout.strip().splitlines()
    outcome = (lines or ["?"])[-1].strip("= ")
    # The failed controls, one line each under the per-host table (for the table's reader).
    failed = lines[lines.index("failed controls:") + 1 :] if "failed controls:" in lines else []
    for line in failed:
        if line.startswith("  "):
            print(f"failed: {line.strip()[:300]}", file=sys.stderr)
    return ended - started, phases(marks, started, ended), outcome


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s" if values else "-"


def main(argv: list[str] | None = None) -> int:
    import lab  # noqa: PLC0415 - the runner alone needs the lab
    from benchmarks.compliance_reads import fleet_inventory, fleet_names  # noqa: PLC0415
    from benchmarks.noop_run import Relays, changes, deploy  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rtt-ms", default="0,50")
    parser.add_argument("--fleets", default="1,8", help="inventory sizes (names cycle over the lab's hosts)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--cold", action="store_true", help="each run connects anew (no SSH connection left from the run before)"
    )
    args = parser.parse_args(argv)
    # Python writes each module's bytecode once, and a user's runs read it after; with
    # PYTHONDONTWRITEBYTECODE (set on this machine) every run compiled the checkout's modules
    # again, half a second of the start-up. One run first, unmeasured, writes it.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    hosts = json.loads(lab.inventory_path().read_text())["hosts"]
    rows = [
        "| hosts | added RTT | suite wall (median) | runs | "
        + " | ".join(PHASES)
        + " | no-change deploy (median) | suite result |",
        "| --- " * (len(PHASES) + 6) + "|",
    ]
    for rtt in (float(r) for r in args.rtt_ms.split(",")):
        relays = Relays(hosts, rtt)
        try:
            with tempfile.TemporaryDirectory(prefix="sparkrig-bench-") as tmp:
                for size in (int(n) for n in args.fleets.split(",")):
                    inventory = fleet_inventory(Path(tmp), hosts, relays.ports, size)
                    names = fleet_names(hosts, size)
                    walls, parts, outcome, deploys = [], {p: [] for p in PHASES}, "", []
                    suite(inventory, names, Path(tmp))  # unmeasured: bytecode written, connections open
                    for _ in range(args.runs):
                        if args.cold:
                            cold(names)
                        wall, split, outcome = suite(inventory, names, Path(tmp))
                        walls.append(wall)
                        for name, seconds in split.items():
                            parts[name].append(seconds)
                        if size <= len(hosts):
                            seconds, result = deploy(inventory, "--json", *[a for n in names for a in ("--limit", n)])
                            if result.returncode != 0 or changes(result):
                                raise RuntimeError(f"the no-change deploy changed or failed: {result.stderr[-2000:]}")
                            deploys.append(seconds)
                    row = (
                        f"| {size} | {rtt:g} ms | {_median(walls)} | {', '.join(f'{w:.2f}' for w in walls)} | "
                        + " | ".join(_median(parts[p]) for p in PHASES)
                        + f" | {_median(deploys) if deploys else 'not on aliases'} | {outcome} |"
                    )
                    rows.append(row)
                    print(row, file=sys.stderr, flush=True)
        finally:
            relays.close()
    print("\n".join(rows))
    return 0


REPO = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    sys.exit(main())
