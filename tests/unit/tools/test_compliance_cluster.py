"""The cluster controls' reads: what a read-only run asks of a cluster node, and what only
the action control asks (spark-cluster-check run whole, a second login to every peer)."""

from __future__ import annotations

from sparkrig.settings import all_settings, resolve
from tests.compliance import reads, test_cluster

NODES = {
    "a": {"cluster_name": "lab", "cluster_user": "spark", "cluster_interfaces": {"cx7": "192.168.100.11/24"}},
    "b": {"cluster_name": "lab", "cluster_user": "spark", "cluster_interfaces": {"cx7": "192.168.100.12/24"}},
}


def _reader() -> reads.Reader:
    return reads.Reader("a", resolve(all_settings(), NODES["a"]), {}, inventory=lambda: NODES)


def test_a_read_only_run_reads_each_check_of_a_node_and_never_runs_spark_cluster_check():
    planned = _reader()
    reads.plan(planned)  # every need the prefetch reads, as it plans a host's reading
    wanted = list(planned.wanted)
    assert any("ping -n -c 1" in c and "192.168.100.12" in c for c in wanted), wanted
    assert any("ssh -n" in c and "192.168.100.12 id -un" in c for c in wanted), wanted
    assert not any("spark-cluster-check" in c for c in wanted), [c for c in wanted if "spark-cluster-check" in c]


def test_the_action_control_asks_spark_cluster_check_as_root_and_nothing_else():
    asked = _reader()
    test_cluster.cluster_check(asked)
    assert list(asked.wanted) == [reads.command_text("spark-cluster-check", sudo=True)]
    off = reads.Reader("a", resolve(all_settings(), {}), {}, inventory=lambda: NODES)
    assert test_cluster.cluster_check(off) is None and not off.wanted
