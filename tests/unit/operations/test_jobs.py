"""Job wrappers: settings, training.slice, the three commands run for real here, the plan."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from sparkrig import rendering
from sparkrig.operations import jobs
from sparkrig.operations.jobs import facts as jobs_facts
from sparkrig.operations.jobs import operations as jobs_ops
from sparkrig.settings import defaults, problems
from sparkrig.units import SPARK_RUN
from tests.unit.pyinfra_fake import HOST_STATE, digest, execute, host_state

DEFAULTS = defaults(jobs.SETTINGS)
SCRIPTS = jobs_ops.render_commands("85%", 500, 67108864, True)
SHELLS = ["sh", "dash", "bash"]


def _script(tmp_path: Path, name: str, text: str | None = None) -> Path:
    path = tmp_path / name
    path.write_text(text if text is not None else SCRIPTS[name])
    path.chmod(0o755)
    return path


def _run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60, **kwargs)


# Settings --------------------------------------------------------------------


def test_defaults_are_valid():
    assert problems(jobs.SETTINGS, {}) == []


GOOD_SIZES = ["85%", "1%", "100%", "100G", "1024", "512M", "64K", "3T", "4194304T", "infinity"]
BAD_SIZES = [
    "0",
    "0G",
    "01G",
    "1.5G",
    "1g",
    "100 G",
    "-1G",
    "G",
    "0%",
    "101%",
    "50.5%",
    "",
    "4194305T",
    "1000000000000000",
    "infinity ",
    "unlimited",
]


@pytest.mark.parametrize("size", GOOD_SIZES)
def test_memory_max_formats_systemd_takes(size):
    assert problems(jobs.SETTINGS, {"jobs_memory_max": size}) == []


@pytest.mark.parametrize("size", [*BAD_SIZES, 100])
def test_memory_max_refuses_everything_else(size):
    (found,) = problems(jobs.SETTINGS, {"jobs_memory_max": size})
    assert "allowed is systemd's MemoryMax= as sparkrig takes it" in found


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"jobs_oom_score_adj": 0}, "allowed is an integer from 1 to 1000"),
        ({"jobs_oom_score_adj": "500"}, "allowed is an integer from 1 to 1000"),
        ({"jobs_preflight_min_available_kib": -1}, "allowed is an integer from 0"),
        ({"jobs_memory_maxx": "1G"}, "not a sparkrig setting (did you mean jobs_memory_max?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(jobs.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"jobs_env": {"PYTORCH CUDA": "x"}}, "allowed is a mapping of environment variable names"),
        ({"jobs_env": {"A": "it's"}}, "allowed is a mapping of environment variable names"),
        ({"jobs_env": ["A=1"]}, "allowed is a mapping of environment variable names"),
        ({"jobs_drop_caches": "yes"}, "allowed is True or False"),
        ({"jobs_model_cache": "srv/models"}, "allowed is a normalised absolute path"),
        ({"jobs_model_cache": "/srv/my models"}, "allowed is a normalised absolute path"),
        ({"jobs_model_cache": "/srv/models:/x"}, "allowed is a normalised absolute path"),
        ({"jobs_model_cache": "/usr"}, "allowed is a normalised absolute path"),
        ({"jobs_model_cache": "/srv/models/"}, "allowed is a normalised absolute path"),
        ({"jobs_model_cache_group": "Models!"}, "allowed is a group name"),
        ({"jobs_model_cache_users": "spark"}, "allowed is a list of user names"),
    ],
)
def test_new_settings_refuse_bad_values(data, expected):
    found = problems(jobs.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


def test_new_settings_take_good_values():
    assert (
        problems(
            jobs.SETTINGS,
            {
                "jobs_env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                "jobs_drop_caches": True,
                "jobs_model_cache": "/srv/models/huggingface",
                "jobs_model_cache_group": "models",
                "jobs_model_cache_users": ["spark", "ada"],
            },
        )
        == []
    )


# training.slice ----------------------------------------------------------------


def _validate_slice(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "training.slice"
    path.write_text(text)
    return _run([*jobs_ops.SLICE_VALIDATOR, path])


@pytest.mark.parametrize("size", GOOD_SIZES)
def test_slice_caps_memory_forbids_swap_and_passes_its_validation(tmp_path, size):
    text = jobs_ops.render_slice(size)
    assert f"[Slice]\nMemoryMax={size}\nMemorySwapMax=0\n" in text
    assert _validate_slice(tmp_path, text).returncode == 0


@pytest.mark.parametrize(
    "bad",
    [
        "[Slice]\nMemoryMax=85%\nMemorySwapMax=1G\n",
        "[Slice]\nMemoryMax=lots\n",
        "[Slice]\nCPUQuota=50%\n",
        "[Service]\nMemoryMax=1G\n",
    ],
)
def test_slice_validation_refuses_anything_else(tmp_path, bad):
    assert _validate_slice(tmp_path, bad).returncode != 0


# The scripts as scripts ----------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripts_parse(tmp_path, name, shell):
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed on this machine")
    assert _run([shell, "-n", _script(tmp_path, name)]).returncode == 0


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help(tmp_path, name):
    result = _run([_script(tmp_path, name), "--help"])
    assert result.returncode == 0 and result.stdout.startswith("Usage: ")


# spark-run ---------------------------------------------------------------------


def test_spark_run_help_states_the_caps_and_the_gb10_caveat(tmp_path):
    script = _script(tmp_path, "spark-run", jobs_ops.render_commands("100G", 700, 1, True)["spark-run"])
    text = _run([script, "--help"]).stdout
    assert "MemoryMax      100G for this job (and for all jobs of training.slice together)" in text
    assert "MemorySwapMax  0: the job never swaps" in text
    assert "oom_score_adj  700" in text
    assert "the memory cap does NOT cover GPU (CUDA) allocations" in text
    assert "asks sudo to run\nbusctl" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no COMMAND given"),
        (["--"], "no COMMAND given"),
        (["--bogus", "true"], "unknown option --bogus"),
        (["--memory-max"], "--memory-max needs a SIZE"),
        (["--memory-max", "lots", "--", "true"], "--memory-max lots: not bytes[K|M|G|T], 1% to 100%, or infinity"),
        (["--memory-max=0G", "true"], "--memory-max 0G: not bytes"),
    ],
)
def test_spark_run_usage_errors_exit_2_before_touching_systemd(tmp_path, args, message):
    result = _run([_script(tmp_path, "spark-run"), *args])
    assert result.returncode == 2
    assert result.stderr.startswith(f"spark-run: {message}")
    assert result.stderr.endswith(" (spark-run --help shows the usage)\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--detach"], "--detach needs a NAME"),
        (["--detach", "", "true"], "--detach needs a NAME"),
        (["--detach", "../x", "true"], "--detach ../x: a NAME is letters, digits and ._-"),
        (["--detach", ".hidden", "true"], "--detach .hidden: a NAME is"),
        (["--detach", "-x", "true"], "--detach -x: a NAME is"),
        (["--detach", "a b", "true"], "--detach a b: a NAME is"),
        (["--detach", "a\nb", "true"], "--detach a\nb: a NAME is"),
        (["--detach", "x" * 65, "true"], "--detach: a NAME is 64 characters at most"),
        (["--detach=train"], "no COMMAND given"),
    ],
)
def test_spark_run_refuses_bad_job_names_before_touching_systemd(tmp_path, args, message):
    result = _run([_script(tmp_path, "spark-run"), *args])
    assert result.returncode == 2
    assert result.stderr.startswith(f"spark-run: {message}")


def _function(script: str, name: str) -> str:
    return re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", script, re.S | re.M)[0]


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_a_detached_job_gets_the_callers_environment_and_command_literally(tmp_path, shell):
    """What spark-run --detach writes (export -p, then the command quoted) and what the job's
    --job-env reads back: every argument and value as it was, $ and quotes included, systemd's
    own INVOCATION_ID kept; the file is gone once the job runs."""
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed on this machine")
    env_file = tmp_path / "job.env"
    writer = _function(SCRIPTS["spark-run"], "quote") + (
        'export -p > "$F"; { printf "set -- "; for arg in "$@"; do quote "$arg"; done; echo; } >> "$F"'
    )
    odd = ["it's", "$HOME and ${X}", "a\nb\n", "", "-x", "%n"]
    env = {"PATH": os.environ["PATH"], "F": str(env_file), "ODD_VALUE": "x'y $z\nw", "INVOCATION_ID": "stale"}
    assert (
        _run(
            [
                "/bin/sh",
                "-c",
                writer,
                "sh",
                "python3",
                "-c",
                "import os, sys; print(repr((sys.argv[1:], os.environ['ODD_VALUE'], os.environ.get('INVOCATION_ID'))))",
                *odd,
            ],
            env=env,
        ).returncode
        == 0
    )
    result = _run(
        [shell, _script(tmp_path, "spark-run"), "--job-env", env_file],
        env={"PATH": os.environ["PATH"], "INVOCATION_ID": "fresh"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == repr((odd, "x'y $z\nw", "fresh"))
    assert not env_file.exists()


def test_spark_run_help_lists_jobs_env_and_the_drop_caches_default(tmp_path):
    scripts = jobs_ops.render_commands(
        "85%", 500, 1, True, True, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    )
    text = _run([_script(tmp_path, "spark-run", scripts["spark-run"]), "--help"]).stdout
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    assert "(the default here)" in text and "--no-drop-caches" in text
    assert "(the default here)" not in _run([_script(tmp_path, "spark-run"), "--help"]).stdout
    assert (
        "[ -n \"${PYTORCH_CUDA_ALLOC_CONF+set}\" ] || PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'"
        in (scripts["spark-run"])
    )


# spark-jobs ------------------------------------------------------------------


def _spark_jobs(tmp_path: Path, records: Path, drain: Path | None = None) -> Path:
    return _script(
        tmp_path,
        "spark-jobs",
        rendering.render(
            "jobs/spark-jobs.sh.j2",
            unit_prefix=jobs_ops.UNIT_PREFIX,
            records=str(records),
            drain=str(drain or tmp_path / "drain"),
            serve_prefix="spark-serve-",
        ),
    )


def _record(records: Path, user: str, name: str, **fields) -> None:
    (records / user).mkdir(parents=True, exist_ok=True)
    values = {
        "name": name,
        "user": user,
        "invocation": "ab12",
        "started": "2026-11-23 15:00:00 UTC",
        "result": "failed",
        "exit": "3",
        "peak": str(512 << 20),
        **fields,
    }
    (records / user / name).write_text("".join(f"{k}={v}\n" for k, v in values.items()))


def _no_units(tmp_path: Path) -> dict:
    """A PATH whose systemctl knows no unit (the records alone speak)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "systemctl").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_spark_jobs_lists_ended_jobs_from_their_records(tmp_path):
    records = tmp_path / "records"
    _record(records, "ada", "train")
    _record(records, "bob", "serve", result="killed", exit="SIGTERM", peak="")
    result = _run([_spark_jobs(tmp_path, records)], env=_no_units(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[0] == ["NAME", "USER", "STATE", "STARTED", "MEMORY", "PEAK", "EXIT"]
    assert ["train", "ada", "failed", "2026-11-23", "15:00:00", "UTC", "-", "512", "3"] in rows
    assert ["serve", "bob", "killed", "2026-11-23", "15:00:00", "UTC", "-", "-", "SIGTERM"] in rows


@pytest.fixture
def open_dir():
    """A directory every user may read (pytest's own are root's alone when it runs as root)."""
    path = Path(tempfile.mkdtemp(prefix="sparkrig-jobs-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _as_other_user() -> list[str]:
    """A prefix that runs a command as nobody when the tests run as root."""
    if os.getuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("runs as root without setpriv: cannot act as another user")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_spark_jobs_acts_on_the_callers_own_jobs_only(open_dir):
    """Another user's job can be listed, not stopped, read or forgotten (root's may)."""
    records = open_dir / "records"
    _record(records, "someone-else", "train")
    for path in (records, records / "someone-else"):
        path.chmod(0o755)
    (records / "someone-else" / "train").chmod(0o644)
    script = _spark_jobs(open_dir, records).read_text()
    env = _no_units(open_dir)
    (open_dir / "bin").chmod(0o755)
    for command in (["forget", "train"], ["logs", "train"]):
        result = subprocess.run(
            [*_as_other_user(), "sh", "-s", "--", *command],
            input=script,
            env=env,
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
        )
        me = subprocess.run([*_as_other_user(), "id", "-un"], capture_output=True, text=True).stdout.strip()
        assert me != "someone-else"
        assert (result.returncode, result.stderr) == (
            1,
            "spark-jobs: train is someone-else's job: only someone-else or root may act on it\n",
        )
    listed = subprocess.run(
        [*_as_other_user(), "sh", "-s", "--", "list"],
        input=script,
        env=env,
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    assert "train" in listed.stdout and "someone-else" in listed.stdout
    assert (records / "someone-else" / "train").exists()


@pytest.mark.parametrize(
    "args",
    [["logs"], ["logs", "../x"], ["stop", "a b"], ["forget"], ["bogus"], ["list", "x"], ["logs", "-n", "x", "a"]],
)
def test_spark_jobs_usage_errors_exit_2(tmp_path, args):
    result = _run([_spark_jobs(tmp_path, tmp_path / "records"), *args], env=_no_units(tmp_path))
    assert result.returncode == 2, result.stderr


def test_spark_jobs_record_is_roots_alone(open_dir):
    script = _spark_jobs(open_dir, open_dir / "records").read_text()
    result = subprocess.run(
        [*_as_other_user(), "sh", "-s", "--", "record", "train"],
        input=script,
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    assert result.returncode == 1 and "record runs as root" in result.stderr


def _memory_property(size: str) -> str:
    """spark-run's own memory_property function, cut out of the script and called."""
    function = re.search(r"^memory_property\(\) \{\n.*?^\}\n", SCRIPTS["spark-run"], re.S | re.M)[0]
    return _run(["sh", "-c", f'{function}memory_property "$1"', "sh", size]).stdout.strip()


@pytest.mark.parametrize(
    ("size", "prop"),
    [
        ("100G", "MemoryMax t 107374182400"),
        ("1024", "MemoryMax t 1024"),
        ("64K", "MemoryMax t 65536"),
        ("4194304T", "MemoryMax t 4611686018427387904"),
        ("infinity", "MemoryMax t 18446744073709551615"),
        # systemd's UINT32_SCALE_FROM_PERMYRIAD: percent * 100 * UINT32_MAX / 10000.
        ("85%", f"MemoryMaxScale u {85 * 4294967295 // 100}"),
        ("100%", "MemoryMaxScale u 4294967295"),
    ],
)
def test_spark_run_sends_systemd_the_cap_it_would_parse_from_a_unit_file(size, prop):
    assert _memory_property(size) == prop


@pytest.mark.parametrize("size", GOOD_SIZES + BAD_SIZES)
def test_spark_run_and_settings_validation_accept_the_same_sizes(size):
    settings_ok = problems(jobs.SETTINGS, {"jobs_memory_max": size}) == []
    assert bool(_memory_property(size)) == settings_ok


def test_spark_run_without_systemd_says_so(tmp_path):
    if os.path.isdir("/run/systemd/system"):
        pytest.skip("systemd runs here: spark-run would make a real scope (the lab's compliance suite does)")
    result = _run([_script(tmp_path, "spark-run"), "--", "true"])
    assert (result.returncode, result.stderr) == (
        1,
        "spark-run: systemd is not running on this host: no scope can be made\n",
    )


# draining ------------------------------------------------------------------------


def _draining(tmp_path: Path) -> tuple[Path, Path]:
    """spark-run and spark-jobs whose drain mark is ``tmp_path/lib/drain`` (not yet there)."""
    drain = tmp_path / "lib" / "drain"
    scripts = jobs_ops.render_commands("85%", 500, 1, True, drain=str(drain))
    return _script(tmp_path, "spark-run", scripts["spark-run"]), _script(tmp_path, "spark-jobs", scripts["spark-jobs"])


@pytest.mark.parametrize("args", [["--", "true"], ["--detach", "train", "--", "sleep", "60"]])
def test_spark_run_refuses_a_new_job_while_the_host_is_draining_saying_since_when_and_why(tmp_path, args):
    spark_run, spark_jobs = _draining(tmp_path)
    if os.getuid() != 0:
        pytest.skip("spark-jobs drain is root's")
    env = _no_units(tmp_path)
    drained = _run([spark_jobs, "drain", "--why", "rollout: reboot (/run/reboot-required exists)"], env=env)
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.startswith("spark-jobs: draining since 20") and drained.stdout.endswith("running: none\n")
    result = _run([spark_run, *args])
    assert result.returncode == 75
    assert re.fullmatch(
        r"spark-run: this host is draining since 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC "
        r"\(rollout: reboot \(/run/reboot-required exists\)\): it starts no new job until root runs "
        r"spark-jobs undrain\n",
        result.stderr,
    ), result.stderr
    assert _run([spark_jobs, "undrain"], env=env).stdout.startswith("spark-jobs: undrained (draining since 20")
    assert not (tmp_path / "lib" / "drain").exists()
    if not os.path.isdir("/run/systemd/system"):  # undrained, it goes on to make its scope
        assert "systemd is not running" in _run([spark_run, *args]).stderr


def test_a_second_drain_keeps_the_first_start_and_a_reason_cannot_forge_a_line(tmp_path):
    if os.getuid() != 0:
        pytest.skip("spark-jobs drain is root's")
    _spark_run, spark_jobs = _draining(tmp_path)
    drain, env = tmp_path / "lib" / "drain", _no_units(tmp_path)
    assert _run([spark_jobs, "drain"], env=env).returncode == 0
    drain.write_text("since=2026-01-02 03:04:05 UTC\nwhy=\n")
    assert _run([spark_jobs, "drain", "--why", "x\nsince=1999-01-01"], env=env).returncode == 0
    assert drain.read_text() == "since=2026-01-02 03:04:05 UTC\nwhy=xsince=1999-01-01\n"
    assert oct(drain.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in drain.parent.iterdir()] == ["drain"]  # no temporary file left


def test_drain_and_undrain_are_roots_alone(open_dir):
    scripts = jobs_ops.render_commands("85%", 500, 1, True, drain=str(open_dir / "drain"))
    for command in ("drain", "undrain"):
        result = subprocess.run(
            [*_as_other_user(), "sh", "-s", "--", command],
            input=scripts["spark-jobs"],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
        )
        assert (result.returncode, result.stderr) == (
            1,
            f"spark-jobs: {command} is root's: sudo spark-jobs {command}\n",
        )
    assert not (open_dir / "drain").exists()


# spark-preflight ---------------------------------------------------------------

GIB = 1024 * 1024
SWAPS_HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
TOOLS = ("awk", "grep", "sed", "sort", "cut", "paste", "cat", "sleep", "head", "tr", "id", "stat")


def _fake_system(
    tmp_path: Path,
    available_kib: int = 100 * GIB,
    swaps: str = "",
    earlyoom_active: bool = True,
    nvidia_smi: str | None = None,
) -> dict[str, str]:
    """A fake /proc (meminfo, swaps) and a PATH with only the tools spark-preflight uses,
    a fake systemctl, and a fake nvidia-smi (a script body) when given."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(
        f"MemTotal:       {128 * GIB} kB\nMemFree:        {available_kib} kB\n"
        f"MemAvailable:   {available_kib} kB\nCached:          1024 kB\n"
    )
    (proc / "swaps").write_text(SWAPS_HEADER + swaps)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    fakes = {
        "systemctl": f'[ "$*" = "is-active --quiet earlyoom.service" ] && exit {0 if earlyoom_active else 3}; exit 4'
    }
    if nvidia_smi is not None:
        fakes["nvidia-smi"] = nvidia_smi
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": str(bin_dir), "SPARK_PREFLIGHT_PROC": str(proc)}


def _fake_process(env: dict[str, str], pid: int, comm: str, cmdline: list[str]):
    directory = Path(env["SPARK_PREFLIGHT_PROC"]) / str(pid)
    directory.mkdir()
    (directory / "comm").write_text(comm + "\n")
    (directory / "cmdline").write_text("".join(arg + "\0" for arg in cmdline))


def _preflight(tmp_path: Path, env: dict[str, str], *args: str, script: str | None = None):
    return _run(["/bin/sh", _script(tmp_path, "spark-preflight", script), *args], env=env)


def test_preflight_on_a_ready_host(tmp_path):
    result = _preflight(tmp_path, _fake_system(tmp_path))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [
        f"OK memory: MemAvailable {100 * GIB} KiB >= 67108864 KiB",
        "OK swap: no swap is active",
        "OK watchdog: earlyoom.service is active",
        "OK strays: no vLLM or Ray process is running",
        "SKIP gpu: nvidia-smi is not installed (no NVIDIA driver on this host)",
    ]


def test_preflight_on_a_host_where_everything_is_wrong(tmp_path):
    env = _fake_system(
        tmp_path,
        available_kib=10 * GIB,
        swaps="/swap.img  file  16777212  0  -2\n",
        earlyoom_active=False,
        nvidia_smi='echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9',
    )
    _fake_process(env, 4242, "vllm", ["/home/u/.venv/bin/vllm", "serve", "Qwen/Qwen3-0.6B"])
    _fake_process(env, 4343, "pt_main_thread", ["python3", "-m", "vllm.entrypoints.openai.api_server"])
    _fake_process(env, 4444, "ray::IDLE", ["ray::IDLE"])
    _fake_process(env, 4545, "raylet", ["/x/raylet", "--node_ip_address=10.0.0.2"])
    _fake_process(env, 4646, "pt_main_thread", ["/opt/v/bin/python3", "/opt/v/bin/vllm", "serve", "m"])
    _fake_process(env, 4747, "VLLM::EngineCor", ["VLLM::EngineCore"])
    # Not strays: a word that merely names vllm or ray, a torch job, earlyoom; and what a
    # hostile or careless user runs that names them (an editor, a search, a pager).
    _fake_process(env, 5151, "bash", ["bash", "/home/u/ray.sh", "--out=/data/vllm", "vllm"])
    _fake_process(env, 5454, "vim", ["vim", "/home/u/bin/ray"])
    _fake_process(env, 5555, "grep", ["grep", "-rn", "vllm.entrypoints.openai", "."])
    _fake_process(env, 5656, "less", ["less", "/opt/v/bin/vllm"])
    _fake_process(env, 5757, "python3", ["python3", "/home/u/notes.py", "/opt/v/bin/vllm"])
    _fake_process(env, 5252, "pt_main_thread", ["python3", "train.py", "--ray.address=x"])
    _fake_process(env, 5353, "tail", ["tail", "-f", "/var/log/vllm", "ray.tar"])
    # No argument can make a line of its own: one forging another process's first argument.
    proc = env["SPARK_PREFLIGHT_PROC"]
    _fake_process(env, 6060, "sh", ["sh", "-c", f"true\n{proc}/5999/cmdline:1:/usr/bin/vllm"])
    _fake_process(env, 5999, "sleep", ["sleep", "60"])
    result = _preflight(tmp_path, env)
    assert result.stdout.splitlines() == [
        f"FAIL memory: MemAvailable {10 * GIB} KiB < 67108864 KiB",
        "FAIL swap: swap is active: /swap.img (GPU memory cannot swap; swap only delays a freeze)",
        "FAIL watchdog: earlyoom.service is not active: nothing acts before memory runs out",
        "FAIL strays: running: 4242 vllm, 4343 pt_main_thread, 4444 ray::IDLE, 4545 raylet, "
        "4646 pt_main_thread, 4747 VLLM::EngineCor (spark-preflight --kill-strays ends them)",
        "FAIL gpu: nvidia-smi -L lists no GPU: NVIDIA-SMI has failed because it couldn't "
        "communicate with the NVIDIA driver.",
    ]
    assert result.returncode == 4 + 8 + 16 + 32 + 64


@pytest.mark.parametrize(
    ("args", "code"),
    [([], 4), (["--min-available-kib", str(10 * GIB)], 0), ([f"--min-available-kib={10 * GIB + 1}"], 4)],
)
def test_preflight_memory_threshold_and_its_override(tmp_path, args, code):
    result = _preflight(tmp_path, _fake_system(tmp_path, available_kib=10 * GIB), *args)
    assert result.returncode == code, result.stdout


def test_preflight_names_a_visible_gpu(tmp_path):
    env = _fake_system(tmp_path, nvidia_smi='[ "$1" = -L ] && echo "GPU 0: NVIDIA GB10 (UUID: GPU-5a1b)"')
    result = _preflight(tmp_path, env)
    assert "OK gpu: 1 visible: NVIDIA GB10" in result.stdout.splitlines()
    assert result.returncode == 0


def test_preflight_skips_the_watchdog_when_it_is_disabled(tmp_path):
    script = jobs_ops.render_commands("85%", 500, 67108864, False)["spark-preflight"]
    result = _preflight(tmp_path, _fake_system(tmp_path, earlyoom_active=False), script=script)
    assert "SKIP watchdog: disabled by the watchdog_enabled setting" in result.stdout.splitlines()
    assert result.returncode == 0


@pytest.mark.parametrize("args", [["--min-available-kib"], ["--min-available-kib", "lots"], ["--kill"], ["extra"]])
def test_preflight_usage_errors_exit_2(tmp_path, args):
    result = _preflight(tmp_path, _fake_system(tmp_path), *args)
    assert result.returncode == 2 and result.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_root_kills_other_users_strays_only_when_it_names_them(tmp_path):
    """A real process named vllm of the user nobody: root's --kill-strays leaves it running
    (and says so); --kill-strays --user nobody ends it. A user may not name others."""
    vllm = tmp_path / "vllm"
    shutil.copy(shutil.which("sleep"), vllm)
    vllm.chmod(0o755)
    tmp_path.chmod(0o755)
    stray = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(vllm), "120"])
    try:
        env = _fake_system(tmp_path)
        (Path(env["SPARK_PREFLIGHT_PROC"]) / str(stray.pid)).symlink_to(f"/proc/{stray.pid}")
        kept = _preflight(tmp_path, env, "--kill-strays")
        assert stray.poll() is None and kept.returncode == 32
        assert "others' are killed only when root names them with --user" in kept.stdout
        killed = _preflight(tmp_path, env, "--kill-strays", "--user", "nobody")
        assert stray.wait(timeout=15) == -signal.SIGTERM and killed.returncode == 0
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def test_preflight_kill_strays_ends_a_real_stray_process(tmp_path):
    """A real process named vllm (a copy of sleep), seen through a fake /proc that holds
    only it: listed without the flag, gone with it."""
    vllm = tmp_path / "vllm"
    shutil.copy(shutil.which("sleep"), vllm)
    stray = subprocess.Popen([str(vllm), "120"])
    try:
        env = _fake_system(tmp_path)
        (Path(env["SPARK_PREFLIGHT_PROC"]) / str(stray.pid)).symlink_to(f"/proc/{stray.pid}")
        listed = _preflight(tmp_path, env)
        assert (
            f"FAIL strays: running: {stray.pid} vllm (spark-preflight --kill-strays ends them)"
            in listed.stdout.splitlines()
        )
        assert listed.returncode == 32
        killed = _preflight(tmp_path, env, "--kill-strays")
        assert stray.wait(timeout=15) == -signal.SIGTERM
        assert "OK strays: no vLLM or Ray process is running" in killed.stdout.splitlines()
        assert killed.returncode == 0
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


# spark-drop-caches -------------------------------------------------------------


def test_drop_caches_refuses_to_run_as_an_ordinary_user(tmp_path):
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    # The script on standard input: nobody may not read this test's temporary directory.
    result = _run([*as_nobody, "/bin/sh", "-s"], input=SCRIPTS["spark-drop-caches"])
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("spark-drop-caches: must run as root")


def test_drop_caches_as_root_syncs_and_writes_3(tmp_path):
    """As root, in a private mount namespace where a plain file stands in for
    /proc/sys/vm/drop_caches: the script's write lands there, this machine's cache stays."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to put a file over /proc/sys/vm/drop_caches")
    stand_in = tmp_path / "drop_caches"
    stand_in.write_text("")
    script = _script(tmp_path, "spark-drop-caches")
    result = _run(
        [
            "unshare",
            "--mount",
            "sh",
            "-c",
            f'mount --bind "{stand_in}" /proc/sys/vm/drop_caches && exec /bin/sh "{script}"',
        ]
    )
    if "mount" in result.stderr and result.returncode != 0 and not stand_in.read_text():
        pytest.skip(f"this machine does not allow the bind mount: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"spark-drop-caches: page cache \d+ MiB before, \d+ MiB after\n", result.stdout)
    assert stand_in.read_text() == "3\n"


def test_drop_caches_takes_no_arguments(tmp_path):
    result = _run(["/bin/sh", _script(tmp_path, "spark-drop-caches"), "now"])
    assert result.returncode == 2


# Plans -------------------------------------------------------------------------


def _converged(memory_max="85%", oom=500, kib=67108864, watchdog=True, modes=None, records_age="30d") -> dict:
    """The concern's one HostState read, and each file's FileDigest (read by the file
    operations the concern adds)."""
    files = {jobs_ops.SLICE_FILE: (jobs_ops.render_slice(memory_max), 0o644)}
    if records_age:
        files[jobs_ops.RECORDS_CLEAN] = (jobs_ops.render_records_clean(records_age), 0o644)
    for name, text in jobs_ops.render_commands(memory_max, oom, kib, watchdog).items():
        files[f"{jobs_ops.BIN_DIR}/{name}"] = (text, (modes or {}).get(name, 0o755))
    responses = {HOST_STATE: host_state(files=files)}
    for path, (text, mode) in files.items():
        responses[f"sha256sum {path}"] = digest(text, mode=mode)
    return responses


def _by_name(ops) -> dict:
    return {op.name.removeprefix("Job wrappers | "): op for op in ops}


def test_first_run_writes_the_slice_reloads_systemd_and_installs_four_commands():
    ops = _by_name(execute(jobs.jobs))
    assert list(ops) == [
        "Memory cap of every job (/etc/systemd/system/training.slice)",
        "Reload systemd: training.slice changed",
        "spark-run command (/usr/local/bin/spark-run)",
        "spark-jobs command (/usr/local/bin/spark-jobs)",
        "spark-preflight command (/usr/local/bin/spark-preflight)",
        "spark-drop-caches command (/usr/local/bin/spark-drop-caches)",
        "Job records older than jobs_records_max_age are removed (/etc/tmpfiles.d/sparkrig-jobs.conf)",
    ]
    slice_op = ops["Memory cap of every job (/etc/systemd/system/training.slice)"]
    assert slice_op.uploads == {
        "/etc/systemd/system/.training.slice.sparkrig-new": jobs_ops.render_slice("85%").encode()
    }
    assert ops["Reload systemd: training.slice changed"].commands == ["systemctl daemon-reload"]
    run_op = ops["spark-run command (/usr/local/bin/spark-run)"]
    assert run_op.commands[-1].startswith(
        "chown root:root /usr/local/bin/.spark-run.sparkrig-new && chmod 755 /usr/local/bin/.spark-run.sparkrig-new"
        " && { sh -n /usr/local/bin/.spark-run.sparkrig-new ||"
    )


def test_converged_host_gets_no_operation():
    """One command reads the five files; nothing else runs."""
    assert execute(jobs.jobs, responses=_converged()) == []


def test_new_memory_cap_rewrites_slice_and_spark_run_only_and_reloads_systemd():
    ops = _by_name(execute(jobs.jobs, data={"jobs_memory_max": "100G"}, responses=_converged()))
    changed = [name for name, op in ops.items() if op.commands]
    assert changed == [
        "Memory cap of every job (/etc/systemd/system/training.slice)",
        "Reload systemd: training.slice changed",
        "spark-run command (/usr/local/bin/spark-run)",
    ]
    assert (
        b"MemoryMax=100G\n"
        in ops["Memory cap of every job (/etc/systemd/system/training.slice)"].uploads[
            "/etc/systemd/system/.training.slice.sparkrig-new"
        ]
    )


def test_the_fragmentation_settings_reach_spark_run_and_spark_preflight():
    data = {"jobs_preflight_min_large_blocks": 16, "jobs_preflight_compact": False}
    ops = _by_name(execute(jobs.jobs, data=data, responses=_converged()))
    run = "spark-run command (/usr/local/bin/spark-run)"
    assert [name for name, op in ops.items() if op.commands] == [
        run,
        "spark-preflight command (/usr/local/bin/spark-preflight)",
    ]
    (script,) = ops[run].uploads.values()
    assert b"\nMIN_LARGE_BLOCKS=16\nCOMPACT=no\nPREFLIGHT=/usr/local/bin/spark-preflight\n" in script


def test_disabling_the_watchdog_rewrites_spark_preflight_only():
    ops = _by_name(execute(jobs.jobs, data={"watchdog_enabled": False}, responses=_converged()))
    assert [name for name, op in ops.items() if op.commands] == [
        "spark-preflight command (/usr/local/bin/spark-preflight)"
    ]


def test_a_new_records_age_rewrites_the_tmpfiles_line_only():
    ops = _by_name(execute(jobs.jobs, data={"jobs_records_max_age": "8w"}, responses=_converged()))
    (name,) = [name for name, op in ops.items() if op.commands]
    upload = ops[name].uploads["/etc/tmpfiles.d/.sparkrig-jobs.conf.sparkrig-new"]
    assert upload.decode().splitlines()[-1] == "d /var/lib/sparkrig/jobs 0755 root root mM:8w"


def test_keeping_records_removes_the_tmpfiles_line_and_then_changes_nothing():
    ops = _by_name(execute(jobs.jobs, data={"jobs_records_max_age": ""}, responses=_converged()))
    assert list(ops) == ["Job records are kept (/etc/tmpfiles.d/sparkrig-jobs.conf)"]
    assert execute(jobs.jobs, data={"jobs_records_max_age": ""}, responses=_converged(records_age="")) == []


@pytest.mark.parametrize("bad", ["30", "0d", "30 d", "1y", "30d\n", "-30d", 30, None])
def test_records_age_refuses_what_tmpfiles_would_not_read_as_meant(bad):
    found = problems(jobs.SETTINGS, {"jobs_records_max_age": bad})
    assert len(found) == 1 and "allowed is hours, days or weeks" in found[0], found


def test_records_clean_validator_takes_sparkrigs_line_alone(tmp_path):
    path = tmp_path / "sparkrig-jobs.conf"
    path.write_text(jobs_ops.render_records_clean("30d"))
    assert _run([*jobs_ops.RECORDS_CLEAN_VALIDATOR, path]).returncode == 0
    # Another line (here: remove /etc at boot) or another path must never take effect.
    for bad in (
        "R /etc - - - -\n",
        "d /var/lib/sparkrig 0755 root root mM:30d\n",
        "d /var/lib/sparkrig/jobs 0777 root root mM:30d\n",
    ):
        path.write_text(jobs_ops.render_records_clean("30d") + bad)
        assert _run([*jobs_ops.RECORDS_CLEAN_VALIDATOR, path]).returncode != 0, bad


def _cache_data(**extra) -> dict:
    return {"jobs_model_cache": "/srv/models/huggingface", "jobs_model_cache_users": ["spark", "ada"], **extra}


def test_model_cache_made_with_its_group_and_members_on_a_fresh_host():
    responses = {**_converged(), "getent group": ["nodir", "group "]}
    ops = _by_name(execute(jobs.jobs, data=_cache_data(), responses=responses))
    assert list(ops) == [
        "Model cache group (jobs_model_cache_group)",
        "Model cache group members (jobs_model_cache_users)",
        "Model cache directory (jobs_model_cache, root and the group's, 2775)",
    ]
    assert ops["Model cache group members (jobs_model_cache_users)"].commands == [
        "usermod --append --groups sparkrig-models spark",
        "usermod --append --groups sparkrig-models ada",
    ]


def test_model_cache_converged_gets_no_operation():
    responses = {
        **_converged(),
        "getent group": ["dir 2775 root sparkrig-models", "group sparkrig-models:x:998:spark,ada"],
    }
    assert execute(jobs.jobs, data=_cache_data(), responses=responses) == []


def test_model_cache_that_is_a_link_is_refused():
    responses = {**_converged(), "getent group": ["link", "group sparkrig-models:x:998:"]}
    ops = _by_name(execute(jobs.jobs, data=_cache_data(jobs_model_cache_users=[]), responses=responses))
    (op,) = ops.values()
    assert "is a symbolic link: root would follow it" in op.commands[0]


def test_model_cache_unparsable_output_fails():
    with pytest.raises(Exception):
        jobs_facts.ModelCache().process(["weird line"])


def test_wrong_mode_is_fixed_without_rewriting():
    ops = _by_name(execute(jobs.jobs, responses=_converged(modes={"spark-run": 0o777})))
    assert ops["spark-run command (/usr/local/bin/spark-run)"].commands == [
        "chown root:root /usr/local/bin/spark-run && chmod 755 /usr/local/bin/spark-run"
    ]


def test_spark_run_is_where_spark_container_looks_for_it():
    assert jobs_ops.PATHS["spark-run"] == SPARK_RUN


def _slow_systemd(tmp_path: Path, stops: bool) -> dict:
    """A STAND-IN systemctl (no systemd here) for a job that ignores SIGTERM: a blocking
    `systemctl stop` hangs as the emulated aarch64 host's did; `stop --no-block` queues the
    stop, after which the unit is deactivating for good (``stops=False``) or ends at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stopped = tmp_path / "stop-queued"
    (bin_dir / "systemctl").write_text(f"""#!/bin/sh
case "$*" in
    "stop --no-block "*) touch {stopped}; exit 0 ;;
    stop*) sleep 600 ;;
    *"ActiveState,SubState"*)
        if [ -e {stopped} ] && {"false" if stops else "true"}; then printf 'deactivating\\nstop-sigterm\\n'
        elif [ -e {stopped} ]; then printf 'inactive\\ndead\\n'; else printf 'active\\nrunning\\n'; fi ;;
    *"--property ActiveState "*) if [ -e {stopped} ]; then echo deactivating; else echo active; fi ;;
    *"--property User "*) id -un ;;
    *"--property TimeoutStopUSec "*) echo "1min 30s" ;;
