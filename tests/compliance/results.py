"""
The compliance suite's results as data, and waivers (a pytest plugin; conftest.py registers it).

    pytest tests/compliance --inventory INV --results DIR [--waivers waivers.yaml] [--fleet-page fleet.html]

``--results DIR`` writes one JSON document per run into DIR, a directory of the user's own
(made 0700 when missing; refused when it is a link, another user's, or writable by others),
named by the run's UTC start (``20261126T140322Z.json``), written atomically (a temporary
file, flushed, linked into place: never over an earlier run). Per host: the versions read
(``sparkrig report``'s) and each control's id, outcome (passed, failed, error, skipped, waived),
reason (the failure's line as the per-host table prints it, or why it was skipped), what it
protects against, and duration. With ``--fleet-page`` the page shows what changed since the
previous run in DIR.

``--waivers FILE`` (YAML) accepts known failures, each for a while:

    - control: test_swap.py::test_no_swap_is_active      # a control's id; with [params], that one alone
      hosts: "lab-deb1*"                                 # fnmatch pattern of inventory names
      justification: swap kept until the new disks arrive (ticket OPS-12)
      expires: 2026-12-31                                # the first day (UTC) it no longer applies

A waived failure is reported as waived (the table, the JSON, the page) and fails nothing; from
its expiry date on, the control fails again, saying when the waiver expired. The file is
checked before any host is contacted: a malformed one stops the run, naming the line and
what is wrong.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import inspect
import json
import os
import re
import stat
from datetime import date, datetime, timezone
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from sparkrig.tools import fleet_page, private

SCHEMA = "sparkrig.compliance.results/1"
KEYS = ("control", "hosts", "justification", "expires")
_DATE = re.compile(r"\d{4}-\d\d-\d\d")
# A previous run's document larger than this is not read (the lab's 2 hosts: 87 KB, measured).
DOCUMENT_MAX = 64 * 1024 * 1024
# How many earlier runs "since when" looks back through at most.
HISTORY_MAX = 1000


def pytest_addoption(parser):
    parser.addoption(
        "--results",
        metavar="DIR",
        help="also write this run's results as one JSON document into DIR (a directory of yours): "
        "each host's versions and every control's id, outcome, reason, protection and duration",
    )
    parser.addoption(
        "--waivers",
        metavar="FILE",
        help="YAML list of accepted failures (control, hosts, justification, expires: YYYY-MM-DD): "
        "a waived failure fails nothing until its expiry date",
    )


# --- waivers ----------------------------------------------------------------------------


class Waiver(NamedTuple):
    control: str
    hosts: str
    justification: str
    expires: date
    line: int  # where its entry starts in the file (1-based)

    def covers(self, control: str, host: str) -> bool:
        """Whether this waiver names ``control`` (an id without parameters names every one of
        them) on ``host``."""
        named = control == self.control or ("[" not in self.control and control.split("[", 1)[0] == self.control)
        return named and fnmatch.fnmatchcase(host, self.hosts)


def load_waivers(path: str) -> list[Waiver]:
    """The waivers of ``path``, or a UsageError naming the line and what is wrong."""

    def bad(line: int, why: str):
        return pytest.UsageError(f"--waivers {path} line {line}: {why}")

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise pytest.UsageError(f"--waivers {path}: cannot be read ({error})") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        raise bad(mark.line + 1 if mark else 1, f"not YAML: {getattr(error, 'problem', None) or error}") from None
    if root is None:
        return []
    if not isinstance(root, yaml.SequenceNode):
        raise bad(root.start_mark.line + 1, 'expected a list of waivers (each "- control: ...")')
    return [_waiver(entry, bad) for entry in root.value]


def _waiver(entry, bad) -> Waiver:
    line = entry.start_mark.line + 1
    if not isinstance(entry, yaml.MappingNode):
        raise bad(line, f"a waiver is a mapping of {', '.join(KEYS)}")
    fields: dict[str, tuple[str, int]] = {}
    for key, value in entry.value:
        at = key.start_mark.line + 1
        name = key.value if isinstance(key, yaml.ScalarNode) else "?"
        if name not in KEYS:
            near = difflib.get_close_matches(name, KEYS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise bad(at, f"unknown key {name!r}{hint}: a waiver has {', '.join(KEYS)}")
        if name in fields:
            raise bad(at, f"{name!r} given twice in one waiver")
        if not isinstance(value, yaml.ScalarNode) or not value.value.strip():
            raise bad(at, f"{name!r} must be a non-empty text")
        fields[name] = (value.value.strip(), at)
    missing = [key for key in KEYS if key not in fields]
    if missing:
        why = {
            "justification": " (say why this failure is accepted)",
            "expires": " (YYYY-MM-DD: no waiver lasts for ever)",
        }
        raise bad(line, "missing " + ", ".join(f"{key!r}{why.get(key, '')}" for key in missing))
    expires, at = fields["expires"]
    try:
        if not _DATE.fullmatch(expires):
            raise ValueError
        day = date.fromisoformat(expires)
    except ValueError:
        raise bad(at, f"expires {expires!r} is not a date YYYY-MM-DD") from None
    return Waiver(fields["control"][0], fields["hosts"][0], fields["justification"][0], day, line)


def today() -> date:
    """Today in UTC."""
    return datetime.now(timezone.utc).date()


def waiver_for(waivers, control: str, host: str) -> Waiver | None:
    """The waiver of ``control`` on ``host``: the first that applies today, else the first expired one."""
    found = [w for w in waivers if w.covers(control, host)]
    return next((w for w in found if today() < w.expires), found[0] if found else None)


# --- the report of one control ------------------------------------------------------------


@functools.cache  # each phase of a control reports: its id read once
def control_id(nodeid: str, host: str) -> str:
    """A control's id: its module file and name, testinfra's id of ``host`` left out
    (``test_swap.py::test_no_swap_is_active``, ``test_jobs.py::test_y[spark-run]``)."""
    path, _, test = nodeid.partition("::")
    test = test.rsplit("]@", 1)[0] + "]" if "]@" in test else test  # xdist's group suffix
    module = path.rsplit("/", 1)[-1]
    return f"{module}::{fleet_page.control_of(f'{module}::{test}', host, '', '', {}).name}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """On each report, what its control protects against (its docstring's line). A failure a
    waiver accepts is reported as an expected failure (pytest's xfail: it fails nothing, JUnit
    says skipped), the waiver on the report; one whose waiver expired stays a failure, the
    waiver on it too (:func:`waived` and :func:`expired` read them, here and in xdist's
    controller, which gets the reports' attributes)."""
    report = yield
    report.sparkrig_protects = _protects(getattr(item, "function", None))
    waivers = getattr(item.config, "sparkrig_waivers", None)
    from .conftest import item_host  # noqa: PLC0415 - conftest imports this module

    host = item_host(item) if report.failed and waivers else None
    if host is None:
        return report
    waiver = waiver_for(waivers, control_id(report.nodeid, host), host)
    if waiver is None:
        return report
    report.sparkrig_waiver = {
        "justification": waiver.justification,
        "expires": waiver.expires.isoformat(),
        "line": waiver.line,
        "expired": today() >= waiver.expires,
    }
    if not report.sparkrig_waiver["expired"]:
        report.outcome = "skipped"
        report.wasxfail = f"waived until {waiver.expires}: {waiver.justification}"
    return report


@functools.cache
def _protects(function) -> str:
    """Its "protects against" line, read once per control function (each phase of each host's
    control reports it)."""
    return fleet_page.protects(inspect.getdoc(function) or "")


def waived(report) -> str | None:
    """Why a failure was waived (for the per-host table too), or None."""
    waiver = getattr(report, "sparkrig_waiver", None)
    if waiver and not waiver["expired"] and getattr(report, "wasxfail", None) is not None:
        return f"waived until {waiver['expires']}: {waiver['justification']}"
    return None


def expired(report) -> str:
    """What a failure's line adds when its waiver expired ("" if none; the table adds it too)."""
    waiver = getattr(report, "sparkrig_waiver", None)
    return f" (its waiver expired on {waiver['expires']})" if waiver and waiver["expired"] else ""


class Record:
    """One control on one host, over its phases: the worst outcome counts (as the table's)."""

    RANK = {"error": 4, "failed": 3, "waived": 2, "skipped": 1, "passed": 0}

    def __init__(self):
        self.outcome, self.reason, self.protects, self.duration, self.waiver = "", "", "", 0.0, None

    def add(self, report) -> None:
        from .conftest import found, skipped  # noqa: PLC0415

        self.duration += getattr(report, "duration", 0.0) or 0.0
        self.protects = self.protects or getattr(report, "sparkrig_protects", "")
        self.waiver = self.waiver or getattr(report, "sparkrig_waiver", None)
        if report.failed:
            outcome, reason = ("failed" if report.when == "call" else "error"), found(report) + expired(report)
        elif waived(report):
            outcome, reason = "waived", f"{found(report)} ({waived(report)})"
        elif report.skipped:
            outcome, reason = "skipped", skipped(report)
        elif report.when == "call" and report.passed:
            outcome, reason = "passed", ""
        else:
            return
        if not self.outcome or self.RANK[outcome] > self.RANK[self.outcome]:
            self.outcome, self.reason = outcome, reason


# --- the run ------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Before conftest contacts any host: the waivers read and checked, DIR checked."""
    config.sparkrig_started = datetime.now(timezone.utc)
    RECORDS.clear()
    global _RECORDING
    _RECORDING = bool(config.getoption("--results"))
    if config.getoption("--waivers"):
        config.sparkrig_waivers = load_waivers(config.getoption("--waivers"))
    if config.getoption("--results") and not hasattr(config, "workerinput"):
        results_dir(config.getoption("--results"))


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """The versions for the JSON are read beside the controls, as --fleet-page reads them."""
    from .conftest import read_versions  # noqa: PLC0415

    config = session.config
    if config.getoption("--results") and not hasattr(config, "workerinput"):
        read_versions(config)


def pytest_runtest_logreport(report):
    """Every report, also those xdist's workers send to the controller, where --results asks."""
    if not _RECORDING:
        return
    from .conftest import _TABLE  # noqa: PLC0415

    host, _key = _TABLE.key(report.nodeid)
    if host is not None:
        key = (host, control_id(report.nodeid, host))
        record = RECORDS.get(key)
        if record is None:
            record = RECORDS[key] = Record()
        record.add(report)


# This process's records, (host, control id): Record (logreport is not handed the config),
# kept where --results writes them.
RECORDS: dict[tuple[str, str], Record] = {}
_RECORDING = False


def results_dir(given: str) -> Path:
    """DIR, made 0700 if missing; a link, another user's or one others may write is refused."""
    try:
        return private.private_directory(Path(given), "--results")
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def document(config, hosts: dict) -> dict:
    """This run's JSON document: the versions of the fleet page's ``hosts``, the records' controls."""
    records = RECORDS
    names = [*hosts, *sorted({h for h, _ in records} - set(hosts))]
    out = {}
    for name in names:
        host = hosts.get(name, fleet_page.Host())
        controls = [
            {
                "id": control,
                "host": name,
                "outcome": r.outcome,
                "reason": r.reason,
                "protects": r.protects,
                "duration_s": round(r.duration, 3),
                **({"waiver": r.waiver} if r.waiver else {}),
            }
            for (h, control), r in sorted(records.items())
            if h == name and r.outcome
        ]
        out[name] = {
            "versions": dict(host.versions),
            "versions_read": host.versions_read,
            "versions_error": host.versions_error,
            "controls": controls,
        }
    return {
        "schema": SCHEMA,
        "started": config.sparkrig_started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "inventory": config.getoption("--inventory") or ("the lab" if config.sparkrig_targets == "lab" else ""),
        "limit": list(config.getoption("--limit")),
        "waivers": config.getoption("--waivers") or "",
        "hosts": out,
    }


def write_document(directory: Path, doc: dict, started: datetime) -> Path:
    """``doc`` as DIR/<UTC start>.json: written to a temporary file, flushed, then linked to
    its name (an earlier run's file of the same second is never replaced: -1, -2 ... added)."""
    stem = started.strftime("%Y%m%dT%H%M%SZ")
    tmp = directory / f".{stem}.{os.getpid()}.tmp"
    with open(tmp, "x", encoding="utf-8") as out:
        json.dump(doc, out, indent=1, sort_keys=True)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    try:
        for n in range(100):
            path = directory / (f"{stem}.json" if n == 0 else f"{stem}-{n}.json")
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                continue
        raise pytest.UsageError(f"--results {directory}: 100 runs named {stem} already")
    finally:
        tmp.unlink()


_NAME = re.compile(r"(?P<stem>\d{8}T\d{6}Z)(?:-(?P<n>\d+))?\.json")


def run_order(name: str) -> tuple[str, int] | None:
    """Where a document's file name puts its run among the others (None: not a run's name)."""
    found = _NAME.fullmatch(name)
    return (found["stem"], int(found["n"] or 0)) if found else None


def earlier_runs(directory: Path, before: str) -> list[dict]:
    """The documents in ``directory`` of runs before the one named ``before``, newest first
    (at most HISTORY_MAX; a link, a file too large or not this schema's is passed over)."""
    limit = run_order(before)
    names = sorted(
        (p for p in directory.glob("*.json") if run_order(p.name) and run_order(p.name) < limit),
        key=lambda p: run_order(p.name),
        reverse=True,
    )[:HISTORY_MAX]
    runs = []
    for path in names:
        try:
            found = os.lstat(path)
            if not stat.S_ISREG(found.st_mode) or found.st_size > DOCUMENT_MAX:
                continue
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA and isinstance(doc.get("hosts"), dict):
            runs.append(doc)
    return runs


def pytest_sessionfinish(session):
    """The controller writes the document (before the terminal summary writes the page)."""
    config = session.config
    if not config.getoption("--results") or hasattr(config, "workerinput"):
        return
    from .conftest import _TABLE, page_hosts  # noqa: PLC0415

    directory = results_dir(config.getoption("--results"))
    doc = document(config, page_hosts(config, _TABLE))
    path = write_document(directory, doc, config.sparkrig_started)
    config.sparkrig_results = path
    config.sparkrig_changes = fleet_page.changes(doc, earlier_runs(directory, path.name))


def page_changes(config):
    """What changed since the previous run in DIR, for the fleet page (None without --results)."""
    return getattr(config, "sparkrig_changes", None)


def summary_lines(config) -> list[str]:
    """The run's last lines: where its results went."""
    path = getattr(config, "sparkrig_results", None)
    return [f"results: {path}"] if path else []
