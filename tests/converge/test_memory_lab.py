"""
Memory in the lab, real programs on a lab host: sparkrig's metrics collector (the script the
metrics concern installs, rendered here and run by the host's own sh as root) exports free
blocks per order from the host's real /proc/buddyinfo and the compaction counters of its real
/proc/vmstat, and spark-preflight's fragmentation check counts the same blocks. Lab hosts
share the controller's kernel (nspawn): /proc/buddyinfo is the controller's, read through the
host, and it changes from one read to the next: the collector is run on a copy of the host's
files taken at one moment (exact numbers), and on /proc itself (every order there).
"""

from __future__ import annotations

import shlex

import pytest

import lab
from sparkrig import rendering
from sparkrig.operations.metrics import deploy as md

pytestmark = pytest.mark.lab

HOST = "lab-deb12-b"


def _run_as_root(script: str, *args: str) -> str:
    remote = "/root/sparkrig-test-script"
    lab.run_ssh(HOST, f"sudo sh -c 'cat > {remote}'", input=script)
    return lab.run_ssh(HOST, f"sudo sh {remote} {' '.join(shlex.quote(a) for a in args)}").stdout


def _exported(prom: str) -> dict[int, int]:
    return {
        int(line.split('order="')[1].split('"')[0]): int(line.split()[-1])
        for line in prom.splitlines()
        if line.startswith("sparkrig_memory_free_blocks{")
    }


def test_the_collector_exports_the_hosts_real_buddyinfo_and_vmstat(lab_hosts):
    assert HOST in {h.name for h in lab_hosts}
    out, snap = "/root/sparkrig-test-textfile", "/root/sparkrig-test-proc"
    # The host's /proc as it reads it, and a copy of its buddyinfo, vmstat and meminfo taken at
    # one moment (the controller's memory changes between two reads): the collector run on the
    # copy must give exactly its numbers; run on /proc itself, every order must be there.
    lab.run_ssh(
        HOST,
        f"sudo sh -c 'mkdir -p {out} {snap} && chmod 755 {out} && "
        f"for f in buddyinfo vmstat meminfo; do cat /proc/$f > {snap}/$f; done'",
    )
    buddy = lab.run_ssh(HOST, f"sudo cat {snap}/buddyinfo").stdout
    vmstat = dict(line.split() for line in lab.run_ssh(HOST, f"sudo cat {snap}/vmstat").stdout.splitlines())
    _run_as_root(md.render_collector("", textfile_dir=out, proc=snap))
    prom = lab.run_ssh(HOST, f"sudo cat {out}/{md.TEXTFILE}").stdout
    orders = len(buddy.splitlines()[0].split()) - 4
    summed = {o: sum(int(line.split()[4 + o]) for line in buddy.splitlines()) for o in range(orders)}
    assert _exported(prom) == summed, prom
    for outcome in ("stall", "fail", "success"):
        assert f'sparkrig_memory_compaction_total{{outcome="{outcome}"}} {vmstat[f"compact_{outcome}"]}\n' in prom
    _run_as_root(md.render_collector("", textfile_dir=out))
    live = lab.run_ssh(HOST, f"sudo cat {out}/{md.TEXTFILE}").stdout
    assert sorted(_exported(live)) == list(range(orders)), live
    print("\n".join(line for line in live.splitlines() if line.startswith("sparkrig_memory_")))


def test_spark_preflight_counts_the_hosts_large_blocks(lab_hosts):
    assert HOST in {h.name for h in lab_hosts}
    script = rendering.render(
        "jobs/spark-preflight.sh.j2",
        min_available_kib=1,
        min_large_blocks=0,
        large_order=9,
        watchdog_service="",
    )
    # Run as the login user (spark-preflight is every user's): a root-owned copy they may read.
    remote = "/usr/local/lib/sparkrig-test-preflight"
    lab.run_ssh(HOST, f"sudo sh -c 'cat > {remote} && chmod 644 {remote}'", input=script)
    ok = lab.run_ssh(HOST, f"sh {remote} --min-large-blocks 1", check=False)
    line = next(line for line in ok.stdout.splitlines() if "fragmentation" in line)
    assert line.startswith(("OK fragmentation: ", "FAIL fragmentation: ")), ok.stdout
    huge = lab.run_ssh(HOST, f"sh {remote} --min-large-blocks 999999999", check=False)
    assert huge.returncode & 128 and "FAIL fragmentation:" in huge.stdout, huge.stdout
    # Not root: --compact cannot write the knob, and says so.
    compact = lab.run_ssh(HOST, f"sh {remote} --min-large-blocks 999999999 --compact", check=False)
    assert "compact_memory is not writable; run as root" in compact.stdout, compact.stdout
    print(line)
