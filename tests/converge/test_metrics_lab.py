"""
Metrics in the lab: the metrics concern converges on the Debian 12 and 13 hosts; node exporter
serves sparkrig's textfile collector's metrics on each host's loopback, scraped there over SSH
(Python's urllib stands in for curl, which the lab's images lack), and their values are checked
against the host's own numbers: /proc/meminfo, uname -r, node exporter's own node_memory_*, the
CUDA toolkit /usr/local/cuda leads to, a job record and a running job unit, a pending reboot,
earlyoom's kill lines, and the answers of a STAND-IN nvidia-smi put in /usr/local/bin for the
test's length (the lab has no GPU: it replays the answers the real nvidia-smi gave on the lent
H100, tests/unit/operations/data/metrics/). promtool accepts what was served. A second converge
changes nothing. Then lab-deb12 listens on its own address with metrics_allow naming the
controller's: the controller is answered, the host itself, asking from that address (not
allowed), is not; the lab's own settings are converged back afterwards.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import lab
from tests.conftest import LAB_INVENTORY, lab_says
from tests.support import inventory_host_data, run_deploy, unavailable

pytestmark = pytest.mark.lab

DEPLOY = "tests/converge/metrics_deploy.py"
HOSTS = ("lab-deb12", "lab-deb13")
DATA = Path(__file__).resolve().parents[1] / "unit" / "operations" / "data" / "metrics"
STANDIN = "/usr/local/bin/nvidia-smi"
JOB_UNIT = "spark-job-lab-metrics.service"
RECORD = "/var/lib/sparkrig/jobs/lab-metrics/lab-metrics-ended"
# Scrapes a URL, or says why not: "status N" or "error ...".
SCRAPE = (
    "import sys, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())\n"
    "except Exception as error:\n"
    "    print('error', error); sys.exit(3)\n"
)


def _standin_script() -> str:
    gpu = (DATA / "h100-recorded-query-gpu.csv").read_text()
    apps = (DATA / "h100-recorded-query-compute-apps.csv").read_text()
    return (
        "#!/bin/sh\n"
        "# sparkrig lab STAND-IN for nvidia-smi (tests/converge/test_metrics_lab.py), for this test's\n"
        "# length: the lab has no GPU. It replays the real nvidia-smi's answers recorded on the lent\n"
        "# H100 (tests/unit/operations/data/metrics/) to the metrics collector's two queries.\n"
        'case "$1" in\n'
        f"  --query-gpu=*) printf '%s' '{gpu}' ;;\n"
        f"  --query-compute-apps=*) printf '%s' '{apps}' ;;\n"
        "  *) echo 'sparkrig lab stand-in nvidia-smi: no GPU in the lab' >&2; exit 9 ;;\n"
        "esac\n"
    )


def _limit(names) -> list[str]:
    return [arg for name in names for arg in ("--limit", name)]


def _ssh(name: str, command: str, **kwargs) -> subprocess.CompletedProcess:
    return lab.run_ssh(name, command, **kwargs)


@functools.cache
def _where(name: str) -> tuple[str, str]:
    """Who scrapes ``name``, and at which URL: the host itself on its loopback where node exporter
    listens there; else the inventory's Prometheus host, the scraper its metrics_allow lets in
    (the lab's inventory puts every host's node exporter on its lab address for lab-deb12)."""
    data = inventory_host_data(LAB_INVENTORY)[name]
    listen = data.get("metrics_listen", "127.0.0.1:9100")
    scraper = name if listen.startswith(("127.", "[::1]")) else data["prometheus_server"]
    return scraper, f"http://{listen}/metrics"


def _scrape(name: str, url: str | None = None, timeout: float = 5) -> subprocess.CompletedProcess:
    """node exporter's page of ``name``, as its scraper gets it; with ``url``, as ``name`` itself asks."""
    scraper, where = (name, url) if url else _where(name)
    return _ssh(scraper, f"python3 -c {_quote(SCRAPE)} {where} {timeout}", check=False)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def samples(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            found[series] = value
    return found


@pytest.fixture(scope="module")
def hosts(lab_hosts, lab_locks):
    names = [h.name for h in lab_hosts if h.name in HOSTS]
    if not names:
        pytest.skip(f"none of {HOSTS} is up")
    return names


@pytest.fixture(scope="module")
def converged(hosts, say):
    started = time.monotonic()
    first = run_deploy(LAB_INVENTORY, *_limit(hosts), deploy=DEPLOY)
    say(f"metrics: converged {', '.join(hosts)} in {time.monotonic() - started:.0f} s")
    assert first.returncode == 0, first.log[-3000:]
    return first


@pytest.fixture(scope="module")
def say(request):
    return lambda message: lab_says(request.config, message)


@pytest.fixture
def standins(hosts, converged):
    """The stand-in nvidia-smi, a job record and a running job unit, and a pending reboot, on
    each host for one test's length (a deploy would read the stand-in: sparkrig's hardware fact
    asks nvidia-smi a question it does not answer)."""
    for name in hosts:
        _ssh(name, f"sudo install -m 755 /dev/stdin {STANDIN}", input=_standin_script())
        _ssh(
            name,
            f"sudo mkdir -p {RECORD.rsplit('/', 1)[0]} && printf 'name=lab-metrics-ended\\nresult=failed\\n' "
            f"| sudo tee {RECORD} >/dev/null && sudo touch /run/reboot-required && "
            f"sudo systemd-run --quiet --unit={JOB_UNIT} sleep 600",
        )
    yield
    for name in hosts:
        _ssh(name, f"sudo rm -f {STANDIN} {RECORD} /run/reboot-required; sudo systemctl stop {JOB_UNIT}", check=False)


def _collect(name: str) -> dict[str, str]:
    """A fresh run of the collector, then one scrape of node exporter, where its scraper asks."""
    _ssh(name, "sudo systemctl start sparkrig-metrics.service")
    scraped = _scrape(name)
    assert scraped.returncode == 0, scraped.stdout
    return samples(scraped.stdout)


def test_node_exporter_serves_the_collectors_metrics_with_the_hosts_own_numbers(hosts, standins):
    gpu = [f.strip() for f in (DATA / "h100-recorded-query-gpu.csv").read_text().split(",")]
    for name in hosts:
        found = _collect(name)
        meminfo = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in _ssh(name, "cat /proc/meminfo").stdout.splitlines()
        }
        # Node exporter serves the textfile's values as Go formats a float64 (2.5276510208e+10).
        assert (
            float(found["sparkrig_memory_total_bytes"])
            == meminfo["MemTotal"]
            == float(found["node_memory_MemTotal_bytes"])
        )
        assert abs(float(found["sparkrig_memory_available_bytes"]) - meminfo["MemAvailable"]) < 512 << 20
        assert abs(float(found["sparkrig_memory_page_cache_bytes"]) - meminfo["Cached"]) < 512 << 20
        assert found["node_textfile_scrape_error"] == "0"
        # The stand-in nvidia-smi's answers (the H100's, recorded).
        assert found["sparkrig_gpu_query_ok"] == "1"
        assert found[f'sparkrig_gpu_info{{gpu="0",name="{gpu[2]}",uuid="{gpu[1]}"}}'] == "1"
        assert float(found['sparkrig_gpu_temperature_celsius{gpu="0"}']) == float(gpu[4])
        assert float(found['sparkrig_gpu_power_watts{gpu="0"}']) == float(gpu[5])
        assert float(found['sparkrig_gpu_sm_clock_hertz{gpu="0"}']) == int(gpu[6]) * 10**6
        assert found['sparkrig_gpu_throttle_reason_active{gpu="0",reason="gpu_idle"}'] == str(int(gpu[8], 16) & 1)
        # The job record and the running job unit put there, the pending reboot.
        assert int(found['sparkrig_jobs{state="failed"}']) >= 1 and int(found['sparkrig_jobs{state="active"}']) >= 1
        assert found["sparkrig_reboot_required"] == "1"
        versions = next(s for s in found if s.startswith("sparkrig_versions_info{"))
        assert f'kernel="{_ssh(name, "uname -r").stdout.strip()}"' in versions and f'driver="{gpu[3]}"' in versions
        # CUDA: version.json's, else the toolkit directory's name (lab-deb13 sees the controller's
        # pip-built toolkit, which has none), else nothing (lab-deb12 has no CUDA).
        toolkit = _ssh(name, "readlink -e /usr/local/cuda", check=False).stdout.strip()
        cuda = _ssh(name, f"cat {toolkit}/version.json", check=False) if toolkit else None
        if cuda is not None and cuda.returncode == 0:
            expected = json.loads(cuda.stdout)["cuda"]["version"]
        else:
            expected = toolkit.rsplit("/cuda-", 1)[1] if "/cuda-" in toolkit else ""
        assert f'cuda="{expected}"' in versions, versions


