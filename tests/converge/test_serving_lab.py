"""
Serving in systemd, on one lab host: the unit, its readiness, the forward-progress probe, the
memory guard (and spark-run --detach's fragmentation check), the drain and the IP filter,
around the lab's engine: llama.cpp's REAL llama-server (engine llama.cpp), built on the
controller from a pinned sdist (lab/llamacpp.py), serving a tiny model with random weights
made on the spot (nothing from a model hub). vLLM itself is proven by its unit tests and its
own argument parser (docs/serving.md). The deploy is serving with what it needs
(tests/converge/serving_deploy.py); everything is removed afterwards. Where the lab has
lab-deb12, the fleet's real Prometheus there (with node exporter on this host) sees the
probe's stall count and fires SparkServingStalled.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import shutil
import time

import pytest

import lab
from lab import llamacpp
from lab.config import HOSTS_DIR
from tests.conftest import LAB_INVENTORY
from tests.converge.test_prometheus_lab import SERVER as PROMETHEUS_HOST
from tests.converge.test_prometheus_lab import api
from tests.support import run_deploy

pytestmark = pytest.mark.lab

HOST = "lab-deb13-b"
DEPLOY = "tests/converge/serving_deploy.py"
VENV = "/opt/sparkrig-lab-serving"  # the venv's path is a setting; llama.cpp does not use it
MODEL_DIR = "/srv/sparkrig-lab-model"
MODEL = f"{MODEL_DIR}/tiny-random.gguf"
SERVER = "/usr/local/bin/llama-server"  # serving_llama_server's default
# One thread and one slot (the lab's machine is small); a context shift lets a request run
# until it is stopped (the frozen-engine test needs one running).
ENGINE_ARGS = ["--threads", "1", "--parallel", "1", "--ctx-size", "512", "--context-shift"]
UNIT = "spark-serve-small.service"
PORT = 18000
STALL_S = 10
INTERVAL_S = 5


def _settings(*extra: str, **model) -> tuple[str, ...]:
    models = [
        {"name": "small", "engine": "llama.cpp", "model": MODEL, "port": PORT, "engine_args": ENGINE_ARGS, **model}
    ]
    return (
        *extra,
        "--limit",
        HOST,
        "--data",
        "python_venv_owner=spark",
        "--data",
        f"python_venv_path={VENV}",
        "--data",
        f"serving_models={json.dumps(models)}",
        "--data",
        f"serving_stall_s={STALL_S}",
        "--data",
        f"serving_probe_interval_s={INTERVAL_S}",
        "--data",
        "serving_start_timeout_s=120",
        "--data",
        "serving_drain_grace_s=10",
    )


def _ssh(command: str, check: bool = True) -> str:
    return lab.run_ssh(HOST, command, check=check).stdout


def _converge(*extra: str, **model) -> None:
    result = run_deploy(LAB_INVENTORY, *_settings(*extra, **model), deploy=DEPLOY, timeout=900)
    assert result.returncode == 0, result.log[-3000:]


def _complete() -> str:
    return _ssh("sudo /usr/bin/python3 -I /usr/local/sbin/sparkrig-serving complete small", check=False)


@pytest.fixture(scope="module")
def served(lab_hosts):
    if HOST not in {h.name for h in lab_hosts}:
        pytest.skip(f"{HOST} is not in this lab")
    # The controller's build (cached; ./test starts it while the lab boots) and the model,
    # written into the host's root file system as root's.
    binary = llamacpp.server()
    rootfs = HOSTS_DIR / HOST / "rootfs"
    (rootfs / SERVER.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(binary, rootfs / SERVER.lstrip("/"))
    os.chmod(rootfs / SERVER.lstrip("/"), 0o755)
    (rootfs / MODEL_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    llamacpp.write_tiny_model(rootfs / MODEL.lstrip("/"))
    os.chmod(rootfs / MODEL.lstrip("/"), 0o644)
    # glibc's alone (libstdc++ and libgcc linked in, no OpenMP): built on Debian 12, run on 13.
    libraries = _ssh(f"ldd {SERVER}")
    assert "not found" not in libraries and "libstdc++" not in libraries and "libgomp" not in libraries, libraries
    started = time.monotonic()
    first = _converge()
    yield {"first_s": time.monotonic() - started, "first": first}
    _ssh(
        f"sudo spark-jobs undrain; sudo systemctl disable --now {UNIT} sparkrig-serving-probe.timer; "
        f"sudo rm -rf /etc/systemd/system/{UNIT} /etc/systemd/system/sparkrig-serving-probe.* "
        f"/usr/local/sbin/sparkrig-serving /etc/sparkrig/serving /var/lib/sparkrig/serving {MODEL_DIR} {SERVER} "
        "/var/lib/sparkrig/metrics/sparkrig_serving.prom; "
        "sudo systemctl daemon-reload",
        check=False,
    )


# The lab's hosts have no curl: a request, its HTTP status printed ("timeout": no answer).
REQUEST = """\
import json, sys, urllib.error, urllib.request
url, body, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
data = body.encode() if body else None
request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
try:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=timeout) as answer:
        answer.read()
        print(answer.status)
