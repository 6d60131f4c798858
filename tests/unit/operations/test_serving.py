"""Serving: settings refused before any host is contacted, the unit rendered from the settings,
and the helper (probe, guard, readiness, key hand-over) RUN with Python's -I against a fake
engine on the loopback: a STAND-IN HTTP server answering /health, /metrics and
/v1/completions as vLLM does, with stand-ins for systemctl, spark-preflight and
spark-drop-caches."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkrig import rendering
from sparkrig import settings as sparkrig_settings
from sparkrig.operations import load
from sparkrig.operations.jobs import operations as jobs_ops
from sparkrig.operations.serving import deploy as serving
from sparkrig.operations.serving import engines
from sparkrig.operations.serving import facts as serving_facts
from sparkrig.resources import TEMPLATES
from tests.unit.operations.test_preflight_fragmentation import FRAGMENTED, _script, _system
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state

load()
HELPER = TEMPLATES / "serving" / "sparkrig-serving.py"
DATA = Path(__file__).parent / "data" / "serving"
PYTHON = "/usr/bin/python3"
MODEL = {"name": "small", "model": "/srv/models/small", "port": 8000}
GGUF = {"name": "tiny", "engine": "llama.cpp", "model": "/srv/models/tiny.gguf", "port": 8010}


def _settings(**extra):
    values = {**serving.DEFAULTS, **sparkrig_settings.defaults(sparkrig_settings.all_settings())}
    values.update({"python_venv_owner": "spark", "serving_models": [MODEL], **extra})
    return values


# settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("models", "said"),
    [
        ([{**MODEL, "name": "org/small"}], "name 'org/small' is not lowercase letters"),
        ([{**MODEL, "name": "a small"}], "name 'a small' is not lowercase letters"),
        ([MODEL, {**MODEL, "name": "other"}], "'small' and 'other' both use port 8000"),
        ([{**MODEL, "engine_args": ["--max-model-len=1\n--api-key=x"]}], "no space, newline or shell character"),
        ([{**MODEL, "engine_args": ["--x;reboot"]}], "no space, newline or shell character"),
        ([{**MODEL, "engine_args": ["$(id)"]}], "no space, newline or shell character"),
        ([{**MODEL, "engine_args": ["--api-key=secret"]}], "the unit sets --api-key itself"),
        ([{**MODEL, "listen": "0.0.0.0", "allow": ["10.0.0.0/24"]}], "exposes the endpoint without an API key"),
        ([{**MODEL, "listen": "10.0.0.5", "key": True}], "needs allow"),
        ([{**MODEL, "model": "../etc"}], "neither an absolute path nor a Hugging Face id"),
        ([{**MODEL, "model": "/srv/a b"}], "not a normalised absolute path"),
        ([{**MODEL, "port": 80}], "port 80 is not an integer from 1024"),
        ([{**MODEL, "engine": "tgi"}], "engine 'tgi' is not one of vllm, llama.cpp"),
        ([{**GGUF, "model": "/srv/models/small"}], "llama.cpp serves a local GGUF file"),
        ([{**GGUF, "model": "org/small.gguf"}], "llama.cpp serves a local GGUF file"),
        ([{**GGUF, "memory_share": 0.5}], "memory_share is vLLM's (--gpu-memory-utilization); llama.cpp has none"),
        ([{**GGUF, "engine_args": ["--alias", "other"]}], "the unit sets --alias itself"),
        ([{**GGUF, "engine_args": ["--api-key-file", "/tmp/k"]}], "the unit sets --api-key-file itself"),
        ([{**GGUF, "engine_args": ["-m", "/tmp/x.gguf"]}], "the unit sets -m itself"),
    ],
)
def test_a_bad_model_gets_one_error_naming_the_host_the_key_and_what_is_allowed(models, said):
    with pytest.raises(sparkrig_settings.SettingsError) as error:
        sparkrig_settings.validate_hosts([("spark-1", {"python_venv_owner": "spark", "serving_models": models})])
    lines = [line for line in str(error.value).splitlines() if line.startswith("  host")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("  host 'spark-1': serving_models = ") and "allowed is a list of models" in lines[0]
    assert said in lines[0]


@pytest.mark.parametrize("path", ["llama-server", "/usr/local/bin/../bin/llama-server", "/opt/llama server", ""])
def test_a_bad_llama_server_path_gets_one_error_before_any_host_is_contacted(path):
    with pytest.raises(sparkrig_settings.SettingsError) as error:
        sparkrig_settings.validate_hosts([("spark-1", {"serving_llama_server": path})])
    lines = [line for line in str(error.value).splitlines() if line.startswith("  host")]
    assert len(lines) == 1 and lines[0].startswith("  host 'spark-1': serving_llama_server = "), lines
    assert "a normalised absolute path" in lines[0]


def test_the_engine_never_runs_as_root():
    with pytest.raises(sparkrig_settings.SettingsError, match="python_venv_owner not root"):
        sparkrig_settings.validate_hosts([("spark-1", {"serving_models": [MODEL]})])


def test_valid_models_pass():
    sparkrig_settings.validate_hosts(
        [
            (
                "spark-1",
                {
                    "python_venv_owner": "spark",
                    "serving_models": [
                        MODEL,
                        {
                            "name": "big",
                            "model": "Qwen/Qwen3-8B",
                            "port": 8001,
                            "listen": "192.168.1.20",
                            "allow": ["192.168.1.0/24"],
                            "key": True,
                            "memory_share": 0.5,
                            "min_available_gib": 40,
                            "engine_args": ["--max-model-len=8192", "--enforce-eager"],
                        },
                    ],
                },
            )
        ]
    )


# the unit ----------------------------------------------------------------------------------


def test_the_engines_command_line_comes_from_the_settings():
    """The argv vLLM gets. Checked here word by word; vLLM's own parser is not installed on this
    machine (the real-stack venv on the lent GPU machine has it: docs/serving.md)."""
    model = {**MODEL, "memory_share": 0.5, "engine_args": ["--max-model-len=4096"]}
    assert serving.engine_argv("/opt/venv", model) == [
        "/opt/venv/bin/vllm",
        "serve",
        "/srv/models/small",
        "--served-model-name",
        "small",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len=4096",
    ]


def test_llama_cpps_command_line_comes_from_the_settings_and_its_key_stays_off_it(tmp_path):
    """llama-server's words (vendored common/arg.cpp of llama-cpp-python 0.3.36): the GGUF file,
    the alias clients ask for, where it listens, its /metrics on. A keyed model's key reaches it
    in LLAMA_API_KEY (--api-key's environment variable) through the helper, never as a word."""
    settings = _settings(serving_models=[GGUF], serving_llama_server="/opt/llama/bin/llama-server")
    model = {**GGUF, "engine_args": ["--ctx-size", "4096"]}
    assert serving.engine_argv("/opt/venv", model, "/opt/llama/bin/llama-server") == [
        "/opt/llama/bin/llama-server",
        "--model",
        "/srv/models/tiny.gguf",
        "--alias",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "8010",
        "--metrics",
        "--ctx-size",
        "4096",
    ]
    keyed = {**GGUF, "listen": "10.0.0.5", "allow": ["10.0.0.0/24"], "key": True}
    unit = serving.render_unit(keyed, settings)
    (exec_line,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_line == (
        "ExecStart=/usr/bin/python3 -I /usr/local/sbin/sparkrig-serving exec LLAMA_API_KEY -- "
        "/opt/llama/bin/llama-server --model /srv/models/tiny.gguf --alias tiny --host 10.0.0.5 --port 8010 --metrics"
    )
    assert "api-key" not in unit
    assert "LoadCredential=key:/etc/sparkrig/serving/tiny.key" in unit.splitlines()
    assert _validated(tmp_path, unit).returncode == 0


def test_the_probe_reads_each_engines_own_metrics():
    config = json.loads(serving.render_config(_settings(serving_models=[MODEL, GGUF])))
    assert [m["metrics"] for m in config["models"]] == [list(engines.VLLM_METRICS), list(engines.LLAMA_METRICS)]
    assert engines.LLAMA_METRICS == (
        "llamacpp:requests_processing",
        "llamacpp:n_decode_total",
        "llamacpp:requests_deferred",
    )


def _validated(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "unit.service"
    path.write_text(text)
    return subprocess.run([*serving.UNIT_VALIDATOR, str(path)], capture_output=True, text=True, timeout=30)


def test_the_unit_runs_as_the_owner_from_root_guarded_ready_and_filtered(tmp_path):
    text = serving.render_unit(MODEL, _settings())
    assert _validated(tmp_path, text).returncode == 0, _validated(tmp_path, text).stdout
    lines = text.splitlines()
    for wanted in (
        "User=spark",
        "WorkingDirectory=/",
        "EnvironmentFile=-/etc/sparkrig/cuda.env",
        "ExecStartPre=+/usr/bin/python3 -I /usr/local/sbin/sparkrig-serving guard small",
        "ExecStartPost=+/usr/bin/python3 -I /usr/local/sbin/sparkrig-serving ready small",
        "TimeoutStartSec=2400",
        "Restart=on-failure",
        "IPAddressDeny=any",
        "IPAddressAllow=localhost",
        "ConditionPathExists=!/var/lib/sparkrig/drain",
    ):
        assert wanted in lines, wanted
    assert any(line.startswith("Environment=HF_HUB_OFFLINE=1") for line in lines)
    assert not any(line.startswith("LoadCredential") for line in lines)


def test_a_keyed_exposed_unit_gets_its_key_from_systemds_credentials_never_on_a_command_line(tmp_path):
    model = {**MODEL, "listen": "10.0.0.5", "allow": ["10.0.0.0/24"], "key": True}
    text = serving.render_unit(model, _settings(serving_models=[model]))
    assert _validated(tmp_path, text).returncode == 0
    assert "LoadCredential=key:/etc/sparkrig/serving/small.key" in text.splitlines()
    assert "IPAddressAllow=localhost 10.0.0.0/24" in text.splitlines()
    start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert start.startswith("ExecStart=/usr/bin/python3 -I /usr/local/sbin/sparkrig-serving exec VLLM_API_KEY -- ")
    assert "api-key" not in start


def test_systemd_reads_the_unit_without_a_complaint(tmp_path):
    """systemd's own parser (systemd-analyze verify): every key known and well formed. systemd
    before 254 knows no RestartSteps=/RestartMaxDelaySec= (Debian 12's 252) and ignores them,
    keeping RestartSec='s fixed delay."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    model = {**MODEL, "listen": "10.0.0.5", "allow": ["10.0.0.0/24"], "key": True}
    unit = tmp_path / "spark-serve-small.service"
    unit.write_text(serving.render_unit(model, _settings(serving_models=[model], python_venv_owner="nobody")))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "Special user nobody" not in line and not re.search(r"Unknown key '(RestartSteps|RestartMaxDelaySec)'", line)
    ]
    assert complaints == [], complaints


def test_the_validator_refuses_a_unit_that_would_run_something_else(tmp_path):
    text = serving.render_unit(MODEL, _settings())
    for bad in (
        text.replace("IPAddressDeny=any", "IPAddressDeny="),
        text.replace("ExecStartPre=+", "ExecStartPre=+/bin/sh -c x #"),
        text + "ExecStartPost=/bin/sh -c 'id'\n",
        text.replace("User=spark", "User=root\nDynamicUser=no"),
    ):
        assert _validated(tmp_path, bad).returncode != 0


# the fact ----------------------------------------------------------------------------------


def test_the_fact_reads_each_models_directory_without_following_it(tmp_path):
    models = {}
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "huge", "wb") as stream:
        stream.truncate(1 << 40)  # sparse: 1 TiB, read by nothing
    for n, name in enumerate(("dir", "link", "fifo", "huge", "gone")):
        models[name] = (name, str(tmp_path / name), 18000 + n)
    fact = serving_facts.ServingHost()
    command = fact.command(models=tuple(models.values()), unit_prefix="spark-serve-test-nothing-")
    started = time.monotonic()
    out = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30, cwd="/")
    assert time.monotonic() - started < 20
    found = fact.process(out.stdout.splitlines())
    assert found["models"] == {"dir": "dir", "link": "link", "fifo": "fifo", "huge": "file", "gone": "missing"}
    assert serving.model_problem("link", found, False) == (
        "model link: its model directory is a symbolic link (the model's directory itself, not a link to one)"
    )
    assert "is a FIFO" in serving.model_problem("fifo", found, False)
    assert "is a file, not a directory" in serving.model_problem("huge", found, False)
    assert serving.model_problem("dir", found, False) is None


def _server_fact(path) -> dict:
    fact = serving_facts.ServingHost()
    command = fact.command(unit_prefix="spark-serve-test-nothing-", server=str(path))
    out = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30, cwd="/")
    return fact.process(out.stdout.splitlines())


@pytest.mark.skipif(os.geteuid() != 0, reason="making files another user owns needs root")
def test_llama_server_is_run_only_where_root_alone_may_change_it(tmp_path):
    """The fact's stat of the program and its directory, each tried: root's 0755 passes; group-
    or other-writable, another owner's, a link, a directory, missing, a directory others may
    write (a program there could be swapped) each fail that host, saying which."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(bin_dir, 0o755)
    server = bin_dir / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    assert serving.server_problem(str(server), _server_fact(server)) is None
    said = {}
    for case, setup in (
        ("group-writable", lambda: server.chmod(0o775)),
        ("other-writable", lambda: server.chmod(0o757)),
        ("another owner", lambda: os.chown(server, 1000, 0)),
        ("directory writable", lambda: bin_dir.chmod(0o1777)),
        ("directory another's", lambda: os.chown(bin_dir, 1000, 1000)),
    ):
        setup()
        said[case] = serving.server_problem(str(server), _server_fact(server))
        server.chmod(0o755)
        os.chown(server, 0, 0)
        bin_dir.chmod(0o755)
        os.chown(bin_dir, 0, 0)
    where = f"serving_llama_server {server}: "
    assert said == {
        "group-writable": f"{where}{server} is writable by group or others (mode 775)",
        "other-writable": f"{where}{server} is writable by group or others (mode 757)",
        "another owner": f"{where}{server} is owned by uid 1000, not root",
        "directory writable": f"{where}{bin_dir} is writable by group or others (mode 1777)",
        "directory another's": f"{where}{bin_dir} is owned by uid 1000, not root",
    }
    link = bin_dir / "link"
    link.symlink_to(server)
    assert (
        serving.server_problem(str(link), _server_fact(link))
        == f"serving_llama_server {link}: {link} is a symbolic link, not a file"
    )
    assert "is dir, not a file" in serving.server_problem(str(bin_dir), _server_fact(bin_dir))
    gone = bin_dir / "gone"
    assert (
        serving.server_problem(str(gone), _server_fact(gone))
        == f"serving_llama_server {gone}: {gone} is missing, not a file"
    )


def test_the_fact_refuses_a_forged_server_line():
    with pytest.raises(Exception, match="unexpected line"):
        serving_facts.ServingHost().process(["server 0 7x5 regular_file"])


def test_the_fact_finds_a_cache_entry_under_the_owners_home_and_a_held_port(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        fact = serving_facts.ServingHost()
        models = (("cache", "~root/.sparkrig-test-no-such-cache/hub/models--org--name", port),)
        command = fact.command(models=models, unit_prefix="spark-serve-test-nothing-")
        out = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30, cwd="/")
        found = fact.process(out.stdout.splitlines())
    finally:
        listener.close()
    assert found["models"] == {"cache": "missing"}
    assert found["ports_held"] == ["cache"]


def test_the_fact_refuses_a_line_it_does_not_know():
    with pytest.raises(Exception, match="unexpected line"):
        serving_facts.ServingHost().process(["model dir small", "unitfile ../../x\x1b[2J"])


# the helper, run -----------------------------------------------------------------------------


class Engine:
    """A STAND-IN for vLLM's HTTP server on the loopback: what it answers is set per test."""

    def __init__(self):
        self.running, self.tokens, self.health = 0, 0, 200
        self.metrics_text: bytes | None = None
        self.hang = False
        self.redirect = ""
        self.completions = 0
        self.paths: list[str] = []
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def parse_request(self):
                ok = super().parse_request()
                engine.paths.append(self.path)
                return ok

            def _answer(self, code, body: bytes):
                if engine.hang:
                    time.sleep(60)
                    return
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if engine.redirect:
                    self.send_response(302)
                    self.send_header("Location", engine.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/health":
                    self._answer(engine.health, b"")
                elif self.path == "/metrics":
                    self._answer(200, engine.metrics_text or engine.metrics())
                else:
                    self._answer(404, b"")

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                engine.completions += 1
                engine.last_authorization = self.headers.get("Authorization")
                assert body["max_tokens"] == 1
                self._answer(200, json.dumps({"choices": [{"text": "x", "index": 0}]}).encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metrics(self) -> bytes:
        sample = (DATA / "vllm-metrics.txt").read_text()
        return sample.replace("RUNNING", f"{self.running:.1f}").replace("TOKENS", f"{self.tokens:.1f}").encode()


@pytest.fixture
def engine():
    found = Engine()
    yield found
    found.server.shutdown()


@pytest.fixture
def helper_env(tmp_path, engine):
    """A configuration for one model on the stand-in engine, stand-ins for the programs the
    helper runs (each records its arguments), and the state and textfile directories."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name, body in {
        "systemctl": 'case "$1" in show) echo ActiveState=active; echo NRestarts=2;; esac',
        "spark-preflight": 'echo "FAIL memory: MemAvailable 1 KiB < $2 KiB"; exit ${PREFLIGHT_EXIT:-0}',
        "spark-drop-caches": "exit 0",
    }.items():
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        (bin_dir / name).chmod(0o755)
    (tmp_path / "state").mkdir()
    (tmp_path / "textfile").mkdir()
    key = tmp_path / "small.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    config = {
        "models": [
            {
                "name": "small",
                "unit": "spark-serve-small.service",
                "served_name": "small",
                "connect": "127.0.0.1",
                "port": engine.port,
                "key_file": str(key),
                "min_available_kib": 123 << 20,
                "metrics": list(engines.VLLM_METRICS),
            }
        ],
        "stall_s": 30,
        "health_failures": 3,
        "drop_caches": True,
        "drop_caches_program": str(bin_dir / "spark-drop-caches"),
        "compact_file": str(tmp_path / "compact_memory"),
        "preflight": str(bin_dir / "spark-preflight"),
        "state_dir": str(tmp_path / "state"),
        "textfile_dir": str(tmp_path / "textfile"),
    }
    (tmp_path / "models.json").write_text(json.dumps(config))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SPARKRIG_SERVING_CONFIG": str(tmp_path / "models.json")}
    return {"env": env, "calls": calls, "state": tmp_path / "state", "tmp": tmp_path}


def _helper(helper_env, *args, env=None, timeout=60):
    return subprocess.run(
        [PYTHON, "-I", str(HELPER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env={**helper_env["env"], **(env or {})},
    )


def _calls(helper_env) -> list[str]:
    path = helper_env["calls"]
    return path.read_text().splitlines() if path.exists() else []


def _age_state(helper_env, seconds: float):
    """Move the probe's memory of when tokens last moved ``seconds`` back."""
    path = helper_env["state"] / "probe.json"
    state = json.loads(path.read_text())
    state["small"]["since"] -= seconds
    path.write_text(json.dumps(state))


def test_the_probe_restarts_an_engine_whose_tokens_stand_still_while_requests_run(helper_env, engine):
    engine.running, engine.tokens = 2, 500
    assert _helper(helper_env, "probe").returncode == 0
    assert "systemctl restart --no-block spark-serve-small.service" not in _calls(helper_env)
    _age_state(helper_env, 31)
    result = _helper(helper_env, "probe")
    assert result.returncode == 0, result.stderr
    calls = _calls(helper_env)
    assert "systemctl restart --no-block spark-serve-small.service" in calls
    # Killed first: a frozen engine would only wait out the drain grace on SIGTERM.
    kill = "systemctl kill --signal=SIGKILL spark-serve-small.service"
    assert kill in calls and calls.index(kill) < calls.index("systemctl restart --no-block spark-serve-small.service")
    assert (
        "spark-serve-small.service: restarted by sparkrig-serving probe: stalled: 2 request(s) running" in result.stdout
    )
    prom = (helper_env["tmp"] / "textfile" / "sparkrig_serving.prom").read_text()
    assert 'sparkrig_serving_probe_restarts_total{model="small",reason="stall"} 1' in prom.splitlines()
    assert 'sparkrig_serving_unit_restarts_total{model="small"} 2' in prom.splitlines()


def test_the_probe_leaves_an_engine_that_makes_progress_or_is_idle(helper_env, engine):
    engine.running, engine.tokens = 2, 500
    _helper(helper_env, "probe")
    _age_state(helper_env, 31)
    engine.tokens = 501  # a token came out since
    _helper(helper_env, "probe")
    engine.running = 0
    _age_state(helper_env, 300)
    _helper(helper_env, "probe")  # idle: nothing to produce, no stall
    assert not [c for c in _calls(helper_env) if c.startswith("systemctl restart")]
    prom = (helper_env["tmp"] / "textfile" / "sparkrig_serving.prom").read_text()
    assert 'sparkrig_serving_up{model="small"} 1' in prom.splitlines()


def test_an_engine_frozen_whole_answers_nothing_and_is_restarted_all_the_same(helper_env, engine):
    """SIGSTOP freezes vLLM's HTTP server with it: no metrics, no /health, so the counter is as
    it was last read, while requests were running."""
    engine.running, engine.tokens = 1, 7
    _helper(helper_env, "probe")
    engine.hang = True
    _age_state(helper_env, 31)
    started = time.monotonic()
    result = _helper(helper_env, "probe")
    assert time.monotonic() - started < 30, "a request without an answer held the probe"
    assert "systemctl restart --no-block spark-serve-small.service" in _calls(helper_env), result.stdout


def test_the_probe_restarts_after_health_fails_n_times_in_a_row(helper_env, engine):
    engine.health = 503
    for _ in range(2):
        _helper(helper_env, "probe")
    assert not [c for c in _calls(helper_env) if c.startswith("systemctl restart")]
    result = _helper(helper_env, "probe")
    assert "/health failed 3 times in a row" in result.stdout
    assert "systemctl restart --no-block spark-serve-small.service" in _calls(helper_env)


def test_the_probe_reads_nothing_forged_from_an_engines_bytes(helper_env, engine):
    """Control characters, a forged metric line, a huge answer: the probe neither believes nor
    prints them, and ends in time."""
    engine.running, engine.tokens = 1, 5
    _helper(helper_env, "probe")
    engine.metrics_text = b"vllm:num_requests_running 0\n\x1b[2Jfake line\nvllm:generation_tokens_total 9e999\n"
    _age_state(helper_env, 31)
    result = _helper(helper_env, "probe")
    assert "\x1b" not in result.stdout
    assert "systemctl restart --no-block spark-serve-small.service" in _calls(helper_env)
    engine.metrics_text = b"# " + b"x" * (8 << 20) + b"\n"
    started = time.monotonic()
    assert _helper(helper_env, "probe").returncode == 0
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("how", ["group-writable", "another owner", "a link"])
def test_the_probe_writes_its_metrics_only_into_a_directory_roots_alone(helper_env, engine, how):
    """Node exporter's directory sits in the prometheus user's /var/lib/prometheus: a directory
    that user made, or a link it put there, gets nothing from root."""
    textfile = helper_env["tmp"] / "textfile"
    if how == "group-writable":
        textfile.chmod(0o775)
    elif how == "another owner":
        os.chown(textfile, 65534, 65534)
    else:
        textfile.rmdir()
        (helper_env["tmp"] / "elsewhere").mkdir()
        textfile.symlink_to(helper_env["tmp"] / "elsewhere")
    result = _helper(helper_env, "probe")
    assert result.returncode == 0, result.stderr
    assert "not written" in result.stdout
    assert not list(helper_env["tmp"].rglob("sparkrig_serving.prom"))


def test_the_probe_follows_no_redirect_an_engine_answers(helper_env, engine):
    """The engine is its user's code: a redirect would carry root's request and the key past
    the engine's IP filter. Answered with one, the probe counts /health as failed."""
    elsewhere = Engine()
    try:
        engine.redirect = f"http://127.0.0.1:{elsewhere.port}/health"
        for _ in range(3):
            _helper(helper_env, "probe")
        assert elsewhere.paths == []
        assert "systemctl restart --no-block spark-serve-small.service" in _calls(helper_env)
    finally:
        elsewhere.server.shutdown()


def test_the_probe_skips_a_unit_that_is_not_active(helper_env, engine):
    standin = helper_env["tmp"] / "bin" / "systemctl"
    standin.write_text(f'#!/bin/sh\necho "systemctl $*" >> {helper_env["calls"]}\necho ActiveState=inactive\n')
    engine.health = 503
    for _ in range(4):
        _helper(helper_env, "probe")
    assert not [c for c in _calls(helper_env) if c.startswith("systemctl restart")]
    assert engine.completions == 0


def test_the_probe_parses_vllms_real_metrics_text():
    """vLLM's /metrics as vLLM 0.11 serves it (DATA/vllm-metrics.txt names its source): the
    running requests and generated tokens summed over its label sets."""
    namespace: dict = {}
    exec(compile(HELPER.read_text(), str(HELPER), "exec"), namespace)  # noqa: S102
    text = (DATA / "vllm-metrics.txt").read_text().replace("RUNNING", "3.0").replace("TOKENS", "1234.0")
    found = namespace["parse_metrics"](text, engines.VLLM_METRICS)
    assert found == {
        "vllm:num_requests_running": 3.0,
        "vllm:generation_tokens_total": 1234.0,
        "vllm:num_requests_waiting": 1.0,
    }


def test_the_probe_parses_llama_cpps_real_metrics_text():
    """llama-server's /metrics, recorded from the lab's engine (DATA/llamacpp-metrics.txt names
    its source): a request processing, its decode calls the counter that moves."""
    namespace: dict = {}
    exec(compile(HELPER.read_text(), str(HELPER), "exec"), namespace)  # noqa: S102
    text = (DATA / "llamacpp-metrics.txt").read_text()
    found = namespace["parse_metrics"](text, engines.LLAMA_METRICS)
    assert found is not None and None not in found.values(), found
    assert found["llamacpp:requests_processing"] == 1.0
    assert found["llamacpp:n_decode_total"] == 659.0
    # Why not tokens_predicted_total: it stood at the earlier request's 1 while this one ran.
    assert namespace["parse_metrics"](text, ("llamacpp:tokens_predicted_total",)) == {
        "llamacpp:tokens_predicted_total": 1.0
    }
    # vLLM's names are not there: read with the wrong engine's names the probe sees nothing.
    assert namespace["parse_metrics"](text, engines.VLLM_METRICS) == dict.fromkeys(engines.VLLM_METRICS)


def test_the_guard_refuses_a_start_without_the_models_memory_saying_why(helper_env):
    result = _helper(helper_env, "guard", "small", env={"PREFLIGHT_EXIT": "4"})
    assert result.returncode == 1
    assert "spark-serve-small.service: start refused by spark-preflight (exit 4): FAIL memory" in result.stdout
    assert f"spark-preflight --min-available-kib {123 << 20} --min-large-blocks 0" in _calls(helper_env)
    assert _calls(helper_env)[0] == "spark-drop-caches "
    assert (helper_env["tmp"] / "compact_memory").read_text() == "1"
    assert (helper_env["state"] / "small.refused").exists()
    _helper(helper_env, "probe")
    prom = (helper_env["tmp"] / "textfile" / "sparkrig_serving.prom").read_text()
    assert 'sparkrig_serving_start_refused{model="small"} 1' in prom.splitlines()


@pytest.mark.parametrize("compact", [True, False])
def test_the_guard_refuses_a_start_on_fragmented_memory_with_the_real_preflight(helper_env, tmp_path, compact):
    """The guard runs the real spark-preflight (a fake /proc: enough memory, no large free
    block left) with jobs_preflight_min_large_blocks, and --compact as jobs_preflight_compact
    says: the refusal names the fragmentation and whether memory was compacted first."""
    env = _system(tmp_path / "box", FRAGMENTED)
    proc = Path(env["SPARK_PREFLIGHT_PROC"])
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "sys" / "vm" / "compact_memory").write_text("")
    preflight = tmp_path / "spark-preflight"
    preflight.write_text(_script(0))
    preflight.chmod(0o755)
    config_file = Path(helper_env["env"]["SPARKRIG_SERVING_CONFIG"])
    config = json.loads(config_file.read_text())
    config["models"][0]["min_available_kib"] = 1
    config |= {"preflight": str(preflight), "min_large_blocks": 16, "compact": compact}
    config_file.write_text(json.dumps(config))
    result = _helper(helper_env, "guard", "small", env={"SPARK_PREFLIGHT_PROC": str(proc)})
    assert result.returncode == 1, result.stdout + result.stderr
    said = "FAIL fragmentation: 0 free blocks of order 9 and up < 16"
    said += " (after compacting memory: 0 before)" if compact else ": a large allocation may fail"
    assert f"spark-serve-small.service: start refused by spark-preflight (exit 128): {said}" in result.stdout
    assert (proc / "sys" / "vm" / "compact_memory").read_text() == ("1\n" if compact else "")
    config["min_large_blocks"] = 0
    config_file.write_text(json.dumps(config))
    assert _helper(helper_env, "guard", "small", env={"SPARK_PREFLIGHT_PROC": str(proc)}).returncode == 0


def test_the_guard_is_given_the_jobs_fragmentation_settings():
    settings = _settings(serving_models=[MODEL], jobs_preflight_min_large_blocks=16, jobs_preflight_compact=False)
    config = json.loads(serving.render_config(settings))
    assert (config["min_large_blocks"], config["compact"]) == (16, False)
    assert config["textfile_dir"] == "/var/lib/sparkrig/metrics"  # where node exporter reads (metrics)


def test_the_guard_lets_a_start_go_beside_another_models_engine(helper_env):
    """spark-preflight's strays (32) are the other served models' vLLM: no reason to refuse."""
    (helper_env["state"] / "small.refused").write_text("old\n")
    assert _helper(helper_env, "guard", "small", env={"PREFLIGHT_EXIT": "32"}).returncode == 0
    assert not (helper_env["state"] / "small.refused").exists()
    assert _helper(helper_env, "guard", "small", env={"PREFLIGHT_EXIT": "36"}).returncode == 1


def test_readiness_is_one_real_completion_with_the_key(helper_env, engine):
    result = _helper(helper_env, "ready", "small", env={"MAINPID": str(os.getpid())})
    assert result.returncode == 0, result.stdout + result.stderr
    assert engine.completions == 1 and engine.last_authorization == "Bearer " + "k" * 32


def test_readiness_waits_while_no_completion_answers_and_ends_when_the_engine_died(helper_env, engine):
    engine.server.shutdown()
    engine.server.server_close()
    dead = subprocess.run(["true"], check=True)
    del dead
    child = subprocess.Popen(["sleep", "0"])
    child.wait()
    result = _helper(helper_env, "ready", "small", env={"MAINPID": str(child.pid)}, timeout=30)
    assert result.returncode == 1
    assert "the engine exited before its first completion" in result.stdout


def test_readiness_is_not_the_port_opening(helper_env, engine):
    """An engine whose port answers but whose completions do not: not ready (ended by systemd's
    TimeoutStartSec, here by the test's)."""
    engine.hang = True
    with pytest.raises(subprocess.TimeoutExpired):
        _helper(helper_env, "ready", "small", env={"MAINPID": str(os.getpid())}, timeout=8)


def test_exec_hands_the_key_in_the_environment_alone(helper_env, tmp_path):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "key").write_text("s3cret-key\n")
    out = tmp_path / "seen"
    result = _helper(
        helper_env,
        "exec",
        "VLLM_API_KEY",
        "--",
        "/bin/sh",
        "-c",
        f'printf "%s|%s" "$VLLM_API_KEY" "$*" > {out}',
        "sh",
        "serve",
        env={"CREDENTIALS_DIRECTORY": str(credentials)},
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "s3cret-key|serve"


# drain ------------------------------------------------------------------------------------------


def test_drain_stops_the_model_endpoints_and_undrain_starts_them(tmp_path):
    if os.getuid() != 0:
        pytest.skip("spark-jobs drain is root's")
    drain = tmp_path / "lib" / "drain"
    script = tmp_path / "spark-jobs"
    script.write_text(jobs_ops.render_commands("85%", 500, 1, True, drain=str(drain))["spark-jobs"])
    script.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "systemctl").write_text(
        f"""#!/bin/sh
echo "systemctl $*" >> {calls}
case "$1" in
list-units) echo "spark-serve-small.service loaded active running sparkrig model endpoint small"
            echo "spark-serve-x;reboot.service loaded active running forged";;
list-unit-files) echo "spark-serve-small.service enabled enabled";;
esac
exit 0
"""
    )
    (bin_dir / "systemctl").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    drained = subprocess.run([str(script), "drain"], capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert drained.returncode == 0, drained.stderr
    assert "systemctl stop spark-serve-small.service" in calls.read_text().splitlines()
    assert "reboot" not in calls.read_text().split("list-units")[-1].split("\n", 1)[1]
    undrained = subprocess.run([str(script), "undrain"], capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert undrained.returncode == 0, undrained.stderr
    assert "systemctl start --no-block spark-serve-small.service" in calls.read_text().splitlines()


def test_the_helper_is_run_with_python_from_root_alone():
    assert HELPER.read_text().startswith("#!/usr/bin/python3 -I\n")
    assert shutil.which(PYTHON) or sys.executable


# the deploy, planned ------------------------------------------------------------------------

KEYED = {**MODEL, "name": "keyed", "port": 8001, "model": "/srv/models/keyed", "key": True}
DATA_ = {"python_venv_owner": "spark", "serving_models": [MODEL, KEYED]}


def _converged_files(data=DATA_) -> dict:
    settings = _settings(**{k: v for k, v in data.items() if k != "python_venv_owner"})
    files = {
        serving.HELPER: (serving.render_helper(), 0o755),
        serving.CONFIG: serving.render_config(settings),
        serving.PROBE_SERVICE_FILE: rendering.render(
            "serving/sparkrig-serving-probe.service.j2",
            description=serving.PROBE_DESCRIPTION,
            helper=serving.HELPER,
            timeout_s=serving.PROBE_TIMEOUT_S,
        ),
        serving.PROBE_TIMER_FILE: rendering.render(
            "serving/sparkrig-serving-probe.timer.j2",
            description=serving.PROBE_DESCRIPTION,
            interval_s=settings["serving_probe_interval_s"],
        ),
        serving.JOB_DRAIN: None,
    }
    for model in settings["serving_models"]:
        files[serving.unit_file_path(model["name"])] = serving.render_unit(model, settings)
        if model.get("key"):
            files[serving.key_file(model["name"])] = ("0" * 64, 0o600)
    return files


def _host(files=None, active=True, kinds=None, held=(), unit_files=None) -> dict:
    units = {serving.PROBE_TIMER: (active, active)}
    units.update({serving.unit_name(m["name"]): (active, True) for m in DATA_["serving_models"]})
    names = [m["name"] for m in DATA_["serving_models"]]
    fact = [f"model {(kinds or {}).get(n, 'dir')} {n}" for n in names] + [f"held {n}" for n in held]
    fact += [f"unitfile {u}" for u in (unit_files if unit_files is not None else map(serving.unit_name, names))]
    fact.append("probe")
    return {
        HOST_STATE: host_state(files={**_converged_files(), **(files or {})}, units=units),
        "echo probe": fact,
        "--property SubState": ["Id=x", f"SubState={'running' if active else 'dead'}"],
        "--property UnitFileState": ["Id=x", "UnitFileState=enabled"],
    }


def _names(ops) -> list[str]:
    return [op.name.removeprefix("Serving | ") for op in ops]


def test_a_converged_host_gets_no_operation():
    assert execute(serving.serving, data=DATA_, responses=_host()) == []


def test_a_fresh_host_gets_the_helper_its_key_units_and_starts_them():
    fresh = {path: None for path in _converged_files()}
    ops = execute(serving.serving, data=DATA_, responses=_host(files=fresh, active=False, unit_files=[]))
    names = _names(ops)
    for wanted in (
        f"Serving helper: guard, readiness, probe ({serving.HELPER})",
        "Each keyed model has its API key, root's, mode 0600",
        "Model endpoint units (/etc/systemd/system/spark-serve-NAME.service)",
        "Model endpoints are running and answer",
        "sparkrig-serving-probe.timer is enabled and running",
    ):
        assert wanted in names, names
    key = next(op for op in ops if op.name.endswith("mode 0600"))
    assert key.commands[0].startswith("umask 077 && ") and "/dev/urandom" in key.commands[0]
    assert key.commands[0].endswith(
        "&& chown root:root /etc/sparkrig/serving/keyed.key && chmod 600 /etc/sparkrig/serving/keyed.key"
    )
    assert not any("0" * 64 in command for op in ops for command in op.commands)


def test_a_key_file_another_user_could_read_is_made_roots_alone_again():
    loose = {serving.key_file("keyed"): ("0" * 64, 0o644)}
    ops = execute(serving.serving, data=DATA_, responses=_host(files=loose))
    assert _names(ops) == ["Each keyed model has its API key, root's, mode 0600"]


def test_a_drained_host_gets_its_units_and_starts_none():
    fresh = {serving.unit_file_path("small"): None, serving.JOB_DRAIN: "since=x\n"}
    ops = execute(serving.serving, data=DATA_, responses=_host(files=fresh, active=False))
    assert "Model endpoints are running and answer" not in _names(ops)
    assert "Model endpoint units (/etc/systemd/system/spark-serve-NAME.service)" in _names(ops)


@pytest.mark.parametrize(
    ("kind", "said"), [("link", "is a symbolic link"), ("fifo", "is a FIFO"), ("missing", "is missing")]
)
def test_a_model_directory_swapped_for_a_link_or_a_fifo_fails_that_host_naming_it(kind, said):
    ops = execute(serving.serving, data=DATA_, responses=_host(kinds={"keyed": kind}, active=False))
    assert _names(ops) == ["Every served model's directory and port are there for it"]
    assert f"model keyed: its model directory {said}" in ops[0].commands[0]


GGUF_DATA = {"python_venv_owner": "spark", "serving_models": [GGUF]}
ROOTS = "server 0 755 regular_file", "serverdir 0 755 directory"


def _gguf_host(kind="file", server=ROOTS, active=False) -> dict:
    files = {serving.unit_file_path("tiny"): None, serving.CONFIG: None}
    units = {serving.PROBE_TIMER: (active, active), serving.unit_name("tiny"): (active, True)}
    return {
        HOST_STATE: host_state(files={**_converged_files(), **files}, units=units),
        "echo probe": [f"model {kind} tiny", *server, "probe"],
        "--property SubState": ["Id=x", f"SubState={'running' if active else 'dead'}"],
        "--property UnitFileState": ["Id=x", "UnitFileState=enabled"],
    }


def test_a_gguf_model_is_served_by_root_s_llama_server():
    ops = execute(serving.serving, data=GGUF_DATA, responses=_gguf_host())
    assert "Model endpoints are running and answer" in _names(ops), _names(ops)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("link", "is a symbolic link (the GGUF file itself"),
        ("fifo", "is a FIFO, not a regular file"),
        ("dir", "is a dir, not a regular file"),
        ("missing", "is missing"),
    ],
)
def test_a_gguf_file_swapped_for_a_link_or_a_fifo_fails_that_host_naming_it(kind, said):
    ops = execute(serving.serving, data=GGUF_DATA, responses=_gguf_host(kind=kind))
    assert _names(ops) == ["Every served model's directory and port are there for it"]
    assert f"model tiny: its GGUF file {said}" in ops[0].commands[0]


@pytest.mark.parametrize(
    ("server", "said"),
    [
        (("server 1000 755 regular_file", ROOTS[1]), "/usr/local/bin/llama-server is owned by uid 1000, not root"),
        (("server 0 775 regular_file", ROOTS[1]), "/usr/local/bin/llama-server is writable by group or others"),
        (("server 0 777 symbolic_link", ROOTS[1]), "/usr/local/bin/llama-server is a symbolic link, not a file"),
        ((ROOTS[0], "serverdir 0 1777 directory"), "/usr/local/bin is writable by group or others (mode 1777)"),
        (("server", ROOTS[1]), "/usr/local/bin/llama-server is missing, not a file"),
    ],
)
def test_a_llama_server_another_user_could_change_fails_that_host_naming_it(server, said):
    ops = execute(serving.serving, data=GGUF_DATA, responses=_gguf_host(server=server))
    assert _names(ops) == ["Every served model's directory and port are there for it"]
    assert f"serving: serving_llama_server /usr/local/bin/llama-server: {said}" in ops[0].commands[0]


def test_a_port_another_program_holds_fails_that_host_naming_the_model():
    ops = execute(serving.serving, data=DATA_, responses=_host(active=False, held=["small"]))
    assert _names(ops) == ["Every served model's directory and port are there for it"]
    assert "model small: its port is held by another program" in ops[0].commands[0]


def test_a_model_no_longer_listed_has_its_unit_stopped_and_removed():
    ops = execute(
        serving.serving,
        data=DATA_,
        responses=_host(
            unit_files=["spark-serve-small.service", "spark-serve-keyed.service", "spark-serve-old.service"]
        ),
    )
    assert _names(ops) == ["Stop and remove the units of models no longer served"]
    assert ops[0].commands[:2] == [
        "systemctl disable --now spark-serve-old.service",
        "rm -f /etc/systemd/system/spark-serve-old.service",
    ]


@pytest.mark.parametrize("left", [True, False])
def test_serving_turned_off_stops_the_probe_and_removes_its_metrics(left):
    files = {serving.TEXTFILE: 'sparkrig_serving_up{model="small"} 1\n'} if left else {serving.TEXTFILE: None}
    ops = execute(serving.serving, data={**DATA_, "serving_models": []}, responses=_host(files=files, unit_files=[]))
    removal = f"The serving probe's metrics removed ({serving.TEXTFILE}: serving_models is empty)"
    assert _names(ops) == ["Stop the serving probe (serving_models is empty)"] + ([removal] if left else [])
