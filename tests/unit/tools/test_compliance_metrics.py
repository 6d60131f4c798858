"""tools.compliance_metrics: a compliance results document, as the lines the metrics collector
reads, read back by the collector itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparkrig.tools import compliance_metrics
from tests.compliance import results
from tests.unit.operations.test_metrics import Collector, samples, scratch  # noqa: F401 (scratch: a fixture)

DOCUMENT = {
    "schema": results.SCHEMA,
    "started": "2026-11-26T14:00:00+00:00",
    "finished": "2026-11-26T14:03:20+00:00",
    "hosts": {
        "spark-01": {
            "controls": [
                {"id": "test_swap.py::test_no_swap_is_active", "outcome": "passed"},
                {"id": "test_swap.py::test_fstab_has_no_swap[/swap.img]", "outcome": "failed"},
                {"id": "test_swap.py::test_zram_is_masked", "outcome": "skipped"},
                {"id": "test_watchdog.py::test_earlyoom_runs", "outcome": "waived"},
                {"id": "test_watchdog.py::test_earlyoom_args", "outcome": "error"},
                {"id": "../evil.py::x", "outcome": "failed"},
            ]
        }
    },
}
ENDED = 1795701800  # 2026-11-26T14:03:20Z


def test_each_concern_counts_its_passed_and_failed_controls():
    assert results.SCHEMA == compliance_metrics.SCHEMA
    assert compliance_metrics.lines(DOCUMENT, "spark-01") == (f"swap 1 1 {ENDED}\nwatchdog 1 1 {ENDED}\n")


@pytest.mark.parametrize(
    ("document", "host", "said"),
    [
        ({"schema": "other"}, "spark-01", "not a compliance results document"),
        (DOCUMENT, "spark-02", "no host 'spark-02'"),
    ],
)
def test_a_wrong_document_or_host_is_refused(document, host, said):
    with pytest.raises(ValueError, match=said):
        compliance_metrics.lines(document, host)


def test_the_collector_serves_what_the_tool_wrote(tmp_path, scratch):  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("the collector writes only into a directory root owns")
    collector = Collector(scratch)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(DOCUMENT))
    written = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools.compliance_metrics", str(path), "spark-01"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    collector.compliance.write_text(written)
    assert collector.run().returncode == 0
    found = samples(collector.prom())
    assert found['sparkrig_compliance_controls{concern="swap",outcome="failed"}'] == "1"
    assert found['sparkrig_compliance_controls{concern="watchdog",outcome="passed"}'] == "1"
    assert found['sparkrig_compliance_last_run_timestamp_seconds{concern="swap"}'] == str(ENDED)
