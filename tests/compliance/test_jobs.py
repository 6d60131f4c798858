"""
Job wrapper controls: training.slice caps the jobs' memory, spark-run puts a job in
it with a raised OOM score, a detached job outlives the SSH session that started it
and its exit status stays readable, spark-jobs acts on the caller's own jobs only,
spark-preflight passes on a converged host, spark-drop-caches works as root, old job
records are cleaned, and the shared model cache belongs to its group.

The expected caps are worked out here from the settings and the host's memory the
way systemd computes them, independently of operations/jobs/.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
import uuid

import pytest

from .conftest import inventory_name
from .reads import need

SLICE = "training.slice"
COMMANDS = ["spark-run", "spark-jobs", "spark-preflight", "spark-drop-caches"]
UINT32_MAX = 2**32 - 1
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


# The commands the action controls send more than once, written once.
DROP_CACHES = "spark-drop-caches"
STOP = "spark-jobs stop %s"
LOGS = "spark-jobs logs %s"
CAN_SUDO = "sudo -n true"


@need
def physical(r) -> tuple[int, int]:
    """The host's memory in bytes (MemTotal) and its page size."""
    memory, page = r.run("awk '$1 == \"MemTotal:\" { print $2 }' /proc/meminfo"), r.run("getconf PAGESIZE")
    return int(memory.check()) * 1024, int(page.check())


def _scaled(physical, value: int, maximum: int) -> int:
    """systemd's physical_memory_scale(): whole pages of value/maximum of the memory."""
    memory, page = physical
    return memory // page * value // maximum * page


def _slice_bytes(physical, memory_max: str) -> str:
    """What `systemctl show -p MemoryMax` prints for MemoryMax=memory_max in a unit file."""
    if memory_max == "infinity":
        return "infinity"
    if memory_max.endswith("%"):
        return str(_scaled(physical, int(memory_max[:-1]) * 100, 10000))
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)", memory_max).groups()
    return str(int(number) * _UNITS[unit])


