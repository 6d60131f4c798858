"""Metrics: settings, node exporter's drop-in, and the textfile collector run for real here.

The collector runs as this test's user (root on the lab's controllers) over this machine's own
/proc/meminfo and uname, with its paths (PATH, job records, reboot flag, compliance file,
venv) pointed at a temporary directory. The controller has no GPU: a STAND-IN ``nvidia-smi``
(a script written here, named as such) replays the answers the real nvidia-smi gave on the lent
H100 (tests/unit/operations/data/metrics/, recorded real-device output), or sleeps, or waits.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from sparkrig import rendering
from sparkrig.operations import metrics as m
from sparkrig.operations.metrics import deploy as md
from sparkrig.settings import defaults, problems, resolved
from tests.support import unavailable
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state

DATA = Path(__file__).parent / "data" / "metrics"
RECORDED_GPU = (DATA / "h100-recorded-query-gpu.csv").read_text()
RECORDED_APPS = (DATA / "h100-recorded-query-compute-apps.csv").read_text()
RECORDED_PROM = (DATA / "h100-recorded-sparkrig.prom").read_text()
DEFAULTS = defaults(m.SETTINGS)


# Settings --------------------------------------------------------------------


def test_defaults_are_valid():
    assert problems(m.SETTINGS, {}) == []
    assert DEFAULTS["metrics_listen"] == "127.0.0.1:9100" and DEFAULTS["metrics_enabled"] is True


@pytest.mark.parametrize(
    "data",
    [
        {"metrics_listen": "[::1]:9100"},
        {"metrics_listen": "10.0.0.5:9100", "metrics_allow": ["10.0.0.1"]},
        {"metrics_listen": "[::]:9100", "metrics_allow": ["fd00::/64", "192.168.1.0/24"]},
        {"metrics_interval_s": 5},
    ],
)
def test_good_values(data):
    assert problems(m.SETTINGS, data) == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"metrics_listen": "0.0.0.0:9100"}, "a loopback address while metrics_allow is empty"),
        ({"metrics_listen": "localhost:9100"}, "ADDRESS:PORT, an IPv4 address"),
        ({"metrics_listen": "127.0.0.1:99999"}, "ADDRESS:PORT"),
        ({"metrics_listen": "127.0.0.1:9100 --web.config.file=/tmp/x"}, "ADDRESS:PORT"),
        ({"metrics_listen": "::1:9100"}, "ADDRESS:PORT"),
        ({"metrics_allow": "10.0.0.1"}, "a list of IP addresses or networks"),
        ({"metrics_allow": ["10.0.0.300"]}, "a list of IP addresses or networks"),
        ({"metrics_allow": ["10.0.0.0/24 any"]}, "a list of IP addresses or networks"),
        ({"metrics_allow": ["any"]}, "a list of IP addresses or networks"),
        ({"metrics_interval_s": 1}, "an integer from 5 to 3600"),
        ({"metrics_enabled": "yes"}, "True or False"),
        ({"metrics_listn": "x"}, "did you mean metrics_listen?"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(m.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


def test_the_drop_in_listens_where_told_and_allows_the_host_and_the_scrapers(tmp_path):
    text = md.render_drop_in("10.0.0.5:9100", ["10.0.0.1", "192.168.0.0/24"])
    assert "--web.listen-address=10.0.0.5:9100 " in text
    assert "\nIPAddressDeny=any\n" in text and "\nIPAddressAllow=localhost 10.0.0.1 192.168.0.0/24\n" in text
    path = tmp_path / "50-sparkrig.conf"
    path.write_text(text)
    assert subprocess.run([*md.DROP_IN_VALIDATOR, str(path)]).returncode == 0
    path.write_text(text.replace("IPAddressDeny=any", "IPAddressDeny="))
    assert subprocess.run([*md.DROP_IN_VALIDATOR, str(path)]).returncode != 0


# The collector, run here -----------------------------------------------------

STANDIN_HEADER = "#!/bin/sh\n# sparkrig unit test STAND-IN for nvidia-smi (tests/unit/operations/test_metrics.py)\n"


def _standin(bin_dir: Path, body: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(STANDIN_HEADER + body)
    path.chmod(0o755)
    return path


def _replaying(bin_dir: Path, calls: Path) -> Path:
    """A stand-in that answers the collector's two queries with the H100's recorded answers."""
    gpu, apps = bin_dir / "gpu.csv", bin_dir / "apps.csv"
    bin_dir.mkdir(exist_ok=True)
    gpu.write_text(RECORDED_GPU)
    apps.write_text(RECORDED_APPS)
    return _standin(
        bin_dir,
        (
            f'echo "$*" >> {calls}\n'
            f'case "$1" in --query-gpu=*) cat {gpu} ;; --query-compute-apps=*) cat {apps} ;; *) exit 9 ;; esac\n'
        ),
    )


class Collector:
    def __init__(self, root: Path, timeout_s: int = 5):
        self.root = root
        self.out = root / "textfile"
        self.out.mkdir(mode=0o755, exist_ok=True)
        self.bin = root / "bin"
        self.bin.mkdir(exist_ok=True)
        self.records = root / "jobs"
        self.records.mkdir()
        self.compliance = root / "compliance-last"
        self.reboot = root / "reboot-required"
        self.venv = root / "venv"
        self.script = root / "sparkrig-metrics"
        self.script.write_text(
            md.render_collector(
                str(self.venv),
                path=f"{self.bin}:/usr/bin:/bin",
                records=str(self.records),
                reboot_file=str(self.reboot),
                compliance_file=str(self.compliance),
                textfile_dir=str(self.out),
                timeout_s=timeout_s,
            )
        )

    def start(self) -> subprocess.Popen:
        return subprocess.Popen(
            ["sh", str(self.script)], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def run(self, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(self.script)], cwd="/", capture_output=True, text=True, timeout=timeout)

    def prom(self) -> str:
        return (self.out / md.TEXTFILE).read_text()


@pytest.fixture
def scratch():
    """A scratch root the collector accepts: every component of its path root's alone (a
    directory below /run; pytest's own below /tmp, which everyone may write, is refused)."""
    if os.geteuid() != 0:
        pytest.skip("the collector writes only into a directory root owns: run as root (the lab's controllers do)")
    root = Path(tempfile.mkdtemp(prefix="sparkrig-test-metrics-", dir="/run"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def collector(scratch):
    return Collector(scratch)


def samples(text: str) -> dict[str, str]:
    """'name{labels}' -> value, for every sample line."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            found[series] = value
    return found


def _meminfo() -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()}


def _promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        unavailable("promtool is not installed (apt-get install prometheus; .ci/install does)")
    return found


def test_the_collector_reports_memory_gpu_and_versions_against_their_sources(collector):
    calls = collector.root / "calls"
    _replaying(collector.bin, calls)
    result = collector.run()
    assert result.returncode == 0, result.stderr
    found = samples(collector.prom())
    meminfo = _meminfo()
    assert int(found["sparkrig_memory_total_bytes"]) == meminfo["MemTotal"]
    assert abs(int(found["sparkrig_memory_available_bytes"]) - meminfo["MemAvailable"]) < 512 << 20
    assert abs(int(found["sparkrig_memory_page_cache_bytes"]) - meminfo["Cached"]) < 512 << 20
    # The stand-in's answers: the H100's recorded ones.
    index, uuid, name, driver, temp, power, clock, util, reasons = [f.strip() for f in RECORDED_GPU.split(",")]
    g = f'gpu="{index}"'
    assert found["sparkrig_gpu_query_ok"] == "1"
    assert found[f'sparkrig_gpu_info{{{g},uuid="{uuid}",name="{name}"}}'] == "1"
    assert found[f"sparkrig_gpu_temperature_celsius{{{g}}}"] == temp
    assert found[f"sparkrig_gpu_power_watts{{{g}}}"] == power
    assert int(found[f"sparkrig_gpu_sm_clock_hertz{{{g}}}"]) == int(clock) * 10**6
    assert float(found[f"sparkrig_gpu_utilization_ratio{{{g}}}"]) == int(util) / 100
    mask = int(reasons, 16)
    assert found[f'sparkrig_gpu_throttle_reason_active{{{g},reason="gpu_idle"}}'] == str(mask & 1)
    assert found[f'sparkrig_gpu_throttle_reason_active{{{g},reason="sw_thermal_slowdown"}}'] == str(mask >> 5 & 1)
    assert found["sparkrig_gpu_processes"] == "0" and found["sparkrig_memory_cuda_processes_bytes"] == "0"
    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    versions = next(s for s in found if s.startswith("sparkrig_versions_info{"))
    assert f'kernel="{kernel}"' in versions and f'driver="{driver}"' in versions, versions
    assert found["sparkrig_reboot_required"] == "0"
    assert abs(int(found["sparkrig_metrics_last_run_timestamp_seconds"]) - time.time()) < 60
    # The two queries the recorded answers were given to.
    assert calls.read_text().splitlines() == [
        f"--query-gpu=index,uuid,name,driver_version,temperature.gpu,power.draw,clocks.sm,utilization.gpu,"
        f"{md.THROTTLE_FIELD} --format=csv,noheader,nounits",
        "--query-compute-apps=pid,used_memory --format=csv,noheader,nounits",
    ]


def test_the_recorded_h100_run_has_the_gpu_series_the_replay_has(collector):
    """The collector's output on the real H100 (recorded) and here over its replayed answers
    hold the same GPU series; the values differ only where the GPU moved between the reads."""
    _replaying(collector.bin, collector.root / "calls")
    assert collector.run().returncode == 0
    here = {s for s in samples(collector.prom()) if s.startswith("sparkrig_gpu")}
    real = {s for s in samples(RECORDED_PROM) if s.startswith("sparkrig_gpu")}
    assert here == real and len(real) == 16, sorted(here ^ real)


def test_promtool_accepts_the_collectors_output_and_the_recorded_one(collector):
    promtool = _promtool()
    _replaying(collector.bin, collector.root / "calls")
    collector.compliance.write_text("swap 6 0 1795700000\n")
    (collector.records / "alice").mkdir()
    (collector.records / "alice" / "train").write_text("name=train\nresult=failed\n")
    collector.reboot.write_text("")
    assert collector.run().returncode == 0
    for text in (collector.prom(), RECORDED_PROM):
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    assert samples(collector.prom())["sparkrig_reboot_required"] == "1"


def test_a_gpu_that_does_not_answer_never_blocks_the_collector(scratch):
    """Every nvidia-smi call is under timeout: a driver that hangs costs the GPU lines, never
    the file (the rest is written, sparkrig_gpu_query_ok says 0)."""
    slow = Collector(scratch, timeout_s=2)
    _standin(slow.bin, "sleep 60\n")
    started = time.monotonic()
    result = slow.run(timeout=25)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 15
    found = samples(slow.prom())
    assert found["sparkrig_gpu_query_ok"] == "0"
    assert "sparkrig_memory_available_bytes" in found and not any(s.startswith("sparkrig_gpu_info") for s in found)


def test_a_scrape_never_sees_a_half_written_file(collector):
    """The file is replaced whole: while the collector is still gathering, the last complete
    file stays in place and no other *.prom appears (node exporter reads every *.prom)."""
    started, go = collector.root / "started", collector.root / "go"
    _standin(collector.bin, f"touch {started}\nwhile [ ! -e {go} ]; do sleep 0.05; done\nexit 9\n")
    old = "# TYPE sparkrig_reboot_required gauge\nsparkrig_reboot_required 0\n"
    (collector.out / md.TEXTFILE).write_text(old)
    process = collector.start()
    try:
        deadline = time.monotonic() + 10
        while not started.exists():
            assert time.monotonic() < deadline, "the collector never asked the stand-in nvidia-smi"
            time.sleep(0.05)
        time.sleep(0.3)  # memory lines already gathered
        assert (collector.out / md.TEXTFILE).read_text() == old
        assert sorted(p.name for p in collector.out.glob("*.prom")) == [md.TEXTFILE]
    finally:
        go.touch()
        process.wait(timeout=30)
    assert process.returncode == 0, process.stderr.read()
    assert "sparkrig_memory_total_bytes" in collector.prom()
    assert sorted(p.name for p in collector.out.iterdir()) == [md.TEXTFILE]


@pytest.mark.parametrize("unsafe", ["others may write", "its group may write", "another user's"])
@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_directory_not_roots_alone_is_never_written(scratch, unsafe, where):
    """Any component of the path, not the last one alone: Debian's /var/lib/prometheus is the
    prometheus user's, who could rename node-exporter/ and put a link there."""
    middle = scratch / "var-lib"
    middle.mkdir(mode=0o755)
    collector = Collector(scratch)
    collector.out = middle / "textfile"
    collector.out.mkdir(mode=0o755)
    collector.script.write_text(collector.script.read_text().replace(str(scratch / "textfile"), str(collector.out)))
    weak = collector.out if where == "last" else middle
    if unsafe == "others may write":
        weak.chmod(0o757)
    elif unsafe == "its group may write":
        weak.chmod(0o775)
    else:
        os.chown(weak, 65534, 65534)
    result = collector.run()
    assert result.returncode == 1 and "is not root's alone" in result.stderr
    assert list(collector.out.iterdir()) == []


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_link_in_the_path_is_never_followed(scratch, where):
    """A link where the textfile directory (or a directory above it) was, to a directory that is
    root's alone (/etc, say): the collector refuses it, naming it, and writes nothing there."""
    target = scratch / "etc"
    target.mkdir(mode=0o755)
    collector = Collector(scratch)
    middle = scratch / "var-lib"
    if where == "last":
        middle.mkdir(mode=0o755)
        (middle / "textfile").symlink_to(target)
    else:
        (target / "textfile").mkdir(mode=0o755)
        middle.symlink_to(target)
    script = collector.script.read_text().replace(str(scratch / "textfile"), str(middle / "textfile"))
    collector.script.write_text(script)
    result = collector.run()
    assert result.returncode == 1, result.stderr
    assert "is a link: nothing written" in result.stderr, result.stderr
    assert sorted(p.name for p in target.rglob("*")) == ([] if where == "last" else ["textfile"])


def test_a_missing_textfile_directory_is_made_roots_alone(scratch):
    """A fresh host: the drop-in points node exporter at a directory the collector makes."""
    collector = Collector(scratch)
    collector.out.rmdir()
    assert collector.run().returncode == 0
    assert oct(collector.out.stat().st_mode & 0o7777) == "0o755" and collector.out.stat().st_uid == 0
    assert "sparkrig_memory_total_bytes" in collector.prom()


def test_a_directory_below_a_sticky_one_everyone_may_write_is_refused(tmp_path):
    """/tmp is root's but everyone may make (and then swap) entries in it."""
    if os.geteuid() != 0:
        pytest.skip("the collector writes only into a directory root owns: run as root")
    tmp_path.chmod(0o755)
    collector = Collector(tmp_path)
    result = collector.run()
    assert result.returncode == 1 and "is not root's alone" in result.stderr, result.stderr
    assert list(collector.out.iterdir()) == []


@pytest.mark.parametrize("unsafe", ["others may write", "another user's"])
def test_an_nvidia_smi_not_roots_alone_is_never_run(collector, unsafe):
    ran = collector.root / "ran"
    smi = _standin(collector.bin, f"touch {ran}\n")
    if unsafe == "others may write":
        smi.chmod(0o777)
    else:
        os.chown(smi, 65534, 65534)
    assert collector.run().returncode == 0
    assert not ran.exists()
    assert not any(s.startswith("sparkrig_gpu") for s in samples(collector.prom()))


def test_compliance_lines_are_reported_and_anything_else_skipped(collector):
    collector.compliance.write_text(
        "swap 6 0 1795700000\n"
        "watchdog 3 1 1795700001\n"
        'evil"} 1\nsparkrig_reboot_required 1\n'
        "jobs 1 2\nswap 6 0 1795700000 more\nSwap 1 1 1\ncuda_env 1234567 0 1\n"
    )
    assert collector.run().returncode == 0
    found = {s: v for s, v in samples(collector.prom()).items() if s.startswith("sparkrig_compliance")}
    assert found == {
        'sparkrig_compliance_controls{concern="swap",outcome="passed"}': "6",
        'sparkrig_compliance_controls{concern="swap",outcome="failed"}': "0",
        'sparkrig_compliance_last_run_timestamp_seconds{concern="swap"}': "1795700000",
        'sparkrig_compliance_controls{concern="watchdog",outcome="passed"}': "3",
        'sparkrig_compliance_controls{concern="watchdog",outcome="failed"}': "1",
        'sparkrig_compliance_last_run_timestamp_seconds{concern="watchdog"}': "1795700001",
    }


def test_versions_come_from_the_venvs_metadata_never_through_a_link(collector):
    """torch's and vLLM's versions are read from their METADATA through the one bounded reader:
    a METADATA that is a link (to a file root may read and the venv's owner may not) is not read."""
    site = collector.venv / "lib" / "python3.12" / "site-packages"
    (site / "torch-2.11.0.dist-info").mkdir(parents=True)
    (site / "torch-2.11.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n\nVersion: 9\n"
    )
    (site / "vllm-0.20.2.dist-info").mkdir()
    secret = collector.root / "secret"
    secret.write_text("Version: 6.6.6\n")
    (site / "vllm-0.20.2.dist-info" / "METADATA").symlink_to(secret)
    assert collector.run().returncode == 0
    versions = next(s for s in samples(collector.prom()) if s.startswith("sparkrig_versions_info{"))
    assert 'torch="2.11.0"' in versions and 'vllm=""' in versions, versions


def test_label_values_cannot_break_a_line(collector):
    """What nvidia-smi prints becomes a label value of safe characters only."""
    _standin(
        collector.bin,
        """case "$1" in --query-gpu=*) printf '%s\\n' '0, GPU-x"} 1
sparkrig_reboot_required 1, Evil\\" GPU, 580.1, 40, [N/A], 2100, 50, Not Supported' ;; *) exit 9 ;; esac
""",
    )
    assert collector.run().returncode == 0
    text = collector.prom()
    found = samples(text)
    assert found["sparkrig_reboot_required"] == "0", text
    assert all(
        re.fullmatch(r'[a-z_]+(\{([a-z_]+="[^"\\\n]*",?)*\})? [0-9.e+-]+', s + " " + v) for s, v in found.items()
    ), text


# Plans -------------------------------------------------------------------------


def _host(installed=True, running=True, files=None) -> dict:
    """The host as the concern's one HostState command reads it, and as systemd's status facts
    read it when the operations it adds run."""
    converged = {
        md.DROP_IN: md.render_drop_in(DEFAULTS["metrics_listen"], DEFAULTS["metrics_allow"]),
        # The venv whose versions it reads: python_stack's, where that concern is imported.
        md.COLLECTOR: (md.render_collector(resolved({}).get("python_venv_path", ""), 5), 0o755),
        md.SERVICE_FILE: _service_text(),
        md.TIMER_FILE: _timer_text(DEFAULTS["metrics_interval_s"]),
    }
    return {
        HOST_STATE: host_state(
            files={**converged, **(files or {})},
            units={md.EXPORTER: (running, running), md.TIMER: (running, running)},
            packages={md.PACKAGE: "1.5.0-1+b6" if installed else None},
        ),
        "--property SubState": ["Id=x", f"SubState={'running' if running else 'dead'}"],
        "--property UnitFileState": ["Id=x", f"UnitFileState={'enabled' if running else 'disabled'}"],
    }


def _service_text() -> str:
    return rendering.render(
        "metrics/sparkrig-metrics.service.j2",
        description=md.DESCRIPTION,
        collector=md.COLLECTOR,
        timeout_s=md.RUN_TIMEOUT_S,
    )


def _timer_text(interval: int) -> str:
    return rendering.render("metrics/sparkrig-metrics.timer.j2", description=md.DESCRIPTION, interval_s=interval)


def _names(ops) -> list[str]:
    return [op.name.removeprefix("Metrics | ") for op in ops]


def test_a_converged_host_gets_no_operation():
    assert execute(md.metrics, responses=_host()) == []


def test_a_fresh_host_gets_node_exporter_the_collector_and_its_timer():
    fresh = {path: None for path in (md.DROP_IN, md.COLLECTOR, md.SERVICE_FILE, md.TIMER_FILE)}
    ops = execute(md.metrics, responses=_host(installed=False, running=False, files=fresh))
    names = _names(ops)
    assert names[0] == "Install prometheus-node-exporter"
    assert ops[0].commands[-1].endswith("install --no-install-recommends prometheus-node-exporter")
    for expected in (
        f"{md.EXPORTER} is enabled and running",
        f"{md.TIMER} is enabled and running",
        f"Restart {md.EXPORTER}: its files changed",
        f"Restart {md.TIMER}: its files changed",
    ):
        assert expected in names, names


def test_a_new_listen_address_rewrites_the_drop_in_and_restarts_node_exporter_alone():
    data = {"metrics_listen": "10.0.0.5:9100", "metrics_allow": ["10.0.0.1"]}
    ops = execute(md.metrics, data=data, responses=_host())
    assert _names(ops) == [
        f"node exporter listens on metrics_listen, answers metrics_allow ({md.DROP_IN})",
        "Reload systemd: node exporter's drop-in changed",
        f"Restart {md.EXPORTER}: its files changed",
    ]
    upload = next(iter(ops[0].uploads.values())).decode()
    assert "--web.listen-address=10.0.0.5:9100 " in upload and "IPAddressAllow=localhost 10.0.0.1\n" in upload


def test_a_new_interval_rewrites_the_timer_and_restarts_it():
    ops = execute(md.metrics, data={"metrics_interval_s": 15}, responses=_host())
    assert _names(ops) == [
        f"Textfile collector every metrics_interval_s ({md.TIMER_FILE})",
        "Reload systemd: the collector's timer changed",
        f"Restart {md.TIMER}: its files changed",
    ]


def test_disabled_metrics_stop_both_units_and_write_nothing():
    ops = execute(md.metrics, data={"metrics_enabled": False}, responses=_host())
    assert _names(ops) == [
        f"{md.TIMER} is stopped and disabled (metrics_enabled is False)",
        f"{md.EXPORTER} is stopped and disabled (metrics_enabled is False)",
    ]
    assert execute(md.metrics, data={"metrics_enabled": False}, responses=_host(installed=False, running=False)) == []
