"""
Rolling rollouts: the deploy on a fleet one batch of hosts at a time, stopping at the
first batch that fails, so a bad change reaches one box, not all of them.

    python -m tools.rollout inventory/spark.py [--batch N] [--limit GROUP_OR_HOST]

A plain ``pyinfra inventory/spark.py deploy.py`` deploys to every host at once, and
a failed or unreachable host is reported while the others finish; that is the right
default for converging a fleet. This runner is for changes you want to watch land:
each batch is an ordinary ``pyinfra -y --limit HOSTS INVENTORY deploy.py`` run, in
inventory order; a batch with a failed or unreachable host ends the rollout, and the
hosts after it are listed as not started. Run it again once fixed: converged hosts
report no change, so it goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def limit_hosts(groups_of: dict[str, list[str]], limit: Sequence[str]) -> list[str]:
    """The hosts (in inventory order) that pyinfra's ``--limit`` picks: each pattern
    (comma-separated, or given several times) names a group, else is a glob on host
    names. No pattern: every host. A pattern that matches nothing is an error."""
    patterns = [p.strip() for item in limit for p in item.split(",") if p.strip()]
    if not patterns:
        return list(groups_of)
    chosen: set[str] = set()
    for pattern in patterns:
        matched = {name for name, groups in groups_of.items() if pattern in groups}
        matched = matched or {name for name in groups_of if fnmatch(name, pattern)}
        if not matched:
            raise ValueError(f"--limit {pattern!r} matches no host or group of the inventory")
        chosen |= matched
    return [name for name in groups_of if name in chosen]


def batches(hosts: Sequence[str], size: int) -> list[list[str]]:
    """``hosts`` cut into consecutive batches of ``size`` (the last may be smaller)."""
    if size < 1:
        raise ValueError("--batch must be at least 1")
    return [list(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def read_inventory(inventory: str, timeout: float = 120) -> list[dict]:
    """Every host of a pyinfra inventory, in order: ``{"name", "groups", "data"}``, its data
    merged as pyinfra merges it (group_data included).

    Asked of the pyinfra CLI itself (``debug-inventory --json``, which also validates every
    host's settings), in a subprocess: importing pyinfra's CLI would monkey-patch this
    process with gevent. Raises RuntimeError with pyinfra's output when it cannot load it.
    """
    result = subprocess.run(
        [PYINFRA, str(Path(inventory).resolve()), "debug-inventory", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pyinfra could not load {inventory}:\n{result.stderr}{result.stdout}")
    return json.loads(result.stdout)


def inventory_groups(inventory: str) -> dict[str, list[str]]:
    """Each host of the inventory, in order, with its groups."""
    try:
        hosts = read_inventory(inventory)
    except RuntimeError as error:
        raise SystemExit(f"rollout: {error}") from None
    return {host["name"]: host["groups"] for host in hosts}


@dataclass
class BatchResult:
    """One batch's pyinfra run: which hosts converged, which failed (an operation failed, or
    the host was never reached)."""

    hosts: list[str]
    returncode: int
    failed: list[str]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.failed


def failed_hosts(hosts: Sequence[str], report: dict | None) -> list[str]:
    """The hosts of a batch that did not converge, from pyinfra's ``--json`` report: an
    operation failed on them, or pyinfra lists them as failed (unreachable ones included).
    A host with no operation at all (nothing to do) converged; a report without results
    (pyinfra stopped before running) fails every host."""
    results = (report or {}).get("results")
    if not isinstance(results, dict) or not isinstance(results.get("failed_hosts"), list):
        return list(hosts)
    errors = {h for op in results.get("operations") or [] for h in op.get("error", [])}
    errors |= set(results["failed_hosts"])
    return [h for h in hosts if h in errors]


def run_batch(inventory: str, hosts: Sequence[str], extra: Sequence[str]) -> BatchResult:
    """``pyinfra -y --json --limit HOSTS INVENTORY deploy.py``; its log goes to our stderr."""
    result = subprocess.run(
        [PYINFRA, "-y", "--json", *[arg for h in hosts for arg in ("--limit", h)], *extra, inventory, "deploy.py"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        report = None
    failed = failed_hosts(hosts, report) if report is not None else list(hosts)
    return BatchResult(list(hosts), result.returncode, failed)


def rollout(inventory: str, batch: int, limit: Sequence[str], extra: Sequence[str]) -> int:
    """Deploy batch after batch; the exit status (0: every host converged)."""
    # The caller's path, for the hosts and every batch alike (batches run from the repository).
    inventory = str(Path(inventory).resolve())
    hosts = limit_hosts(inventory_groups(inventory), limit)
    planned = batches(hosts, batch)
    for number, group in enumerate(planned, start=1):
        print(f"rollout: batch {number}/{len(planned)}: {', '.join(group)}", file=sys.stderr, flush=True)
        result = run_batch(inventory, group, extra)
        if not result.ok:
            rest = [h for later in planned[number:] for h in later]
            failed = ", ".join(result.failed) or f"(pyinfra exit {result.returncode})"
            not_started = ", ".join(rest) or "none"
            print(f"rollout: batch {number} FAILED on {failed}; stopped. Not started: {not_started}",
                  file=sys.stderr)
            return 1
        print(f"rollout: batch {number} converged", file=sys.stderr, flush=True)
    print(f"rollout: all {len(hosts)} hosts converged", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.rollout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inventory", help="a pyinfra inventory, e.g. inventory/spark.py")
    parser.add_argument("--batch", type=int, default=1, help="hosts per batch (default 1)")
    parser.add_argument("--limit", action="append", default=[],
                        help="only these hosts: a group or host glob, as pyinfra's --limit")
    parser.epilog = "Options after -- go to every batch's pyinfra run, e.g. -- --data hardware_profile=auto"
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        return rollout(args.inventory, args.batch, args.limit, extra)
    except ValueError as error:
        print(f"rollout: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
