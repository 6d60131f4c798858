"""
The compliance suite against the hosts of a pyinfra inventory: every control of every concern,
each host checked against the settings pyinfra would deploy to it (group_data included).

    sparkrig check INVENTORY [--limit GROUP_OR_HOST] [--fleet-page PATH] [--results DIR]
                   [--waivers FILE] [--junitxml PATH] [--metrics-push] [-- PYTEST_OPTIONS]

The suite is the package's sparkrig.compliance (a checkout's tests/compliance): this runs it as
``pytest tests/compliance --inventory INVENTORY`` does in a checkout, with the same controls,
the same table per host at the end (each failed control one line: what it found), the same
fleet page (--fleet-page), results document (--results DIR: one JSON file per run) and waivers
(--waivers FILE: failures the owner accepted until a date, docs/fleets.md). It runs from any
directory, the inventory and its group_data read as pyinfra reads them there. --metrics-push
then writes each host's outcome where its metrics collector serves it (sparkrig metrics-push).
Options after -- go to pytest (``-- -k swap``, ``-- -m read``, ``-- --tb=short``).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from sparkrig import compliance
from sparkrig.compliance import selection
from sparkrig.tools import cli

SUITE = Path(compliance.__file__).parent
# pytest's configuration for the suite (its options and markers): never the caller's.
CONFIG = Path(__file__).with_name("check.ini")
# pytest's exit statuses that are not cli's: its own failure and a selection that ran nothing.
STATUSES = (
    (3, "pytest failed on its own (an internal error)"),
    (4, "an input file is refused (the inventory or its settings, --waivers, --results), or a pytest option"),
    (5, "the selection left no control to run"),
    (130, "interrupted (Ctrl+C)"),
)


def suite_args(
    inventory: str,
    limit: Sequence[str] = (),
    *,
    fleet_page: str | None = None,
    results: str | None = None,
    waivers: str | None = None,
    junitxml: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """pytest's command line for the suite on ``inventory``'s hosts: the suite's folder, its
    configuration (:data:`CONFIG`), the caller's directory as pytest's root (where the suite
    keeps its SSH config, under .pytest_cache), no conftest.py above the suite. typeguard's
    plugin is left out: pyinfra imported typeguard already, and pytest would warn of it."""
    return [
        str(SUITE),
        "-c",
        str(CONFIG),
        f"--rootdir={Path.cwd()}",
        f"--confcutdir={SUITE}",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:typeguard",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--inventory",
        inventory,
        *[arg for host in limit for arg in ("--limit", host)],
        *([f"--fleet-page={fleet_page}"] if fleet_page else []),
        *([f"--results={results}"] if results else []),
        *([f"--waivers={waivers}"] if waivers else []),
        *([f"--junitxml={junitxml}"] if junitxml else []),
        *extra,
    ]


def command(
    inventory: str,
    limit: Sequence[str] = (),
    *,
    junitxml: str | None = None,
    metrics_push: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """``sparkrig check`` as a subprocess of this Python (a rollout's proof, the lab tests), on
    ``limit``'s hosts, pytest's ``extra`` options after ``--``."""
    return [
        sys.executable,
        "-m",
        "sparkrig.tools",
        "check",
        inventory,
        *[arg for host in limit for arg in ("--limit", host)],
        *([f"--junitxml={junitxml}"] if junitxml else []),
        *(["--metrics-push"] if metrics_push else []),
        "--",
        *extra,
    ]


class _Read:
    """A plugin handing the suite the inventory as :func:`main` read it, (limit, hosts): the
    conftest keeps its readings on the config by --limit, and pyinfra takes a second a reading."""

    def __init__(self, limit: Sequence[str], hosts: dict):
        self.limit, self.hosts = list(limit), hosts

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        config.__dict__.setdefault("_sparkrig_inventories", {})[",".join(self.limit)] = self.hosts


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    return (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])


@cli.command("check", "the compliance suite on an inventory's hosts: a table per host, a fleet page, results")
def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("check", __doc__, STATUSES)
    parser.add_argument("inventory", help="a pyinfra inventory, e.g. inventory/spark.py")
    parser.add_argument(
        "--limit", action="append", default=[], help="only these hosts: a group or host glob, as pyinfra's --limit"
    )
    parser.add_argument("--fleet-page", metavar="PATH", help="also write the fleet page (one HTML file) to PATH")
    parser.add_argument("--results", metavar="DIR", help="also write the run's results, one JSON document, into DIR")
    parser.add_argument("--waivers", metavar="FILE", help="failures accepted until a date (docs/fleets.md)")
    parser.add_argument("--junitxml", metavar="PATH", help="also write JUnit XML to PATH")
    parser.add_argument(
        "--metrics-push",
        action="store_true",
        help="then write each host's outcome where its metrics collector serves it (sparkrig metrics-push)",
    )
    ours, extra = _split(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(ours)
    return cli.answer("check", lambda: _check(args, extra))


def _check(args, extra: Sequence[str]) -> int:
    # Each host's reads go out before the suite is loaded (the suite's early.py).
    from sparkrig.compliance import early  # noqa: PLC0415 - imports nothing heavy

    early.start(suite_args(args.inventory, args.limit))
    early.collect_later(suite_args(args.inventory, args.limit))
    # Read once here: a refused inventory or settings value is one line before pytest starts.
    from sparkrig.compliance.targets import inventory_host_data  # noqa: PLC0415 - loads every concern

    read = _Read(args.limit, inventory_host_data(args.inventory, args.limit))
    extra = [*selection.read_only_options(extra), *extra]
    with tempfile.TemporaryDirectory(prefix="sparkrig-check-") as scratch:
        results = args.results or (scratch if args.metrics_push else None)
        before = set(Path(results).glob("*.json")) if results and Path(results).is_dir() else set()
        status = int(
            pytest.main(
                suite_args(
                    args.inventory,
                    args.limit,
                    fleet_page=args.fleet_page,
                    results=results,
                    waivers=args.waivers,
                    junitxml=args.junitxml,
                    extra=extra,
                ),
                plugins=[read],
            )
        )
        if status in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and args.metrics_push:
            from sparkrig.tools import compliance_metrics  # noqa: PLC0415 - only when asked

            written = sorted(set(Path(results).glob("*.json")) - before)
            if not written:
                print("check: --metrics-push: the run wrote no results document", file=sys.stderr)
                return cli.FAILED
            pushed = compliance_metrics.push_document(written[-1], args.inventory, args.limit)
            status = status or pushed
    return 130 if status == pytest.ExitCode.INTERRUPTED else status