esac
""")
    (bin_dir / "systemctl").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_spark_jobs_stop_waits_a_bounded_time_and_says_what_for(tmp_path):
    script = _spark_jobs(tmp_path, tmp_path / "records")
    started = time.monotonic()
    result = _run([script, "stop", "--wait", "2", "train"], env=_slow_systemd(tmp_path, stops=False))
    assert time.monotonic() - started < 15, "spark-jobs stop waited longer than asked"
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert (
        "spark-jobs: stopping train: systemd sends SIGTERM, and SIGKILL after 1min 30s; waiting up to 2 s for "
        "spark-job-train.service to end"
    ) in result.stderr
    assert "spark-job-train.service is deactivating/stop-sigterm" in result.stderr
    assert (
        "train did not stop within 2 s: spark-job-train.service is deactivating/stop-sigterm; systemd goes on "
        "stopping it" in result.stderr
    ), result.stderr


def test_spark_jobs_stop_never_blocks_on_systemctl_stop(tmp_path):
    result = _run(
        [_spark_jobs(tmp_path, tmp_path / "records"), "stop", "train"], env=_slow_systemd(tmp_path, stops=True)
    )
    assert (result.returncode, result.stdout) == (0, "spark-jobs: stopped train\n"), result.stderr
    assert "waiting up to 120 s for spark-job-train.service" in result.stderr  # the default wait


@pytest.mark.parametrize(
    ("answer_s", "wait_s", "seen"),
    [
        (2, 4, "spark-job-train.service is deactivating/stop-sigterm"),  # slow answers come, then time is up
        (6, 1, "spark-job-train.service is unknown (systemd did not answer within 1 s)"),  # a question cut short
    ],
)
def test_spark_jobs_stop_bounds_its_wait_on_the_clock_when_systemd_answers_slowly(tmp_path, answer_s, wait_s, seen):
    """The emulated aarch64 host's systemd takes seconds to answer: a STAND-IN systemctl (no
    systemd here) whose state question sleeps ANSWER_S before it answers, for a job that
    ignores SIGTERM. Counting polls, `--wait 4` took 5 polls of 2 s and a sleep each (15 s);
    on the clock it ends within its wait and the last question's cut-off (1 s), as each
    question gets the time left, 5 s at most."""
    env = _slow_systemd(tmp_path, stops=False)
    standin = tmp_path / "bin" / "systemctl"
    standin.write_text(
        standin.read_text().replace('*"ActiveState,SubState"*)', f'*"ActiveState,SubState"*) sleep {answer_s}', 1)
    )
    started = time.monotonic()
    result = _run([_spark_jobs(tmp_path, tmp_path / "records"), "stop", "--wait", wait_s, "train"], env=env)
    took = time.monotonic() - started
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert seen in result.stderr, result.stderr
    assert f"train did not stop within {wait_s} s" in result.stderr, result.stderr
    assert took < wait_s + 2.5, f"spark-jobs stop --wait {wait_s} took {took:.1f} s"
