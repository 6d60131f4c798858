"""
The fleet's Prometheus in the lab: the real Prometheus (Debian's) on lab-deb12 scrapes every
lab host's real node exporter; what it holds agrees with each host's own numbers; and a job in
training.slice (spark-run) that takes memory on a lab host makes the SparkMemoryLow alert fire,
read from Prometheus' own HTTP API (/api/v1/alerts), then resolve once the job is gone.

The lab's hosts share the controller's memory (about 24 GiB, shared with other work), so the
test does not fill it: it sets the alert's threshold (prometheus_memory_available_min_bytes, a
converge of lab-deb12 alone) just below the MemAvailable it reads at the start, takes
HOG_MIB more, and skips, saying so, where that would leave the controller under FLOOR_MIB. Every
lab host sees the same MemAvailable, so the alert fires for each: the test checks the pressured
one, and that it was quiet before. The threshold is converged back afterwards.
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.parse

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import run_deploy

pytestmark = pytest.mark.lab

SERVER = "lab-deb12"
API = "http://127.0.0.1:9090"
# The job's memory, and how far below the MemAvailable read at the start the threshold goes.
HOG_MIB = 1536
HEADROOM_MIB = 512
# Never take the controller below this much available memory.
FLOOR_MIB = 3072
JOB = "sparkrig-memtest"
# Takes its memory in 128 MiB steps (each page touched), then holds it.
HOG = (
    "import sys, time\n"
    "held = []\n"
    "for _ in range(int(sys.argv[1]) // 128):\n"
    "    held.append(bytearray(b'\\1') * (128 << 20)); time.sleep(0.1)\n"
    "time.sleep(int(sys.argv[2]))\n"
)


def api(path: str, **params: str) -> dict:
    """Prometheus' HTTP API on lab-deb12, asked on that host (it listens on loopback alone)."""
    url = API + path + ("?" + urllib.parse.urlencode(params) if params else "")
    fetch = (
        "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    )
    found = json.loads(lab.run_ssh(SERVER, f"python3 -I -c {shlex.quote(fetch)} {shlex.quote(url)}").stdout)
    assert found["status"] == "success", found
    return found["data"]


def query(expr: str) -> dict[str, float]:
    """An instant query's value per instance."""
    return {s["metric"]["instance"]: float(s["value"][1]) for s in api("/api/v1/query", query=expr)["result"]}


def wait_for(what: str, check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:.0f} s")
        time.sleep(1)


def meminfo(name: str) -> dict[str, int]:
    return {
        line.split(":")[0]: int(line.split()[1]) * 1024
        for line in lab.run_ssh(name, "cat /proc/meminfo").stdout.splitlines()
    }


def firing(instance: str) -> list[dict]:
    return [
        a
        for a in api("/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == "SparkMemoryLow"
        and a["labels"]["instance"] == instance
        and a["state"] == "firing"
    ]


def loaded_threshold() -> float:
    """SparkMemoryLow's threshold as the running Prometheus loaded it (its API prints it as a float)."""
    (rule,) = [r for g in api("/api/v1/rules")["groups"] for r in g["rules"] if r["name"] == "SparkMemoryLow"]
    return float(rule["query"].rsplit("<", 1)[1])


@pytest.fixture
def hosts(lab_hosts, first_converge) -> list[str]:
    assert first_converge.returncode == 0, "the first converge failed; see its test"
    names = [host.name for host in lab_hosts]
    if SERVER not in names:
        pytest.skip(f"the lab has no {SERVER}, where the fleet's Prometheus runs (inventory/lab.py)")
    return names


def test_prometheus_scrapes_every_lab_host_and_holds_each_hosts_own_numbers(hosts):
    wait_for("every lab host up in Prometheus", lambda: query('up{job="sparkrig"}') == dict.fromkeys(hosts, 1.0), 60)
    # A collector run of now on every host, seen by Prometheus: its file is up to one timer
    # interval old, and a test before this one may have changed what it reports (a pending reboot).
    started = time.time() - 1
    for name in hosts:
        lab.run_ssh(name, "sudo systemctl start sparkrig-metrics.service")
    runs = "sparkrig_metrics_last_run_timestamp_seconds"
    wait_for(
        "a collector run of every host since the test began, in Prometheus",
        lambda: (seen := query(runs)).keys() == set(hosts) and min(seen.values()) >= started,
        60,
    )
    for name in hosts:
        own = meminfo(name)
        assert query(f'node_memory_MemTotal_bytes{{instance="{name}"}}') == {name: own["MemTotal"]}
        assert query(f'sparkrig_memory_total_bytes{{instance="{name}"}}') == {name: own["MemTotal"]}
        # MemAvailable moves with the controller's other work: within 1 GiB of the host's own.
        for metric in ("node_memory_MemAvailable_bytes", "sparkrig_memory_available_bytes"):
            (seen,) = query(f'{metric}{{instance="{name}"}}').values()
            assert abs(seen - meminfo(name)["MemAvailable"]) < 1 << 30, (name, metric, seen)
        pending = lab.run_ssh(name, "test -e /run/reboot-required", check=False).returncode == 0
        assert query(f'sparkrig_reboot_required{{instance="{name}"}}') == {name: float(pending)}
        # The textfile collector ran within two of its intervals (metrics_interval_s, 30 s).
        assert query(f'time() - sparkrig_metrics_last_run_timestamp_seconds{{instance="{name}"}}')[name] < 70, name


def _stop_job(name: str) -> None:
    lab.run_ssh(
        name,
        f"sudo systemctl stop spark-job-{JOB}.service; sudo systemctl reset-failed spark-job-{JOB}.service",
        check=False,
    )


def test_a_job_that_takes_memory_fires_the_memory_alert_through_prometheus(hosts):
    host = next(name for name in ("lab-deb13-b", "lab-deb13", SERVER) if name in hosts)
    available = meminfo(host)["MemAvailable"]
    if available - (HOG_MIB << 20) < FLOOR_MIB << 20:
        pytest.skip(
            f"the controller has {available >> 20} MiB available: a {HOG_MIB} MiB job would leave "
            f"less than {FLOOR_MIB} MiB"
        )
    threshold = available - (HEADROOM_MIB << 20)
    converged = run_deploy(
        LAB_INVENTORY, "--limit", SERVER, "--data", f"prometheus_memory_available_min_bytes={threshold}"
    )
    try:
        assert converged.returncode == 0, converged.log[-3000:]
        rules = lab.run_ssh(SERVER, "cat /etc/prometheus/sparkrig.rules.yml").stdout
        assert f"< {threshold}\n" in rules
        wait_for(
            "the new threshold loaded (SparkMemoryLow quiet before the job)",
            lambda: loaded_threshold() == threshold and not firing(host),
            30,
        )
        started = time.time()
        lab.run_ssh(
            host, shlex.join(["spark-run", "--detach", JOB, "--", "python3", "-I", "-c", HOG, str(HOG_MIB), "300"])
        )
        alert = wait_for(f"SparkMemoryLow firing for {host}", lambda: firing(host), 90)[0]
        fired = time.time()
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["summary"].startswith(f"{host}: MemAvailable ")
        assert float(alert["value"]) < threshold
        # The job ran in training.slice, as every spark-run job does.
        unit = lab.run_ssh(host, f"systemctl show --property Slice --value spark-job-{JOB}.service").stdout.strip()
        assert unit == "training.slice"
        _stop_job(host)
        wait_for(f"SparkMemoryLow resolved for {host} once the job ended", lambda: not firing(host), 60)
        # The window benchmarks/memory_alert_graph.py draws (docs/monitoring.md).
        print(
            f"memory alert on {host}: job started {started:.0f}, alert firing {fired:.0f} "
            f"(+{fired - started:.0f} s), resolved {time.time():.0f}; --threshold {threshold}"
        )
    finally:
        _stop_job(host)
        restored = run_deploy(LAB_INVENTORY, "--limit", SERVER)
        assert restored.returncode == 0, restored.log[-3000:]
