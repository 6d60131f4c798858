"""tools.compliance_metrics: a compliance results document, as the lines the metrics collector
reads, read back by the collector itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def push(text: str, path: Path) -> subprocess.CompletedProcess:
    """The push's root command, run here as the host runs it (sudo's sh -c)."""
    return subprocess.run(
        ["sh", "-c", compliance_metrics.push_command(text, str(path))], capture_output=True, text=True
    )


def test_the_collector_serves_what_the_push_wrote(scratch):  # noqa: F811
    """The file the push writes (root's, 0644, renamed into place: no temporary file left) is
    the one the collector reads, and its lines are the collector's metrics."""
    collector = Collector(scratch)
    collector.compliance.write_text("swap 0 9 1\n")  # the last run's, replaced whole
    pushed = push(compliance_metrics.lines(DOCUMENT, "spark-01"), collector.compliance)
    assert pushed.returncode == 0, pushed.stderr
    written = collector.compliance.stat()
    assert (written.st_uid, oct(written.st_mode & 0o777)) == (0, "0o644")
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith(".")) == []
    assert collector.run().returncode == 0
    found = samples(collector.prom())
    assert found['sparkrig_compliance_controls{concern="swap",outcome="failed"}'] == "1"
    assert found['sparkrig_compliance_controls{concern="watchdog",outcome="passed"}'] == "1"
    assert found['sparkrig_compliance_last_run_timestamp_seconds{concern="swap"}'] == str(ENDED)


@pytest.mark.parametrize("attack", ["link", "other owner", "group-writable", "missing"])
def test_the_push_refuses_a_directory_another_user_could_change(tmp_path, attack):
    """The push writes as root: into a directory that is a link, not root's, or writable by
    others (where a user could swap the file the collector trusts) it writes nothing."""
    if os.geteuid() != 0:
        pytest.skip("the push's checks are of root's directory: run as root")
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    directory = tmp_path / "sparkrig"
    if attack == "link":
        directory.symlink_to(real)
    elif attack != "missing":
        directory.mkdir(mode=0o755)
    if attack == "other owner":
        os.chown(directory, 1000, 1000)
    if attack == "group-writable":
        directory.chmod(0o775)
    pushed = push("swap 1 0 1\n", directory / "compliance-last")
    assert pushed.returncode != 0 and "deploy the metrics concern first" in pushed.stderr, pushed
    assert list(real.iterdir()) == [] and (attack == "link" or not (directory / "compliance-last").exists())


def test_print_writes_one_hosts_lines(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(DOCUMENT))
    printed = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "metrics-push", str(path), "--print", "spark-01"],
        capture_output=True,
        text=True,
    )
    assert (printed.returncode, printed.stdout) == (0, compliance_metrics.lines(DOCUMENT, "spark-01"))
    path.write_text("{}")
    refused = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "metrics-push", str(path), "--print", "spark-01"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 4 and "not a compliance results document" in refused.stderr, refused
