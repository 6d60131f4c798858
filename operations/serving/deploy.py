"""Serving: one unit per served model, the helper its guard, readiness and probe run, the probe's
timer; the files they are made of and the host's one reading."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api import QuoteString, StringCommand, deploy
from pyinfra.operations import server, systemd

from sparkrig import atomic, host_settings, reading, rendering, service
from sparkrig.messages import refused
from sparkrig.resources import TEMPLATES
from sparkrig.units import JOB_DRAIN, METRICS_TEXTFILE_DIR, SERVE_UNIT_PREFIX, WATCHDOG_SERVICE

from .engines import ENGINE_METRICS, KEY_VARIABLES, engine, engine_argv, server_problem
from .facts import ServingHost
from .settings import DEFAULTS

HELPER = "/usr/local/sbin/sparkrig-serving"
PYTHON = "/usr/bin/python3"
CONFIG_DIR = "/etc/sparkrig/serving"
CONFIG = f"{CONFIG_DIR}/models.json"
STATE_DIR = "/var/lib/sparkrig/serving"
UNIT_DIR = "/etc/systemd/system"
PROBE_SERVICE = "sparkrig-serving-probe.service"
PROBE_TIMER = "sparkrig-serving-probe.timer"
PROBE_SERVICE_FILE = f"{UNIT_DIR}/{PROBE_SERVICE}"
PROBE_TIMER_FILE = f"{UNIT_DIR}/{PROBE_TIMER}"
PROBE_DESCRIPTION = "sparkrig forward-progress probe of the model endpoints, see docs/serving.md"
# The probe's whole run: each model's two requests (5 s each) and a systemctl call or two.
PROBE_TIMEOUT_S = 120
PREFLIGHT = "/usr/local/bin/spark-preflight"
DROP_CACHES = "/usr/local/bin/spark-drop-caches"
COMPACT = "/proc/sys/vm/compact_memory"
# The probe's series for node exporter (the helper writes it there; metrics reads the directory).
TEXTFILE = f"{METRICS_TEXTFILE_DIR}/sparkrig_serving.prom"


def unit_name(name: str) -> str:
    return f"{SERVE_UNIT_PREFIX}{name}.service"


def unit_file_path(name: str) -> str:
    return f"{UNIT_DIR}/{unit_name(name)}"


def key_file(name: str) -> str:
    return f"{CONFIG_DIR}/{name}.key"


def exec_start(settings: Mapping[str, Any], model: Mapping[str, Any]) -> list[str]:
    argv = engine_argv(settings["python_venv_path"], model, settings["serving_llama_server"])
    if model.get("key"):
        # The key reaches the engine in its environment (readable by its user and root alone),
        # from the credential systemd hands this unit, never on a command line.
        return [PYTHON, "-I", HELPER, "exec", KEY_VARIABLES[engine(model)], "--", *argv]
    return argv


def allow_list(allow: Sequence[str]) -> str:
    return " ".join(["localhost", *allow])


def render_unit(model: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    name = model["name"]
    return rendering.render(
        "serving/spark-serve.service.j2",
        name=name,
        description=f"sparkrig model endpoint {name}, see docs/serving.md",
        watchdog_service=WATCHDOG_SERVICE,
        drain=JOB_DRAIN,
        user=settings["python_venv_owner"],
        env_file=settings["cuda_env_file"],
        key=bool(model.get("key")),
        key_file=key_file(name),
        helper=HELPER,
        exec_start=" ".join(exec_start(settings, model)),
        start_timeout_s=settings["serving_start_timeout_s"],
        grace_s=settings["serving_drain_grace_s"],
        allow=allow_list(model.get("allow", [])),
    )


def connect_address(listen: str) -> str:
    """Where the helper reaches an endpoint listening on ``listen``, as a URL's host."""
    if listen in ("0.0.0.0", "::"):
        return "127.0.0.1" if listen == "0.0.0.0" else "[::1]"
    return f"[{listen}]" if ":" in listen else listen


