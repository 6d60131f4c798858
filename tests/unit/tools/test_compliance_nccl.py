"""The cluster's NCCL controls (tests/compliance/test_cluster.py), run on readings: the need
answered with the reading recorded on the lent H200, the controls given each node's builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkrig import nccl
from tests.compliance import reads, test_cluster

RECORDED = (Path(__file__).parents[1] / "sparkrig/data/nccl-builds-h200.out").read_bytes()
NODE = {"me": "lab-deb12", "name": "duo", "nodes": ["lab-deb12", "lab-deb13"]}
SETTINGS = {"python_venv_path": "/opt/torch/.venv", "cluster_env_extra": {}, "cluster_env_file": "/etc/x.env"}


def _build(sha: str, line: str = "NCCL version 2.27.7+cuda13.0") -> dict:
    return {"version": None, "library": "/usr/lib/x/libnccl.so.2", "sha256": sha * 64, "line": line}


def test_the_need_reads_the_deploys_reading_as_root():
    command = nccl.NcclBuilds().command(venv=SETTINGS["python_venv_path"]).get_raw_value()
    answers = {reads.command_text(command, sudo=True): (0, RECORDED, b"")}
    found = test_cluster.nccl_builds(reads.Reader("h200", SETTINGS, answers))
    assert found["venv nvidia-nccl-cu13"]["line"] == "NCCL version 2.28.9+cuda13.0"
    assert found["system libnccl2"]["version"] == "2.28.3-1+cuda13.0"


def test_nodes_alike_pass_and_a_node_that_differs_is_named_with_both_builds():
    alike = {"system libnccl2": _build("a")}
    test_cluster.test_nccl_is_one_build_on_every_node(lambda need: alike, lambda name, need: dict(alike), NODE)
    other = {"system libnccl2": _build("b")}
    with pytest.raises(AssertionError) as raised:
        test_cluster.test_nccl_is_one_build_on_every_node(lambda need: alike, lambda name, need: other, NODE)
    said = str(raised.value)
    assert "cluster duo: NCCL differs" in said
    assert "lab-deb13 has NCCL version 2.27.7+cuda13.0 (sha256 bbbbbbbbbbbb)" in said
    assert "lab-deb12 has NCCL version 2.27.7+cuda13.0 (sha256 aaaaaaaaaaaa)" in said


def test_a_peer_that_cannot_be_read_fails_the_control_naming_it():
    def unread(name, need):
        raise AssertionError(f"depends on {name}, which could not be read: its venv's libnccl.so.2 is a link")

    with pytest.raises(AssertionError, match="depends on lab-deb13"):
        test_cluster.test_nccl_is_one_build_on_every_node(lambda need: {}, unread, NODE)


def test_one_version_two_builds_on_a_node_warns_unless_the_env_file_chooses_a_library():
    twins = {"venv nvidia-nccl-cu13": _build("a"), "system libnccl2": _build("b")}
    with pytest.warns(UserWarning, match="one NCCL version, two builds"):
        test_cluster.test_one_nccl_version_is_one_build_on_this_node(lambda need: twins, NODE, SETTINGS)
    chosen = {**SETTINGS, "cluster_env_extra": {"LD_LIBRARY_PATH": "/usr/lib/x86_64-linux-gnu"}}
    with pytest.raises(AssertionError, match="/etc/x.env sets LD_LIBRARY_PATH: a job may load either"):
        test_cluster.test_one_nccl_version_is_one_build_on_this_node(lambda need: twins, NODE, chosen)
    one = {"venv nvidia-nccl-cu13": _build("a"), "system libnccl2": _build("a")}
    test_cluster.test_one_nccl_version_is_one_build_on_this_node(lambda need: one, NODE, chosen)