except urllib.error.HTTPError as error:
    print(error.code)
except OSError:
    print("timeout")
"""


def _request(url: str, body: str = "", timeout: float = 5, background: bool = False) -> str:
    lab.run_ssh(HOST, "cat > /tmp/sparkrig-serving-request.py", input=REQUEST)
    command = f"python3 -I /tmp/sparkrig-serving-request.py {url} {shlex.quote(body)} {timeout}"
    if background:
        return _ssh(f"setsid -f {command} </dev/null >/dev/null 2>&1")
    return _ssh(command, check=False).strip()


def _main_pid() -> int:
    return int(_ssh(f"systemctl show --property MainPID --value {UNIT}").strip())


def _wait(what, predicate, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    pytest.fail(f"{what}: not within {seconds} s")


def test_a_completion_answers_after_converge_and_a_second_converge_changes_nothing(served):
    assert "one completion of one token answered" in _complete()
    # Readiness: the unit turned active only once the engine answered (not when its port opened).
    journal = _ssh(f"sudo journalctl -u {UNIT} -o cat --no-pager")
    assert "ready: one completion of one token answered" in journal, journal[-2000:]
    # The real engine, as the venv's owner: llama.cpp's server with the tiny random model.
    pid = _main_pid()
    assert _ssh(f"sudo readlink /proc/{pid}/exe").strip() == SERVER
    assert _ssh(f"ps -o user= -p {pid}").strip() == "spark"
    second = run_deploy(LAB_INVENTORY, *_settings(), deploy=DEPLOY)
    assert second.returncode == 0, second.log[-3000:]
    assert second.changed() == {}, second.changed()


@pytest.fixture(scope="module")
def watched(served, lab_hosts) -> bool:
    """Node exporter on HOST and the fleet's Prometheus on its lab host (their concerns alone,
    tests/converge/prometheus_deploy.py), the probe's stall counter seen at 0 before any stall:
    False where the lab has no Prometheus host."""
    if PROMETHEUS_HOST not in {h.name for h in lab_hosts}:
        return False
    result = run_deploy(LAB_INVENTORY, deploy="tests/converge/prometheus_deploy.py", timeout=900)
    assert result.returncode == 0, result.log[-3000:]
    _wait("the probe's stall counter at 0 in Prometheus", lambda: _stalls() == 0.0, 90)
    return True


def _stalls() -> float | None:
    """sparkrig_serving_probe_restarts_total{reason="stall"} of HOST's model, as Prometheus holds it."""
    expr = f'sparkrig_serving_probe_restarts_total{{instance="{HOST}",model="small",reason="stall"}}'
    found = api("/api/v1/query", query=expr)["result"]
    return float(found[0]["value"][1]) if found else None