def test_earlyoom_kill_lines_are_counted(hosts, standins):
    """Each 'sending SIG… to process' line of earlyoom's unit counts once. Where earlyoom is not
    installed (the metrics concern alone), a transient unit of its name and identifier STANDS IN
    for it and prints its kill lines; elsewhere this test skips, saying so."""
    name = hosts[0]
    if _ssh(name, "systemctl cat earlyoom.service", check=False).returncode == 0:
        pytest.skip("earlyoom is installed here: its journal is its own (tests/converge/test_watchdog_kill.py)")
    before = _collect(name)
    line = 'sending SIGTERM to process 4242 uid 1000 "python3": badness 900, VmRSS 100 MiB'
    _ssh(
        name,
        "sudo systemd-run --quiet --wait --unit=earlyoom.service -p SyslogIdentifier=earlyoom "
        f"sh -c {_quote(f'echo {_quote(line)}; echo sending nothing')}",
    )
    time.sleep(1)  # journald writes it
    after = _collect(name)
    key = 'sparkrig_earlyoom_kills_total{signal="%s"}'
    assert int(after[key % "SIGTERM"]) == int(before[key % "SIGTERM"]) + 1
    assert after[key % "SIGKILL"] == before[key % "SIGKILL"]


def test_promtool_accepts_what_node_exporter_serves(hosts, standins):
    promtool = shutil.which("promtool")
    if not promtool:
        unavailable("promtool is not installed (apt-get install prometheus; .ci/install does)")
    _ssh(hosts[0], "sudo systemctl start sparkrig-metrics.service")
    served = _scrape(hosts[0]).stdout
    ours = "\n".join(line for line in served.splitlines() if "sparkrig_" in line) + "\n"
    checked = subprocess.run([promtool, "check", "metrics"], input=ours, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_second_converge_changes_nothing(hosts, converged):
    again = run_deploy(LAB_INVENTORY, *_limit(hosts), deploy=DEPLOY)
    assert again.returncode == 0, again.log[-3000:]
    assert again.changed() == {}, again.changed()


def _allowing_inventory(tmp_path, name: str, address: str, scraper: str) -> str:
    inventory = tmp_path / "metrics.py"
    inventory.write_text(
        "import copy\n"
        "from inventory.lab import lab as _lab\n"
        "lab = [(name, copy.deepcopy(data)) for name, data in _lab]\n"
        "for _name, _data in lab:\n"
        f"    if _name == {name!r}:\n"
        f"        _data['metrics_listen'] = {address + ':9100'!r}\n"
        f"        _data['metrics_allow'] = [{scraper!r}]\n"
    )
    return str(inventory)


def test_a_scraper_not_allowed_gets_no_answer(hosts, converged, lab_hosts, tmp_path):
    name = hosts[0]
    address = next(h.address for h in lab_hosts if h.name == name)
    controller = address.rsplit(".", 1)[0] + ".1"  # the lab's gateway: the controller's end of the host's veth
    inventory = _allowing_inventory(tmp_path, name, address, controller)
    try:
        listening = run_deploy(inventory, *_limit([name]), deploy=DEPLOY)
        assert listening.returncode == 0, listening.log[-3000:]
        url = f"http://{address}:9100/metrics"
        answered = subprocess.run(["python3", "-c", SCRAPE, url, "5"], capture_output=True, text=True, timeout=30)
        assert answered.returncode == 0 and "sparkrig_memory_available_bytes" in answered.stdout, answered.stdout[-500:]
        # The host itself asking its own address: the packets come from that address, not the
        # loopback's, and are not allowed.
        refused = _scrape(name, url, timeout=3)
        assert refused.returncode == 3 and "timed out" in refused.stdout, refused.stdout[-500:]
    finally:
        restored = run_deploy(LAB_INVENTORY, *_limit([name]), deploy=DEPLOY)
    assert restored.returncode == 0, restored.log[-3000:]
    assert _scrape(name).returncode == 0