def render_config(settings: Mapping[str, Any]) -> str:
    """The helper's configuration (root's, no secret: the key files' paths alone)."""
    config = {
        "models": [
            {
                "name": model["name"],
                "unit": unit_name(model["name"]),
                "served_name": model["name"],
                "connect": connect_address(model.get("listen", "127.0.0.1")),
                "port": model["port"],
                "key_file": key_file(model["name"]) if model.get("key") else None,
                "min_available_kib": model.get("min_available_gib", 1) << 20,
                "metrics": list(ENGINE_METRICS[engine(model)]),
            }
            for model in settings["serving_models"]
        ],
        "stall_s": settings["serving_stall_s"],
        "health_failures": settings["serving_health_failures"],
        "drop_caches": settings["serving_drop_caches"],
        "drop_caches_program": DROP_CACHES,
        "compact_file": COMPACT,
        "preflight": PREFLIGHT,
        "min_large_blocks": settings["jobs_preflight_min_large_blocks"],
        "compact": settings["jobs_preflight_compact"],
        "state_dir": STATE_DIR,
        "textfile_dir": METRICS_TEXTFILE_DIR if settings["metrics_enabled"] else "",
    }
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def render_helper() -> str:
    return (TEMPLATES / "serving" / "sparkrig-serving.py").read_text(encoding="utf-8")


UNIT_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Service", "Install"],
    {
        "Description": "sparkrig model endpoint [a-z0-9_.-]+, see docs/serving.md",
        "Wants": "network-online.target",
        "After": r"network-online.target [a-z.-]+\.service",
        "ConditionPathExists": f"!{JOB_DRAIN}",
        "StartLimitIntervalSec": "[0-9]+",
        "StartLimitBurst": "[0-9]+",
        "Type": "exec",
        "User": "[a-z_][a-z0-9_-]*",
        "WorkingDirectory": "/",
        "EnvironmentFile": "-/[A-Za-z0-9_./-]+",
        "Environment": "HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1",
        "LoadCredential": f"key:{CONFIG_DIR}/[a-z0-9_.-]+\\.key",
        "ExecStartPre": rf"\+{PYTHON} -I {HELPER} guard [a-z0-9_.-]+",
        "ExecStart": "/[A-Za-z0-9_./:=,+@ -]+",
        "ExecStartPost": rf"\+{PYTHON} -I {HELPER} ready [a-z0-9_.-]+",
        "TimeoutStartSec": "[0-9]+",
        "TimeoutStopSec": "[0-9]+",
        "Restart": "on-failure",
        "RestartSec": "[0-9]+",
        "RestartSteps": "[0-9]+",
        "RestartMaxDelaySec": "[0-9]+",
        "NoNewPrivileges": "yes",
        "IPAddressDeny": "any",
        "IPAddressAllow": "localhost( [0-9A-Fa-f:./]+)*",
        "WantedBy": "multi-user.target",
    },
)
PROBE_SERVICE_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Service"],
    {
        "Description": PROBE_DESCRIPTION,
        "Type": "oneshot",
        "ExecStart": f"{PYTHON} -I {HELPER} probe",
        "WorkingDirectory": "/",
        "TimeoutStartSec": "[0-9]+",
    },
)
PROBE_TIMER_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Timer", "Install"],
    {
        "Description": PROBE_DESCRIPTION,
        "OnActiveSec": "0",
        "OnUnitActiveSec": "[0-9]+s",
        "AccuracySec": "1s",
        "WantedBy": "timers.target",
    },
)
# The helper parses as Python before it takes the place of the live one.
HELPER_VALIDATOR = (PYTHON, "-I", "-c", "import ast, sys; ast.parse(open(sys.argv[1], encoding='utf-8').read())")
CONFIG_VALIDATOR = (PYTHON, "-I", "-c", "import json, sys; json.load(open(sys.argv[1], encoding='utf-8'))")


def hub_cache(settings: Mapping[str, Any]) -> str:
    """Where a Hugging Face id is looked up: the shared model cache's hub (jobs_model_cache, the
    HF_HOME the CUDA env file names), else the venv owner's own."""
    home = settings["jobs_model_cache"] or f"~{settings['python_venv_owner']}/.cache/huggingface"
    return f"{home}/hub"


def model_path(model: Mapping[str, Any], hub: str) -> str:
    where = model["model"]
    if where.startswith("/"):
        return where
    return posixpath.join(hub, "models--" + where.replace("/", "--"))