def _stalled_alerts() -> list[dict]:
    return [
        a
        for a in api("/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == "SparkServingStalled"
        and a["labels"].get("instance") == HOST
        and a["labels"].get("model") == "small"
        and a["state"] == "firing"
    ]


def test_a_frozen_engine_is_restarted_within_the_stall_bound_and_the_alert_fires(served, watched):
    # Quiet before, unless a stall of an earlier run is still inside the rule's 10-minute window.
    earlier = watched and _stalled_alerts()
    before = _main_pid()
    # A request that runs until stopped (tokens without end; the context shifts).
    body = json.dumps({"model": "small", "prompt": "x", "max_tokens": 1_000_000, "ignore_eos": True})
    _request(f"http://127.0.0.1:{PORT}/v1/completions", body, timeout=120, background=True)
    # A probe run sees the request running (and tokens coming) before the engine freezes.
    time.sleep(INTERVAL_S + 3)
    _ssh(f"sudo kill -STOP {before}")
    frozen, frozen_at = time.monotonic(), time.time()
    _wait("the probe restarts the frozen engine", lambda: _main_pid() not in (before, 0), STALL_S + 3 * INTERVAL_S + 15)
    took = time.monotonic() - frozen
    said = _ssh("sudo journalctl -u sparkrig-serving-probe.service -o cat --no-pager")
    assert f"{UNIT}: restarted by sparkrig-serving probe: stalled: 1 request(s) running" in said, said[-2000:]
    assert took <= STALL_S + 2 * INTERVAL_S + 15, took
    _wait("the restarted engine answers", lambda: "answered" in _complete(), 120)
    if not watched:
        pytest.skip(f"the lab has no {PROMETHEUS_HOST}, where the fleet's Prometheus runs: the alert not checked")
    # The probe's count, through node exporter, in the real Prometheus, whose rule fires on it.
    _wait("the probe's stall counted in Prometheus", lambda: _stalls() == 1.0, 60)
    _wait("SparkServingStalled firing in the lab's Prometheus", _stalled_alerts, 60)
    (alert,) = _stalled_alerts()
    if earlier:
        print(f"SparkServingStalled was firing before this stall (since {earlier[0]['activeAt']}): an earlier run's")
    else:
        # Whole seconds (Prometheus gives nanoseconds, which fromisoformat does not take).
        fired = datetime.datetime.fromisoformat(re.sub(r"\.\d+", "", alert["activeAt"]).replace("Z", "+00:00"))
        assert fired.timestamp() >= int(frozen_at), (alert["activeAt"], frozen_at)
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == f"{HOST}: model small stalled while requests wait"


def test_a_start_without_the_models_memory_is_refused_saying_why(served):
    _converge(min_available_gib=4096)
    started = time.monotonic()
    refused = lab.run_ssh(HOST, f"sudo systemctl restart {UNIT}", check=False)
    assert refused.returncode != 0
    assert time.monotonic() - started < 60, "the refused start took long"
    journal = _ssh(f"sudo journalctl -u {UNIT} -o cat --no-pager -n 50")
    assert "start refused by spark-preflight (exit 4): FAIL memory: MemAvailable" in journal, journal[-2000:]
    assert f"< {4096 << 20} KiB" in journal
    _converge()
    assert "answered" in _complete()


def test_fragmented_memory_refuses_a_start_and_a_detached_job_naming_the_check(served):
    """jobs_preflight_min_large_blocks above what any box has: the guard runs the host's real
    spark-preflight with it (and --compact, as root) and refuses the start; spark-run --detach,
    run by the login user, refuses the job before its service is made."""
    _converge("--data", "jobs_preflight_min_large_blocks=999999999")
    try:
        refused = lab.run_ssh(HOST, f"sudo systemctl restart {UNIT}", check=False)
        assert refused.returncode != 0
        journal = _ssh(f"sudo journalctl -u {UNIT} -o cat --no-pager -n 50")
        assert "start refused by spark-preflight (exit 128): FAIL fragmentation: " in journal, journal[-2000:]
        assert "and up < 999999999 (" in journal  # compacted first, or saying why it could not
        job = lab.run_ssh(HOST, "spark-run --detach sparkrig-frag -- true", check=False)
        assert job.returncode == 1, job.stdout + job.stderr
        assert job.stderr.startswith("spark-run: sparkrig-frag not started: FAIL fragmentation: "), job.stderr
        assert "and up < 999999999 (" in job.stderr
        assert _ssh("systemctl is-active spark-job-sparkrig-frag.service", check=False).strip() == "inactive"
    finally:
        _converge()
    assert "answered" in _complete()


def test_drain_stops_the_endpoint_a_drained_reboot_keeps_it_stopped_and_undrain_starts_it(served):
    drained = _ssh("sudo spark-jobs drain --why serving-lab-test")
    assert "stopping the model endpoints" in drained and UNIT in drained, drained
    assert _ssh(f"systemctl is-active {UNIT}", check=False).strip() in ("inactive", "failed")
    # A converge of a drained host starts nothing, nor does its boot (as a rollout's reboot).
    _converge()
    assert _ssh(f"systemctl is-active {UNIT}", check=False).strip() in ("inactive", "failed")
    lab.restart(HOST)
    assert _ssh(f"systemctl is-active {UNIT}", check=False).strip() == "inactive"
    assert "start condition unmet" in _ssh(f"systemctl status {UNIT} --no-pager", check=False)
    # Undrained, as a rollout does once the host is back: the proof's completion answers.
    _ssh("sudo spark-jobs undrain")
    _wait("undrain starts the endpoint", lambda: "answered" in _complete(), 120)


def test_a_client_not_allowed_gets_no_answer_and_the_key_is_needed(served):
    _converge(listen="0.0.0.0", allow=["192.0.2.1"], key=True)
    own = _ssh("hostname -I").split()[0]
    assert _request(f"http://127.0.0.1:{PORT}/health") == "200"
    started = time.monotonic()
    assert _request(f"http://{own}:{PORT}/health") == "timeout"  # its packets dropped: no answer at all
    assert time.monotonic() - started >= 4
    body = json.dumps({"model": "small", "prompt": "x", "max_tokens": 1})
    assert _request(f"http://127.0.0.1:{PORT}/v1/completions", body) == "401"
    assert "answered" in _complete()
    assert _ssh("sudo stat -c '%a %U' /etc/sparkrig/serving/small.key").strip() == "600 root"
    pid = _main_pid()
    key = _ssh("sudo cat /etc/sparkrig/serving/small.key").strip()
    command_line = _ssh(f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    assert command_line.startswith(f"{SERVER} --model {MODEL} --alias small --host 0.0.0.0 "), command_line
    assert key not in command_line and "api-key" not in command_line, command_line
    # The key reached llama-server in its environment alone (it refused the keyless request).
    assert f"LLAMA_API_KEY={key}" in _ssh(f"sudo cat /proc/{pid}/environ | tr '\\0' '\\n'").splitlines()


def test_a_gguf_file_swapped_for_a_link_or_a_server_others_may_change_fail_the_host_naming_it(served):
    """The venv's owner swaps the model file for a link, then root's llama-server is made
    group-writable: each converge fails this host, saying which; put back, it serves again."""
    moved = f"{MODEL_DIR}/moved.gguf"
    try:
        _ssh(f"sudo mv {MODEL} {moved} && sudo ln -s {moved} {MODEL}")
        result = run_deploy(LAB_INVENTORY, *_settings(), deploy=DEPLOY, timeout=900)
        assert result.returncode != 0
        assert "model small: its GGUF file is a symbolic link" in result.log, result.log[-3000:]
        _ssh(f"sudo rm {MODEL} && sudo mv {moved} {MODEL} && sudo chmod 775 {SERVER}")
        result = run_deploy(LAB_INVENTORY, *_settings(), deploy=DEPLOY, timeout=900)
        assert result.returncode != 0
        said = f"serving_llama_server {SERVER}: {SERVER} is writable by group or others (mode 775)"
        assert said in result.log, result.log[-3000:]
    finally:
        _ssh(f"[ -L {MODEL} ] && sudo rm {MODEL} && sudo mv {moved} {MODEL}; sudo chmod 755 {SERVER}", check=False)
    _converge()
    assert "answered" in _complete()
