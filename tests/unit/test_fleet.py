"""Fleet tooling: --limit as pyinfra reads it, rollout batches and results, the per-host table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from operations.rollout import batches, failed_hosts, limit_hosts
from tests.compliance.conftest import HostTable, host_of

GROUPS = {"spark-01": ["sparks"], "spark-02": ["sparks"], "ws-01": ["workstations"], "spark-03": ["sparks"]}


@pytest.mark.parametrize(("limit", "chosen"), [
    ([], ["spark-01", "spark-02", "ws-01", "spark-03"]),
    (["workstations"], ["ws-01"]),
    (["spark-0[12]"], ["spark-01", "spark-02"]),
    (["ws-01,spark-03"], ["ws-01", "spark-03"]),
    (["ws-01", "sparks"], ["spark-01", "spark-02", "ws-01", "spark-03"]),
])
def test_limit_picks_groups_and_host_globs_in_inventory_order(limit, chosen):
    assert limit_hosts(GROUPS, limit) == chosen


def test_a_limit_that_matches_nothing_is_an_error():
    with pytest.raises(ValueError, match="--limit 'gpu-boxes' matches no host or group"):
        limit_hosts(GROUPS, ["gpu-boxes"])


def test_batches_keep_order_and_refuse_zero():
    assert batches(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
    assert batches(["a", "b"], 5) == [["a", "b"]]
    with pytest.raises(ValueError):
        batches(["a"], 0)


def test_a_batch_fails_on_an_operation_error_or_an_unreached_host():
    report = {"results": {"operations": [
        {"name": "x", "success": ["a"], "no_change": ["b"], "error": []},
        {"name": "y", "success": [], "no_change": ["a"], "error": ["b"]},
    ]}}
    assert failed_hosts(["a", "b", "c"], report) == ["b", "c"]  # c: in no result, never reached
    assert failed_hosts(["a"], report) == []


def test_host_ids_are_read_from_testinfra_ids():
    assert host_of("tests/compliance/test_swap.py::test_x[ssh://lab-deb12]") == "lab-deb12"
    assert host_of("tests/compliance/test_swap.py::test_x[local://]") == "@local"
    assert host_of("tests/unit/test_swap.py::test_y[1]") is None


def _report(nodeid, when, outcome):
    return SimpleNamespace(nodeid=nodeid, when=when, failed=outcome == "failed",
                           skipped=outcome == "skipped", passed=outcome == "passed")


def test_the_table_counts_each_control_once_by_its_worst_phase():
    table = HostTable()
    a, b = "tests/compliance/test_swap.py::test_off[ssh://{}]", "tests/compliance/test_jobs.py::test_gpu[ssh://{}]"
    for host in ("h1", "h2"):
        table.add(_report(a.format(host), "setup", "passed"))
        table.add(_report(a.format(host), "call", "passed" if host == "h1" else "failed"))
        table.add(_report(a.format(host), "teardown", "passed"))
        table.add(_report(b.format(host), "setup", "skipped"))
    lines = table.lines()
    assert lines[0].split() == ["host", "passed", "failed", "skipped"]
    assert lines[1].split() == ["h1", "1", "0", "1"]
    assert lines[2].split() == ["h2", "0", "1", "1"]
    assert lines[3:] == ["failed controls:", "  h2: test_swap.py::test_off"]