def _scope_bytes(physical, memory_max: str) -> str:
    """The same for spark-run's scope, where a percentage travels as MemoryMaxScale."""
    if memory_max.endswith("%"):
        return str(_scaled(physical, int(memory_max[:-1]) * UINT32_MAX // 100, UINT32_MAX))
    return _slice_bytes(physical, memory_max)


def _assert_bytes(physical, shown: str, expected: str) -> None:
    """A MemoryMax systemd shows against the expected one, to a page (systemd's rounding)."""
    if "infinity" in (shown, expected):
        assert shown == expected
    else:
        assert abs(int(shown) - int(expected)) <= physical[1], (shown, expected)


def _show_command(unit: str, *properties: str) -> str:
    args = " ".join(f"--property {p}" for p in properties)
    return f"systemctl show {args} {shlex.quote(unit)}"


def _shown(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines())


def _show(host, unit: str, *properties: str) -> dict[str, str]:
    return _shown(host.check_output(_show_command(unit, *properties)))


_MEM_TOTAL_KIB = "$(awk '$1 == \"MemTotal:\" { print $2 }' /proc/meminfo)"


@need
def state(r) -> dict:
    """What the read-only job controls read of the host."""
    threshold = int(r.settings["jobs_preflight_min_available_kib"])
    cache, group = r.settings["jobs_model_cache"], r.settings["jobs_model_cache_group"]
    return {
        "commands": {name: r.path(f"/usr/local/bin/{name}") for name in COMMANDS},
        "slice": r.run(_show_command(SLICE, "LoadState", "MemoryMax", "MemorySwapMax")),
        # The threshold lowered to 1 GiB on a host whose whole memory is below it (the control's rule).
        "preflight": r.run(
            f"if [ {_MEM_TOTAL_KIB} -ge {threshold} ]; then spark-preflight; "
            "else spark-preflight --min-available-kib 1048576; fi"
        ),
        "preflight_short": r.run(f"spark-preflight --min-available-kib $(({_MEM_TOTAL_KIB} + 1))"),
        "cache": r.path(cache) if cache else None,
        "group": r.run("getent group %s", group) if cache else None,
        "groups": {user: r.run("id -Gn %s", user) for user in r.settings["jobs_model_cache_users"]} if cache else {},
    }


@pytest.mark.parametrize("name", COMMANDS)
def test_commands_are_root_owned_executables_nobody_else_can_change(read, name):
    """Protects against privilege escalation: these commands are run with sudo (and
    spark-run calls sudo itself), so whoever can change them runs code as root."""
    f = read(state)["commands"][name]
    assert f.is_file, f"/usr/local/bin/{name} is missing"
    assert (f.user, f.group) == ("root", "root")
    assert f.mode == 0o755, f"mode {f.mode:o}"


def test_training_slice_caps_memory_and_forbids_swap(read, settings):
    """Protects against jobs that together take the memory the OS, sshd and the
    watchdog need, or push the machine into swap (GPU memory cannot swap; swap only
    delays the freeze). On GB10 this caps CPU-side memory and page cache only."""
    found = read(state)
    shown = _shown(found["slice"].check())
    assert shown["LoadState"] == "loaded"
    assert shown["MemorySwapMax"] == "0"
    memory = read(physical)
    _assert_bytes(memory, shown["MemoryMax"], _slice_bytes(memory, settings["jobs_memory_max"]))


@pytest.mark.action
def test_spark_run_puts_a_root_job_in_training_slice_with_a_raised_oom_score(host, read, settings):
    """Protects against jobs that escape the cap, or that the OOM killer and earlyoom
    would spare while they kill something the machine needs (sshd, the desktop)."""
    with host.sudo():
        cgroup = host.check_output("spark-run -- cat /proc/self/cgroup")
        oom_score_adj = host.check_output("spark-run -- cat /proc/self/oom_score_adj")
    assert re.search(rf"/{SLICE}/spark-run-\d+-\d+\.scope$", cgroup, re.M), cgroup
    assert oom_score_adj == str(settings["jobs_oom_score_adj"])


@pytest.mark.action
def test_spark_run_keeps_the_users_identity_and_environment(host, read, settings):
    """Protects against jobs that run as root, or without the caller's LD_LIBRARY_PATH,
    PYTHONPATH and virtualenv (what `sudo systemd-run --scope` would strip), and
    against a scope whose own caps differ from the settings."""
    if host.user().name == "root":
        pytest.skip("the suite logs in as root here: the ordinary-user path is not exercised")
    if host.run(CAN_SUDO).rc != 0:
        pytest.skip("sudo asks this user for a password: spark-run would prompt for it")
    probe = (
        'id -u; printf \'%s\\n\' "$LD_LIBRARY_PATH" "$SPARKRIG_PROBE"; '
        "unit=$(grep -o 'spark-run-[0-9-]*\\.scope' /proc/self/cgroup | head -n 1); "
        'systemctl show --property Slice --property MemoryMax --property MemorySwapMax "$unit"'
    )
    output = host.check_output("LD_LIBRARY_PATH=/opt/probe/lib64 SPARKRIG_PROBE='a b' spark-run -- sh -c %s", probe)
    uid, ld_library_path, probe_value, *properties = output.splitlines()
    assert uid == str(host.user().uid)
    assert (ld_library_path, probe_value) == ("/opt/probe/lib64", "a b")
    shown = dict(line.split("=", 1) for line in properties)
    assert shown["Slice"] == SLICE
    assert shown["MemorySwapMax"] == "0"
    _assert_bytes(read(physical), shown["MemoryMax"], _scope_bytes(read(physical), settings["jobs_memory_max"]))


@pytest.mark.action
def test_spark_run_passes_on_the_jobs_exit_status(host):
    """Protects against scripts and schedulers that cannot tell a failed job from a
    finished one."""
    with host.sudo():
        ran = host.run("spark-run -- sh -c 'exit 7'")
        assert ran.rc == 7, f"spark-run passed on exit 7 as {ran.rc}: {ran.stderr.strip()}"


def test_spark_preflight_passes_on_a_converged_host(read):
    """Protects against a preflight that blocks every run on a correctly configured
    machine. On a host whose whole memory is below jobs_preflight_min_available_kib
    (the lab's hosts share a 24 GiB controller; the default suits a 128 GB Spark), the
    memory threshold is lowered to 1 GiB: the check itself is proven by the next control."""
    result = read(state)["preflight"]
    problem = preflight_problem(result.rc, result.stdout, result.stderr)
    assert problem is None, problem


PREFLIGHT_CHECKS = ["memory:", "swap:", "watchdog:", "strays:", "gpu:"]


def preflight_problem(rc: int, stdout: str, stderr: str) -> str | None:
    """Why spark-preflight's run is not a pass, in one line that names the check that failed
    (its FAIL line, which says what it found), or None for a pass."""
    lines = stdout.splitlines()
    failed = [line for line in lines if not line.startswith(("OK ", "SKIP "))]
    if failed:
        return f"spark-preflight (exit {rc}): " + "; ".join(failed)
    if rc != 0:
        said = (stderr.strip().splitlines() or ["nothing on stderr"])[-1]
        return f"spark-preflight exited {rc} with every check OK or SKIP: {said}"
    checks = [line.split()[1] if len(line.split()) > 1 else line for line in lines]
    if checks != PREFLIGHT_CHECKS:
        return f"spark-preflight ran the checks {checks}, not {PREFLIGHT_CHECKS}"
    return None


def test_spark_preflight_fails_when_memory_is_short(read):
    """Protects against a memory check that passes whatever the memory: a threshold
    above the host's whole memory must fail with the memory code (4)."""
    result = read(state)["preflight_short"]
    problem = short_memory_problem(result.rc, result.stdout, result.stderr)
    assert problem is None, problem


def short_memory_problem(rc: int, stdout: str, stderr: str) -> str | None:
    """Why spark-preflight's run with a threshold above the whole memory is not the memory
    failure it must be, in one line, or None. The status alone is not enough: 127 (the
    program missing) has the memory code's bit set too."""
    memory = next((line for line in stdout.splitlines() if line.split(" ", 2)[1:2] == ["memory:"]), None)
    if rc & 4 and memory is not None and memory.startswith("FAIL "):
        return None
    said = memory or (stderr.strip().splitlines() or ["no memory line, nothing on stderr"])[-1]
    return f"spark-preflight, its memory threshold above the host's memory, exited {rc}, not 4 (memory): {said}"


@pytest.mark.action
def test_spark_drop_caches_works_as_root_only(host):
    """Protects against a cache flush that silently does nothing between runs (NVIDIA's
    advice on Spark), and against one that pretends to work for an ordinary user."""
    with host.sudo():
        result = host.run(DROP_CACHES)
    assert result.rc == 0, result.stderr
    assert re.fullmatch(r"spark-drop-caches: page cache \d+ MiB before, \d+ MiB after", result.stdout.strip())
    if host.user().name != "root":
        refused = host.run(DROP_CACHES)
        assert refused.rc == 1 and "must run as root" in refused.stderr, (
            f"spark-drop-caches as {host.user().name} (exit {refused.rc}): {refused.stderr.strip()}"
        )


# Detached jobs ---------------------------------------------------------------


@pytest.fixture
def job_user(host):
    """The suite's own user, where it is an ordinary one with sudo (spark-run --detach asks
    sudo to start the service)."""
    if host.user().name == "root":
        pytest.skip("the suite logs in as root here: the ordinary-user path is not exercised")
    if host.run(CAN_SUDO).rc != 0:
        pytest.skip("sudo asks this user for a password: spark-run --detach would prompt for it")
    return host.user().name


@pytest.fixture
def job_name(host):
    """A fresh job name; the job is stopped and forgotten afterwards."""
    name = f"sparkrig-check-{uuid.uuid4().hex[:8]}"
    yield name
    with host.sudo():
        host.run("systemctl stop %s", f"spark-job-{name}.service")
        host.run("spark-jobs forget %s", name)


def _row(host, name: str) -> list[str] | None:
    """The job's row in `spark-jobs` (NAME USER STATE ... EXIT), None when it is not listed."""
    for line in host.check_output("spark-jobs list").splitlines()[1:]:
        if line.split()[0] == name:
            return line.split()
    return None


def _wait_for(what, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.5)
    return what()


def _wait_listed(host, name: str, state: str, timeout: float = 60) -> list[str]:
    """The job's row once `spark-jobs` lists it in ``state`` (waited for, ``timeout`` s at
    most), else the row it had then (``["(not listed)"]`` when none): for the failure's message."""
    row = _wait_for(lambda: (_row(host, name) or [""] * 3)[2] == state and _row(host, name), timeout)
    return row or _row(host, name) or ["(not listed)"]


def _fresh_ssh(request, host) -> list[str]:
    """An ssh command that opens a connection of its own (none of the suite's shared ones)."""
    if host.backend.NAME != "ssh":
        pytest.skip("the suite does not reach this host over SSH: no session to drop")
    return [
        "ssh",
        "-F",
        request.config.option.ssh_config,
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        "-o",
        "BatchMode=yes",
        inventory_name(host),
    ]


@pytest.mark.action
def test_a_detached_job_outlives_its_ssh_session_and_keeps_its_exit_status(request, host, job_user, job_name):
    """Protects against multi-day runs that die with the laptop's SSH connection (what tmux
    and screen were for), and against jobs that leave nothing to come back to: a job started
    over one connection, which is then cut, is still running over a new connection, and once
    it ends its exit status and its output are there."""
    ssh = _fresh_ssh(request, host)
    marker = uuid.uuid4().hex
    go = f".{job_name}-go"  # in the home directory, where both the job and the suite start
    session = f"sleep 600.{uuid.uuid4().int % 10**6}"  # this session's own process
    # A terminal (-tt), as a person's session has: when the connection drops, sshd hangs
    # it up, and the session (sleep, standing in for the shell) ends. The job runs until the
    # control lets it end (the go file), at most a minute: it must outlive the reconnection.
    start = subprocess.Popen(
        [
            *ssh,
            "-tt",
            f"spark-run --detach {job_name} -- sh -c 'echo started-{marker}; i=0; "
            f"while [ ! -e {go} ] && [ $i -lt 300 ]; do sleep 0.2; i=$((i+1)); done; "
            f"echo finished-{marker}; exit 3' && {session}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    request.addfinalizer(lambda: host.run("rm -f %s", go))
    try:
        assert _wait_for(lambda: (_row(host, job_name) or [None] * 3)[2] == "active", 30), (
            f"the job did not start: {_row(host, job_name)}"
        )
    finally:
        start.kill()  # the connection drops, as a laptop going to sleep
        start.wait(10)
    assert _wait_for(lambda: host.run("pgrep -u %s -x -f %s", job_user, session).rc == 1, 30), (
        "the SSH session that started the job is still there: nothing was cut"
    )
    reconnect = subprocess.run([*ssh, "spark-jobs list"], capture_output=True, text=True, timeout=60)
    assert reconnect.returncode == 0, reconnect.stderr
    row = next((line.split() for line in reconnect.stdout.splitlines() if line.startswith(job_name + " ")), None)
    assert row and row[1:3] == [job_user, "active"], f"after reconnecting: {reconnect.stdout}"
    host.check_output("touch %s", go)
    ended = _wait_for(lambda: (_row(host, job_name) or [""] * 3)[2] == "failed" and _row(host, job_name), 60)
    assert ended and ended[-1] == "3", f"the job's exit status is not kept: {ended}"
    logs = subprocess.run([*ssh, f"spark-jobs logs {job_name}"], capture_output=True, text=True, timeout=60)
    assert f"started-{marker}" in logs.stdout and f"finished-{marker}" in logs.stdout, logs.stdout + logs.stderr


@pytest.mark.action
def test_a_detached_job_is_capped_oom_scored_and_runs_as_its_caller(host, read, settings, job_user, job_name):
    """Protects against background jobs that escape training.slice's cap, that the OOM killer
    and earlyoom would spare, that run as root, or without the caller's environment, directory
    and jobs_env; and against a stop that does not stop: spark-jobs stop ends it, and it is
    listed as stopped by SIGTERM."""
    probe = (
        "cat /proc/self/oom_score_adj; id -un; pwd; printf '%s\\n' \"$SPARKRIG_PROBE\" "
        '"${PYTORCH_CUDA_ALLOC_CONF-unset}"; exec sleep 300'
    )
    host.check_output("cd /tmp && SPARKRIG_PROBE='a b$c' spark-run --detach %s -- sh -c %s", job_name, probe)
    unit = f"spark-job-{job_name}.service"
    with host.sudo():
        assert _wait_for(
            lambda: len(host.check_output("journalctl -q --no-pager -o cat -u %s", unit).splitlines()) >= 5, 30
        ), f"{unit} wrote fewer than its 5 probe lines to the journal within 30 s: {_row(host, job_name)}"
    shown = _show(host, unit, "Slice", "MemoryMax", "MemorySwapMax", "OOMScoreAdjust", "User")
    assert (shown["Slice"], shown["MemorySwapMax"], shown["User"]) == (SLICE, "0", job_user)
    assert shown["OOMScoreAdjust"] == str(settings["jobs_oom_score_adj"])
    _assert_bytes(read(physical), shown["MemoryMax"], _scope_bytes(read(physical), settings["jobs_memory_max"]))
    output = host.check_output(LOGS, job_name).splitlines()
    expected_env = settings["jobs_env"].get("PYTORCH_CUDA_ALLOC_CONF", "unset")
    assert output[:5] == [str(settings["jobs_oom_score_adj"]), job_user, "/tmp", "a b$c", expected_env], output
    assert host.run(STOP, job_name).rc == 0
    row = _wait_for(lambda: (_row(host, job_name) or [""] * 3)[2] == "stopped" and _row(host, job_name), 30)
    assert row and row[-1] == "SIGTERM", row


@pytest.mark.action
def test_stopping_a_job_that_ignores_sigterm_waits_a_bounded_time_saying_what_for(host, job_user, job_name):
    """Protects against `spark-jobs stop` holding its caller for as long as systemd takes (more
    than ten minutes once, on the emulated aarch64 host): a job that ignores SIGTERM is waited
    for --wait seconds at most, with what is awaited said, and is left stopping."""
    host.check_output(
        "spark-run --detach %s -- sh -c %s", job_name, "trap '' TERM; echo sigterm-ignored; while :; do sleep 1; done"
    )
    unit = f"spark-job-{job_name}.service"
    assert _wait_for(lambda: (_row(host, job_name) or [None] * 3)[2] == "active", 30), _row(host, job_name)
    # Active is when the shell started, not when it ignores SIGTERM: stopped before its trap, it
    # ends at once (a fast controller met that, once, in a rollout's proof).
    ignoring = _wait_for(lambda: "sigterm-ignored" in host.run(LOGS, job_name).stdout, 60)
    assert ignoring, f"{job_name} never said it ignores SIGTERM: {host.run(LOGS, job_name).stdout}"
    started = time.monotonic()
    stop = host.run("spark-jobs stop --wait 3 %s", job_name)
    took = time.monotonic() - started
    try:
        assert stop.rc == 1 and took < 20, (stop.rc, took, stop.stderr)
        assert (
            f"systemd sends SIGTERM, and SIGKILL after 1min 30s; waiting up to 3 s for {unit} to end" in stop.stderr
        ), stop.stderr
        assert f"{job_name} did not stop within 3 s: {unit} is deactivating/stop-sigterm" in stop.stderr, stop.stderr
    finally:
        with host.sudo():
            host.run("systemctl kill --signal=KILL %s", unit)
    assert _wait_for(lambda: (_row(host, job_name) or [""] * 3)[2] != "deactivating", 30), _row(host, job_name)


@pytest.mark.action
def test_a_running_job_name_is_refused_and_others_jobs_cannot_be_stopped(host, job_user, job_name):
    """Protects against a second job silently taking over a running job's name (and its
    log), and against users stopping each other's jobs: root's job cannot be stopped by
    the user through spark-jobs."""
    with host.sudo():
        host.check_output("spark-run --detach %s -- sleep 300", job_name)
    # systemd-run returns once the start is queued; under load the job is listed a little later.
    listed = _wait_listed(host, job_name, "active")
    assert listed[1:3] == ["root", "active"], f"root's job {job_name} did not become active within 60 s: {listed}"
    again = host.run("spark-run --detach %s -- true", job_name)
    assert again.rc == 1 and "is active" in again.stderr, (
        f"a second spark-run --detach {job_name} while root's runs (exit {again.rc}): {again.stderr.strip()}"
    )
    refused = host.run(STOP, job_name)
    assert refused.rc == 1 and "is root's job" in refused.stderr, (
        f"spark-jobs stop of root's job by {job_user} (exit {refused.rc}): {refused.stderr.strip()}"
    )
    after = _row(host, job_name) or ["(not listed)"]
    assert after[1:3] == ["root", "active"], f"root's job {job_name} after {job_user}'s stop: {after}"


RECORDS = "/var/lib/sparkrig/jobs"
_AGE_SECONDS = {"h": 3600, "d": 86400, "w": 7 * 86400}


@pytest.mark.action
def test_old_job_records_are_removed_and_recent_ones_kept(host, settings):
    """Protects against /var/lib/sparkrig/jobs growing for as long as the box lives (one record
    per detached job), and against a clean that takes the records of jobs that ended lately,
    or that a daily `spark-jobs list` keeps alive: systemd-tmpfiles' clean, as its daily timer
    runs it, removes a record that ended before jobs_records_max_age (read just now) and keeps
    a fresh one."""
    age = settings["jobs_records_max_age"]
    if not age:
        pytest.skip("jobs_records_max_age is empty for this host: records stay until spark-jobs forget")
    seconds = int(age[:-1]) * _AGE_SECONDS[age[-1]]
    name = f"sparkrig-check-{uuid.uuid4().hex[:8]}"
    old, new = f"{RECORDS}/root/{name}-old", f"{RECORDS}/root/{name}-new"
    with host.sudo():
        assert host.service("systemd-tmpfiles-clean.timer").is_running, (
            "systemd-tmpfiles-clean.timer is not running: nothing cleans old job records daily"
        )
        host.check_output(
            "mkdir -p %s && echo ended > %s && echo ended > %s && touch -d @$(($(date +%%s) - %s)) %s && cat %s",
            f"{RECORDS}/root",
            old,
            new,
            str(seconds + 3600),
            old,
            old,
        )
        try:
            host.check_output("systemd-tmpfiles --clean --prefix=%s", RECORDS)
            assert not host.file(old).exists, f"a record older than {age} was kept"
            assert host.file(new).exists, "a fresh record was removed"
        finally:
            host.run("rm -f %s %s", old, new)


def test_the_shared_model_cache_belongs_to_its_group(read, settings):
    """Protects against a model cache that one user's download makes unusable for the others
    (or that anyone may replace): the directory is root's and the group's, setgid, group-
    writable, and each of jobs_model_cache_users is in the group."""
    if not settings["jobs_model_cache"]:
        pytest.skip("jobs_model_cache is empty for this host: each user keeps their own cache")
    found = read(state)
    cache = found["cache"]
    assert cache.is_directory and not cache.is_symlink, f"{cache.path} is missing or a link: converge this host again"
    assert (cache.user, cache.group, cache.mode) == ("root", settings["jobs_model_cache_group"], 0o2775)
    assert found["group"].rc == 0, f"group {settings['jobs_model_cache_group']} does not exist"
    for user in settings["jobs_model_cache_users"]:
        groups = found["groups"][user].check().split()
        assert settings["jobs_model_cache_group"] in groups, f"{user} is not in the group"
