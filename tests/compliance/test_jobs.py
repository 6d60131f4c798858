"""
Job wrapper controls: training.slice caps the jobs' memory, spark-run puts a job in
it with a raised OOM score, spark-preflight passes on a converged host and
spark-drop-caches works as root.

The expected caps are worked out here from the settings and the host's memory the
way systemd computes them, independently of operations/jobs.py.
"""

from __future__ import annotations

import re
import shlex

import pytest

SLICE = "training.slice"
COMMANDS = ["spark-run", "spark-preflight", "spark-drop-caches"]
UINT32_MAX = 2**32 - 1
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _physical(host) -> tuple[int, int]:
    """The host's memory in bytes (MemTotal) and its page size."""
    mem_total_kib = int(host.check_output("awk '$1 == \"MemTotal:\" { print $2 }' /proc/meminfo"))
    return mem_total_kib * 1024, int(host.check_output("getconf PAGESIZE"))


def _scaled(host, value: int, maximum: int) -> int:
    """systemd's physical_memory_scale(): whole pages of value/maximum of the memory."""
    memory, page = _physical(host)
    return memory // page * value // maximum * page


def _slice_bytes(host, memory_max: str) -> str:
    """What `systemctl show -p MemoryMax` prints for MemoryMax=memory_max in a unit file."""
    if memory_max == "infinity":
        return "infinity"
    if memory_max.endswith("%"):
        return str(_scaled(host, int(memory_max[:-1]) * 100, 10000))
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)", memory_max).groups()
    return str(int(number) * _UNITS[unit])