def part(settings: Mapping[str, Any]) -> reading.Part:
    models = settings["serving_models"]
    hub = hub_cache(settings)
    llama = any(engine(m) == "llama.cpp" for m in models)
    return reading.part(
        ServingHost,
        models=tuple((m["name"], model_path(m, hub), m["port"]) for m in models),
        unit_prefix=SERVE_UNIT_PREFIX,
        server=settings["serving_llama_server"] if llama else None,
    )


def state_part(settings: Mapping[str, Any]) -> reading.Part:
    names = [m["name"] for m in settings["serving_models"]]
    return reading.part(
        atomic.HostState,
        paths=(
            HELPER,
            CONFIG,
            PROBE_SERVICE_FILE,
            PROBE_TIMER_FILE,
            JOB_DRAIN,
            TEXTFILE,
            *(unit_file_path(n) for n in names),
            *(key_file(m["name"]) for m in settings["serving_models"] if m.get("key")),
        ),
        units=(PROBE_TIMER, *(unit_name(n) for n in names)),
    )


@reading.planner
def reads(settings):
    return [part(settings), state_part(settings)]


def model_problem(name: str, found: Mapping[str, Any], unit_active: bool, wanted: str = "dir") -> str | None:
    """Why the host cannot serve model ``name``, from the reading, or None. ``wanted``: what the
    model must be, ``dir`` (vLLM's directory) or ``file`` (llama.cpp's GGUF file)."""
    kind = found["models"].get(name)
    what, itself, noun = (
        ("model directory", "the model's directory", "directory")
        if wanted == "dir"
        else ("GGUF file", "the GGUF file", "regular file")
    )
    if kind != wanted:
        said = {
            "missing": "is missing",
            "link": f"is a symbolic link ({itself} itself, not a link to one)",
            "fifo": f"is a FIFO, not a {noun}",
            None: "was not read",
        }.get(kind, f"is a {kind}, not a {noun}")
        return f"model {name}: its {what} {said}"
    if name in found["ports_held"] and not unit_active:
        return f"model {name}: its port is held by another program (ss lists a listener)"
    return None


