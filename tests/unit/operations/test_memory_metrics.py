"""Metrics: CMA and fragmentation. The collector (the real script, run by sh) against recorded
/proc files of this development machine (buddyinfo, vmstat, meminfo without CMA lines) and
CONSTRUCTED aarch64 meminfo with CMA lines (tests/unit/operations/data/memory/README.md); its
output checked by promtool; the alert on large free blocks tested by promtool in
tests/unit/operations/test_prometheus.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkrig.operations.metrics import deploy as md
from tests.unit.operations.test_metrics import Collector, _promtool, _replaying, samples, scratch  # noqa: F401

DATA = Path(__file__).parent / "data" / "memory"
BUDDYINFO = (DATA / "buddyinfo-dev-machine.txt").read_text()  # recorded
VMSTAT = (DATA / "vmstat-dev-machine.txt").read_text()  # recorded


@pytest.fixture
def machine(scratch) -> Collector:  # noqa: F811 - scratch: a root-only directory below /run
    return Collector(scratch)


@pytest.fixture
def proc_collector(machine: Collector, tmp_path) -> tuple[Collector, Path]:
    collector = machine
    """The collector reading /proc's meminfo, buddyinfo and vmstat from a folder of recorded files."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "buddyinfo").write_text(BUDDYINFO)
    (proc / "vmstat").write_text(VMSTAT)
    shutil.copy(DATA / "meminfo-dev-machine.txt", proc / "meminfo")
    collector.script.write_text(
        md.render_collector(
            str(collector.venv),
            path=f"{collector.bin}:/usr/bin:/bin",
            records=str(collector.records),
            reboot_file=str(collector.reboot),
            compliance_file=str(collector.compliance),
            textfile_dir=str(collector.out),
            proc=str(proc),
            timeout_s=5,
        )
    )
    _replaying(collector.bin, collector.root / "calls")
    return collector, proc


def _buddy_orders(text: str) -> dict[str, int]:
    """Free blocks per order, every node and zone summed (the test's own reading of buddyinfo)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        for order, count in enumerate(line.split()[4:]):
            found[str(order)] = found.get(str(order), 0) + int(count)
    return found


@pytest.mark.parametrize("machine_name", ["dev-machine", "h200"])
def test_free_blocks_per_order_and_compaction_come_from_the_recorded_files(proc_collector, machine_name):
    """Recorded on this development machine, and on the lent GPU machine (an H200 host,
    kernel 6.18, x86_64, 2026-11-28: data/memory/README.md)."""
    collector, proc = proc_collector
    BUDDYINFO = (DATA / f"buddyinfo-{machine_name}.txt").read_text()
    VMSTAT = (DATA / f"vmstat-{machine_name}.txt").read_text()
    for name, text in (("buddyinfo", BUDDYINFO), ("vmstat", VMSTAT)):
        (proc / name).write_text(text)
    shutil.copy(DATA / f"meminfo-{machine_name}.txt", proc / "meminfo")
    result = collector.run()
    assert result.returncode == 0, result.stderr
    found = samples(collector.prom())
    expected = _buddy_orders(BUDDYINFO)
    assert {k: int(v) for k, v in found.items() if k.startswith("sparkrig_memory_free_blocks{")} == {
        f'sparkrig_memory_free_blocks{{order="{order}"}}': count for order, count in expected.items()
    }
    vmstat = dict(line.split() for line in VMSTAT.splitlines())
    for outcome in ("stall", "fail", "success"):
        assert found[f'sparkrig_memory_compaction_total{{outcome="{outcome}"}}'] == vmstat[f"compact_{outcome}"]
    assert found["sparkrig_memory_page_size_bytes"] == "4096"
    # No CMA lines in these machines' meminfo: no CMA series.
    assert not [k for k in found if "cma" in k]


@pytest.mark.parametrize(
    ("meminfo", "total", "free", "broken"),
    [
        ("meminfo-gb10-cma-broken-CONSTRUCTED.txt", 0, 9437184 * 1024, "1"),
        ("meminfo-gb10-cma-healthy-CONSTRUCTED.txt", 524288 * 1024, 520192 * 1024, "0"),
    ],
)
def test_cma_free_above_total_is_reported_broken(proc_collector, meminfo, total, free, broken):
    collector, proc = proc_collector
    shutil.copy(DATA / meminfo, proc / "meminfo")
    assert collector.run().returncode == 0
    found = samples(collector.prom())
    assert int(found["sparkrig_memory_cma_total_bytes"]) == total
    assert int(found["sparkrig_memory_cma_free_bytes"]) == free
    assert found["sparkrig_memory_cma_accounting_broken"] == broken
    assert int(found["sparkrig_memory_total_bytes"]) == 124634368 * 1024


@pytest.mark.parametrize(
    "forged",
    [
        "Node 0, zone   Normal  1 2 x3 4\n",
        'Node 0, zone   Normal  1 2 3} 9\nsparkrig_forged{a="b"} 1\n',
        "Node 0, zone   Normal  1\x1b[2J 2\n",
    ],
)
def test_a_buddyinfo_line_not_in_the_kernels_format_is_skipped_and_forges_nothing(proc_collector, forged):
    collector, proc = proc_collector
    (proc / "buddyinfo").write_text(BUDDYINFO + forged)
    (proc / "vmstat").write_text(VMSTAT + "compact_stall 1}\ncompact_fail\x1b 2\n")
    assert collector.run().returncode == 0
    text = collector.prom()
    assert "forged" not in text and "\x1b" not in text
    found = samples(text)
    assert found['sparkrig_memory_free_blocks{order="0"}'] == str(_buddy_orders(BUDDYINFO)["0"])


def test_promtool_accepts_the_memory_series(proc_collector):
    collector, proc = proc_collector
    shutil.copy(DATA / "meminfo-gb10-cma-broken-CONSTRUCTED.txt", proc / "meminfo")
    assert collector.run().returncode == 0
    checked = subprocess.run([_promtool(), "check", "metrics"], input=collector.prom(), capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_real_proc_files_of_this_machine_are_read(machine):
    """The default paths: this machine's own /proc."""
    collector = machine
    _replaying(collector.bin, collector.root / "calls")
    assert collector.run().returncode == 0
    found = samples(collector.prom())
    orders = [k for k in found if k.startswith("sparkrig_memory_free_blocks{")]
    assert len(orders) == len(Path("/proc/buddyinfo").read_text().splitlines()[0].split()) - 4
