"""
One host's last compliance outcome per concern, as sparkrig's metrics collector reads it.

    uv run python -m tools.compliance_metrics RESULTS.json HOST | \\
        ssh HOST sudo install -m 644 /dev/stdin /var/lib/sparkrig/compliance-last

RESULTS.json is a document of the compliance suite's ``--results DIR``
(tests/compliance/results.py). Each line is ``CONCERN PASSED FAILED EPOCH``: the concern (the
control's module, ``test_swap.py`` -> ``swap``), its controls that passed (a waived failure
counts as passed: the owner accepted it), those that failed or broke, and when the run ended.
Skipped controls count in neither. The collector (templates/metrics/sparkrig-metrics.sh.j2)
serves them as ``sparkrig_compliance_controls`` and
``sparkrig_compliance_last_run_timestamp_seconds`` (docs/metrics.md).
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

SCHEMA = "sparkrig.compliance.results/1"  # tests/compliance/results.py's
_MODULE = re.compile(r"test_([a-z_]{1,40})\.py")
COUNTS = {"passed": "passed", "waived": "passed", "failed": "failed", "error": "failed"}


def lines(document: dict, host: str) -> str:
    """The host's lines, sorted by concern; ValueError when the document is not a results
    document or does not name the host."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"not a compliance results document ({SCHEMA})")
    found = (document.get("hosts") or {}).get(host)
    if not isinstance(found, dict):
        raise ValueError(f"the document has no host {host!r}")
    ended = int(datetime.fromisoformat(document["finished"]).timestamp())
    counts: dict[str, dict[str, int]] = {}
    for control in found.get("controls") or []:
        module = _MODULE.fullmatch(str(control.get("id", "")).split("::", 1)[0])
        outcome = COUNTS.get(control.get("outcome"))
        if module and outcome:
            counts.setdefault(module[1], {"passed": 0, "failed": 0})[outcome] += 1
    return "".join(f"{concern} {c['passed']} {c['failed']} {ended}\n" for concern, c in sorted(counts.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tools.compliance_metrics RESULTS.json HOST", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(lines(json.loads(Path(argv[0]).read_text()), argv[1]))
    except (OSError, ValueError, KeyError) as error:
        print(f"compliance_metrics: {argv[0]}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