@deploy("Serving", data_defaults=DEFAULTS)
def serving():
    """
    Serve the models ``serving_models`` lists, each by its own unit running the venv's vLLM (or
    root's llama.cpp server, serving_llama_server, with a GGUF file) as the venv's owner, kept
    alive by the forward-progress probe; nothing where it lists none.

    Settings: ``serving_*``, ``python_venv_path``, ``python_venv_owner``, ``cuda_env_file``;
    see docs/settings.md and docs/serving.md.
    """
    settings = host_settings.current()
    found = reading.value(part(settings))
    state = reading.value(state_part(settings))
    files, units = state["files"], state["units"]
    models = settings.serving_models
    wanted = {unit_name(m["name"]) for m in models}
    for unit in sorted(set(found["unit_files"]) - wanted):
        server.shell(
            name="Stop and remove the units of models no longer served",
            commands=[
                StringCommand("systemctl", "disable", "--now", QuoteString(unit)),
                StringCommand("rm", "-f", QuoteString(f"{UNIT_DIR}/{unit}")),
                StringCommand("systemctl", "daemon-reload"),
            ],
        )
    if not models:
        if found["probe_timer"]:
            server.shell(
                name="Stop the serving probe (serving_models is empty)",
                commands=[StringCommand("systemctl", "disable", "--now", PROBE_TIMER)],
            )
        # A stopped probe's last series would stay in Prometheus as if it still held.
        atomic.file_if_changed(
            name="",
            dest=TEXTFILE,
            content=None,
            current=files.get(TEXTFILE),
            absent=f"The serving probe's metrics removed ({TEXTFILE}: serving_models is empty)",
        )
        return
    problems = [
        model_problem(
            model["name"],
            found,
            units.get(unit_name(model["name"]), {}).get("active") in ("active", "activating"),
            "file" if engine(model) == "llama.cpp" else "dir",
        )
        for model in models
    ]
    if any(engine(m) == "llama.cpp" for m in models):
        problems.append(server_problem(settings.serving_llama_server, found))
    problem = next((p for p in problems if p), None)
    if problem:
        refused(name="Every served model's directory and port are there for it", message=f"serving: {problem}")
        return

    helper = render_helper()
    atomic.file_if_changed(
        name=f"Serving helper: guard, readiness, probe ({HELPER})",
        dest=HELPER,
        current=files.get(HELPER),
        content=helper,
        mode=0o755,
        validate=HELPER_VALIDATOR,
    )
    config = render_config(settings)
    if not atomic.up_to_date(files.get(CONFIG), config):
        server.shell(
            name=f"Serving's directories ({CONFIG_DIR}, {STATE_DIR})",
            commands=[StringCommand("install", "-d", "-m", "755", "-o", "root", "-g", "root", CONFIG_DIR, STATE_DIR)],
        )
        atomic.file_if_changed(
            name=f"Serving helper's configuration ({CONFIG})",
            dest=CONFIG,
            current=files.get(CONFIG),
            content=config,
            validate=CONFIG_VALIDATOR,
        )
    for model in models:
        if not model.get("key"):
            continue
        path = key_file(model["name"])
        now = files.get(path)
        if now is None or (now["mode"], now["user"], now["group"]) != (0o600, "root", "root"):
            # Made on the host, once: the key never passes the controller or a command line.
            q = QuoteString(path)
            server.shell(
                name="Each keyed model has its API key, root's, mode 0600",
                commands=[
                    StringCommand(
                        "umask 077 && { [ -s",
                        q,
                        "] && [ ! -L",
                        q,
                        "] || { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' >",
                        QuoteString(path + ".sparkrig-new"),
                        "&& mv -f",
                        QuoteString(path + ".sparkrig-new"),
                        q,
                        "; }; } && chown root:root",
                        q,
                        "&& chmod 600",
                        q,
                    )
                ],
            )
    probe_files = [
        atomic.unit_file(
            name=f"Serving probe's unit ({PROBE_SERVICE_FILE})",
            dest=PROBE_SERVICE_FILE,
            content=rendering.render(
                "serving/sparkrig-serving-probe.service.j2",
                description=PROBE_DESCRIPTION,
                helper=HELPER,
                timeout_s=PROBE_TIMEOUT_S,
            ),
            validate=PROBE_SERVICE_VALIDATOR,
            reload_name="Reload systemd: the probe's unit changed",
            state=files.get(PROBE_SERVICE_FILE),
        ),
        atomic.unit_file(
            name=f"Serving probe every serving_probe_interval_s ({PROBE_TIMER_FILE})",
            dest=PROBE_TIMER_FILE,
            content=rendering.render(
                "serving/sparkrig-serving-probe.timer.j2",
                description=PROBE_DESCRIPTION,
                interval_s=settings.serving_probe_interval_s,
            ),
            validate=PROBE_TIMER_VALIDATOR,
            reload_name="Reload systemd: the probe's timer changed",
            state=files.get(PROBE_TIMER_FILE),
        ),
    ]
    drained = files.get(JOB_DRAIN) is not None
    for model in models:
        unit = unit_name(model["name"])
        changed = atomic.unit_file(
            name=f"Model endpoint units ({UNIT_DIR}/{SERVE_UNIT_PREFIX}NAME.service)",
            dest=unit_file_path(model["name"]),
            content=render_unit(model, settings),
            validate=UNIT_VALIDATOR,
            reload_name="Reload systemd: a model endpoint's unit changed",
            state=files.get(unit_file_path(model["name"])),
        )
        now = units.get(unit, {})
        if now.get("enabled") != "enabled":
            systemd.service(name="Model endpoints start at boot", service=unit, enabled=True)
        if drained:
            # spark-jobs drain stopped it; undrain starts it.
            continue
        # A deploy's start is the owner's: it clears the start limit earlier failures reached
        # (StartLimitBurst=), then returns once the first completion answered (readiness), or
        # the start failed.
        start = [StringCommand("systemctl", "reset-failed", unit), StringCommand("systemctl", "restart", unit)]
        if now.get("active") != "active":
            server.shell(name="Model endpoints are running and answer", commands=start)
        elif changed:
            server.shell(name="Restart model endpoints whose unit changed", commands=start, _if=changed.did_change)
    service.kept_running(PROBE_TIMER, units, restart_on=probe_files)