def _scope_bytes(host, memory_max: str) -> str:
    """The same for spark-run's scope, where a percentage travels as MemoryMaxScale."""
    if memory_max.endswith("%"):
        return str(_scaled(host, int(memory_max[:-1]) * UINT32_MAX // 100, UINT32_MAX))
    return _slice_bytes(host, memory_max)


def _assert_bytes(host, shown: str, expected: str) -> None:
    """A MemoryMax systemd shows against the expected one, to a page (systemd's rounding)."""
    if "infinity" in (shown, expected):
        assert shown == expected
    else:
        assert abs(int(shown) - int(expected)) <= _physical(host)[1], (shown, expected)


def _show(host, unit: str, *properties: str) -> dict[str, str]:
    args = " ".join(f"--property {p}" for p in properties)
    output = host.check_output(f"systemctl show {args} {shlex.quote(unit)}")
    return dict(line.split("=", 1) for line in output.splitlines())


@pytest.mark.parametrize("name", COMMANDS)
def test_commands_are_root_owned_executables_nobody_else_can_change(host, name):
    """Protects against privilege escalation: these commands are run with sudo (and
    spark-run calls sudo itself), so whoever can change them runs code as root."""
    f = host.file(f"/usr/local/bin/{name}")
    assert f.is_file, f"/usr/local/bin/{name} is missing"
    assert (f.user, f.group) == ("root", "root")
    assert f.mode == 0o755, f"mode {f.mode:o}"


def test_training_slice_caps_memory_and_forbids_swap(host, settings):
    """Protects against jobs that together take the memory the OS, sshd and the
    watchdog need, or push the machine into swap (GPU memory cannot swap; swap only
    delays the freeze). On GB10 this caps CPU-side memory and page cache only."""
    shown = _show(host, SLICE, "LoadState", "MemoryMax", "MemorySwapMax")
    assert shown["LoadState"] == "loaded"
    assert shown["MemorySwapMax"] == "0"
    _assert_bytes(host, shown["MemoryMax"], _slice_bytes(host, settings["jobs_memory_max"]))


def test_spark_run_puts_a_root_job_in_training_slice_with_a_raised_oom_score(host, settings):
    """Protects against jobs that escape the cap, or that the OOM killer and earlyoom
    would spare while they kill something the machine needs (sshd, the desktop)."""
    with host.sudo():
        cgroup = host.check_output("spark-run -- cat /proc/self/cgroup")
        oom_score_adj = host.check_output("spark-run -- cat /proc/self/oom_score_adj")
    assert re.search(rf"/{SLICE}/spark-run-\d+-\d+\.scope$", cgroup, re.M), cgroup
    assert oom_score_adj == str(settings["jobs_oom_score_adj"])


def test_spark_run_keeps_the_users_identity_and_environment(host, settings):
    """Protects against jobs that run as root, or without the caller's LD_LIBRARY_PATH,
    PYTHONPATH and virtualenv (what `sudo systemd-run --scope` would strip), and
    against a scope whose own caps differ from the settings."""
    if host.user().name == "root":
        pytest.skip("the suite logs in as root here: the ordinary-user path is not exercised")
    if host.run("sudo -n true").rc != 0:
        pytest.skip("sudo asks this user for a password: spark-run would prompt for it")
    probe = (
        "id -u; printf '%s\\n' \"$LD_LIBRARY_PATH\" \"$SPARKRIG_PROBE\"; "
        "unit=$(grep -o 'spark-run-[0-9-]*\\.scope' /proc/self/cgroup | head -n 1); "
        "systemctl show --property Slice --property MemoryMax --property MemorySwapMax \"$unit\""
    )
    output = host.check_output(
        "LD_LIBRARY_PATH=/opt/probe/lib64 SPARKRIG_PROBE='a b' spark-run -- sh -c %s", probe)
    uid, ld_library_path, probe_value, *properties = output.splitlines()
    assert uid == str(host.user().uid)
    assert (ld_library_path, probe_value) == ("/opt/probe/lib64", "a b")
    shown = dict(line.split("=", 1) for line in properties)
    assert shown["Slice"] == SLICE
    assert shown["MemorySwapMax"] == "0"
    _assert_bytes(host, shown["MemoryMax"], _scope_bytes(host, settings["jobs_memory_max"]))


def test_spark_run_passes_on_the_jobs_exit_status(host):
    """Protects against scripts and schedulers that cannot tell a failed job from a
    finished one."""
    with host.sudo():
        assert host.run("spark-run -- sh -c 'exit 7'").rc == 7


def test_spark_preflight_passes_on_a_converged_host(host, settings):
    """Protects against a preflight that blocks every run on a correctly configured
    machine. On a host whose whole memory is below jobs_preflight_min_available_kib
    (the lab's hosts share a 24 GiB controller; the default suits a 128 GB Spark), the
    memory threshold is lowered to 1 GiB: the check itself is proven by the next control."""
    memory, _ = _physical(host)
    threshold = settings["jobs_preflight_min_available_kib"]
    args = "" if memory // 1024 >= threshold else "--min-available-kib 1048576"
    result = host.run(f"spark-preflight {args}")
    assert result.rc == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["memory:", "swap:", "watchdog:", "strays:", "gpu:"]
    assert all(line.startswith(("OK ", "SKIP ")) for line in lines), lines


def test_spark_preflight_fails_when_memory_is_short(host):
    """Protects against a memory check that passes whatever the memory: a threshold
    above the host's whole memory must fail with the memory code (4)."""
    memory, _ = _physical(host)
    result = host.run(f"spark-preflight --min-available-kib {memory // 1024 + 1}")
    assert result.rc & 4, result.stdout
    assert result.stdout.splitlines()[0].startswith("FAIL memory: ")


def test_spark_drop_caches_works_as_root_only(host):
    """Protects against a cache flush that silently does nothing between runs (NVIDIA's
    advice on Spark), and against one that pretends to work for an ordinary user."""
    with host.sudo():
        result = host.run("spark-drop-caches")
    assert result.rc == 0, result.stderr
    assert re.fullmatch(r"spark-drop-caches: page cache \d+ MiB before, \d+ MiB after", result.stdout.strip())
    if host.user().name != "root":
        refused = host.run("spark-drop-caches")
        assert refused.rc == 1 and "must run as root" in refused.stderr
