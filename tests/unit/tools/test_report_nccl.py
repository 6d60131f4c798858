"""`sparkrig report`'s NCCL column: each host's builds, the nodes of a cluster whose builds
differ marked and named, one version in two builds on a host named (the recorded reading of
the lent H200 included)."""

from __future__ import annotations

from pathlib import Path

from sparkrig import nccl
from sparkrig.operations.updates import facts as up_facts
from sparkrig.tools import report
from tests.unit.operations.test_updates import SPARK

RECORDED = Path(__file__).parents[1] / "sparkrig/data/nccl-builds-h200.out"


def _build(sha: str, line: str = "NCCL version 2.27.7+cuda13.0") -> dict:
    return {"version": None, "library": "/usr/lib/x/libnccl.so.2", "sha256": sha * 64, "line": line}


def _facts(cluster, builds) -> dict:
    return {
        "versions": up_facts.Versions().process(SPARK),
        "firmware": None,
        "profile": "spark",
        "gpu": None,
        "known_bad": [],
        "nccl": builds,
        "cluster": cluster,
    }


def test_the_cell_of_the_recorded_h200():
    found = nccl.NcclBuilds().process(RECORDED.read_text().splitlines())
    assert report.nccl_cell(found) == "system 2.28.3+cuda13.0@2db3d5f5 venv 2.28.9+cuda13.0@1c8618b8"
    assert report.nccl_cell({}) == report.nccl_cell(None) == "-"


def test_a_cluster_whose_nodes_differ_is_marked_on_every_node_and_named():
    alike = {"system libnccl2": _build("a")}
    facts = {
        "spark-01": _facts("duo", alike),
        "spark-02": _facts("duo", {"system libnccl2": _build("b")}),
        "spark-03": _facts("trio", alike),
        "spark-04": _facts("trio", dict(alike)),
        "spark-05": _facts(None, {"system libnccl2": _build("c")}),  # in no cluster: may differ
    }
    built = report.build(facts, {}, "now")
    marked = {name: "nccl" in host["differs"] for name, host in built["hosts"].items()}
    assert marked == {"spark-01": True, "spark-02": True, "spark-03": False, "spark-04": False, "spark-05": False}
    said = built["hosts"]["spark-01"]["nccl"]["problems"]
    assert said == [
        "cluster duo: NCCL differs across its nodes: system libnccl2: spark-02 has NCCL version 2.27.7+cuda13.0 "
        "(sha256 bbbbbbbbbbbb), spark-01 has NCCL version 2.27.7+cuda13.0 (sha256 aaaaaaaaaaaa)"
    ]
    rows = {name: host["versions"] for name, host in built["hosts"].items()}
    text = report.table(rows, {}, None, None, {n: h["nccl"]["problems"] for n, h in built["hosts"].items()})
    assert "system 2.27.7+cuda13.0@aaaaaaaa *" in text
    assert "nccl: a cluster's nodes differ" in text and f"spark-02: {said[0]}" in text


def test_one_version_in_two_builds_on_a_host_is_marked_and_named():
    twins = {"venv nvidia-nccl-cu13": _build("a"), "system libnccl2": _build("b")}
    built = report.build({"spark-01": _facts(None, twins)}, {}, "now")
    host = built["hosts"]["spark-01"]
    assert "nccl" in host["differs"]
    assert host["nccl"]["problems"] == [
        "one NCCL version, two builds: system libnccl2 is NCCL version 2.27.7+cuda13.0 (sha256 bbbbbbbbbbbb), "
        "venv nvidia-nccl-cu13 is NCCL version 2.27.7+cuda13.0 (sha256 aaaaaaaaaaaa)"
    ]
