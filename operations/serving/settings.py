"""Serving (model endpoints kept alive): the settings, declared once, and their checks."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from sparkrig import stack_locks
from sparkrig.operations.cuda_env import settings as cuda_env_settings
from sparkrig.operations.jobs import settings as jobs_settings
from sparkrig.operations.metrics import settings as metrics_settings
from sparkrig.operations.metrics.settings import allow_check
from sparkrig.settings import Setting, boolean, declare, defaults, int_range

# A model's name: its unit's (spark-serve-NAME.service) and the name clients ask for.
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,47}")
# A Hugging Face id, resolved from the local cache alone (HF_HUB_OFFLINE=1).
HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
# One engine argument: one word, nothing a shell or systemd's command line would read.
ENGINE_ARG = re.compile(r"[A-Za-z0-9_./:=,+@-]{1,200}")
# What the unit sets itself (vLLM's and llama.cpp's words): an engine argument naming one of
# them is refused.
OWNED_ARGS = (
    "--host",
    "--port",
    "--api-key",
    "--served-model-name",
    "--gpu-memory-utilization",
    "--model",
    "--api-key-file",
    "-m",
    "--alias",
    "-a",
    "--metrics",
)
# The engines a model is served by: vLLM from the fleet's venv, or llama.cpp's llama-server
# (serving_llama_server) with a local GGUF file.
ENGINES = ("vllm", "llama.cpp")
KEYS = {
    "name",
    "engine",
    "model",
    "port",
    "memory_share",
    "min_available_gib",
    "listen",
    "allow",
    "key",
    "engine_args",
}
# An absolute path of root's program (serving_llama_server): normalised, no quote or space.
PROGRAM_PATH = re.compile(r"/[A-Za-z0-9_./@+-]{1,1000}")
REQUIRED = {"name", "model", "port"}

MODELS_ALLOWED = (
    "a list of models, each a mapping with name (lowercase letters, digits, '_.-', 48 at most: "
    "no slash, no space), model (an absolute path of a local directory, or a Hugging Face id "
    "ORG/NAME from the local cache; with engine llama.cpp the absolute path of a local .gguf "
    "file), port (1024 to 65535, one per model), and optionally engine (vllm, the default, or "
    "llama.cpp), memory_share (0.05 to 0.95, vLLM's alone), min_available_gib (1 to 4096), listen (an IP address, "
    "loopback by default), allow (the clients' addresses or networks, needed for any other "
    "listen), key (True: an API key, needed for any other listen) and engine_args (a list of "
    "single words of letters, digits and '_./:=,+@-', none of " + ", ".join(OWNED_ARGS) + ")"
)


def engine_arg_problem(arg: Any) -> str | None:
    if not isinstance(arg, str) or not ENGINE_ARG.fullmatch(arg):
        return (
            f"engine_args {arg!r} is not one word of letters, digits and '_./:=,+@-' "
            "(no space, newline or shell character)"
        )
    if arg.split("=", 1)[0] in OWNED_ARGS:
        return f"engine_args {arg!r}: the unit sets {arg.split('=', 1)[0]} itself"
    return None


def model_problem(model: Any) -> str | None:
    """What is wrong with one entry of serving_models, or None."""
    if not isinstance(model, Mapping):
        return f"{model!r} is not a mapping"
    name = model.get("name")
    where = f"model {name!r}" if isinstance(name, str) else "a model"
    unknown = sorted(str(k) for k in model if k not in KEYS)
    if unknown:
        return f"{where}: unknown key {unknown[0]!r}"
    missing = sorted(REQUIRED - set(model))
    if missing:
        return f"{where}: no {missing[0]}"
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return f"name {name!r} is not lowercase letters, digits and '_.-' (no slash, no space)"
    engine = model.get("engine", "vllm")
    if engine not in ENGINES:
        return f"{where}: engine {engine!r} is not one of {', '.join(ENGINES)}"
    path = model["model"]
    local = isinstance(path, str) and path.startswith("/")
    if local and (posixpath.normpath(path) != path or not re.fullmatch(r"[A-Za-z0-9_./@+-]{2,1000}", path)):
        return f"{where}: model {path!r} is not a normalised absolute path of letters, digits and '_./@+-'"
    if engine == "llama.cpp" and not (local and path.endswith(".gguf")):
        return f"{where}: model {path!r}: llama.cpp serves a local GGUF file, an absolute path ending in .gguf"
    if not local and not (isinstance(path, str) and HF_ID.fullmatch(path)):
        return f"{where}: model {path!r} is neither an absolute path nor a Hugging Face id ORG/NAME"
    if engine == "llama.cpp" and "memory_share" in model:
        # vLLM's --gpu-memory-utilization: llama.cpp takes the memory its model and context need.
        return f"{where}: memory_share is vLLM's (--gpu-memory-utilization); llama.cpp has none"
    port = model["port"]
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        return f"{where}: port {port!r} is not an integer from 1024 to 65535"
    share = model.get("memory_share", 0.9)
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0.05 <= share <= 0.95:
        return f"{where}: memory_share {share!r} is not a number from 0.05 to 0.95"
    gib = model.get("min_available_gib", 1)
    if not isinstance(gib, int) or isinstance(gib, bool) or not 1 <= gib <= 4096:
        return f"{where}: min_available_gib {gib!r} is not an integer from 1 to 4096"
    listen = model.get("listen", "127.0.0.1")
    try:
        address = ipaddress.ip_address(listen) if isinstance(listen, str) else None
    except ValueError:
        address = None
    if address is None:
        return f"{where}: listen {listen!r} is not an IP address"
    if allow_check(model.get("allow", []), {}):
        return f"{where}: allow {model.get('allow')!r} is not a list of IP addresses or CIDR networks"
    if not isinstance(model.get("key", False), bool):
        return f"{where}: key {model.get('key')!r} is not True or False"
    if not address.is_loopback and not model.get("key"):
        return f"{where}: listen {listen!r} exposes the endpoint without an API key (set key: True)"
    if not address.is_loopback and not model.get("allow"):
        return f"{where}: listen {listen!r} needs allow, the clients' addresses (systemd's IP filter)"
    args = model.get("engine_args", [])
    if not isinstance(args, (list, tuple)):
        return f"{where}: engine_args is not a list of words"
    for arg in args:
        problem = engine_arg_problem(arg)
        if problem:
            return f"{where}: {problem}"
    return None


def program_path_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    if isinstance(value, str) and PROGRAM_PATH.fullmatch(value) and posixpath.normpath(value) == value:
        return None
    return "a normalised absolute path of letters, digits and '_./@+-'"


def models_check(value: Any, data: Mapping[str, Any]) -> str | None:
    if not isinstance(value, (list, tuple)):
        return MODELS_ALLOWED
    ports: dict[int, str] = {}
    names: set[str] = set()
    for model in value:
        problem = model_problem(model)
        if problem:
            return f"{MODELS_ALLOWED}; here {problem}"
        if model["name"] in names:
            return f"{MODELS_ALLOWED}; here two models are named {model['name']!r}"
        if model["port"] in ports:
            return (
                f"{MODELS_ALLOWED}; here {ports[model['port']]!r} and {model['name']!r} both use port {model['port']}"
            )
        names.add(model["name"])
        ports[model["port"]] = model["name"]
    if value and data.get("python_venv_owner", "root") == "root":
        return (
            f"{MODELS_ALLOWED}; and python_venv_owner not root: the engine runs as the venv's owner, "
            "never as root (set python_venv_owner to the Spark's user)"
        )
    return None


SETTINGS = (
    Setting(
        "serving_models",
        [],
        "The models this host serves, each by its own unit spark-serve-NAME.service running the "
        "venv's `vllm serve` (or llama.cpp's llama-server, engine llama.cpp) as python_venv_owner "
        "(docs/serving.md). Each is a mapping: name, engine (vllm by default, or llama.cpp), model "
        "(a local directory, or a Hugging Face id found in the local cache: the unit runs with "
        "HF_HUB_OFFLINE=1; for llama.cpp a local .gguf file), port, memory_share (vLLM's "
        "--gpu-memory-utilization, 0.9 by default; refused for llama.cpp), "
        "min_available_gib (MemAvailable the start needs, else it is refused; 1 by default), "
        "listen (127.0.0.1 by default), allow (the clients besides the host itself, systemd's IP "
        "filter), key (True: an API key the host makes, /etc/sparkrig/serving/NAME.key, root's "
        "0600, handed to the unit alone), engine_args (more arguments, one word each). [] serves "
        "nothing.",
        models_check,
    ),
    Setting(
        "serving_llama_server",
        "/usr/local/bin/llama-server",
        "llama.cpp's server program, run by the models whose engine is llama.cpp: an absolute "
        "path of a file root owns and only root may write (it and its directory: the host fails, "
        "saying which, otherwise). sparkrig does not install it.",
        program_path_check,
    ),
    Setting(
        "serving_start_timeout_s",
        2400,
        "How long a start may take until its first completion answers (TimeoutStartSec=): cold "
        "starts of large models take 30 to 60 minutes.",
        int_range(60, 6 * 3600, "seconds"),
    ),
    Setting(
        "serving_stall_s",
        120,
        "Requests running while the engine's generated-token counter stays still this long: the "
        "probe calls the engine stalled and restarts its unit.",
        int_range(10, 3600, "seconds"),
    ),
    Setting(
        "serving_probe_interval_s",
        15,
        "Seconds between two runs of the forward-progress probe (sparkrig-serving-probe.timer).",
        int_range(5, 600, "seconds"),
    ),
    Setting(
        "serving_health_failures",
        3,
        "Probe runs in a row whose /health did not answer 200 before the probe restarts the unit.",
        int_range(1, 100, "runs"),
    ),
    Setting(
        "serving_drop_caches",
        True,
        "Before each start, drop the page cache and compact memory (spark-drop-caches) so the "
        "model's memory is there and in large blocks; False starts on the memory as it is.",
        boolean,
    ),
    Setting(
        "serving_drain_grace_s",
        120,
        "How long a stop (spark-jobs drain, a deploy's restart) lets requests in flight finish "
        "(TimeoutStopSec=): the engine takes no new one, then it is killed.",
        int_range(5, 3600, "seconds"),
    ),
)

declare(__name__, SETTINGS)

# The deploy's data_defaults: its own settings, the venv (path and owner) whose vLLM it runs,
# the CUDA env file the units read, the shared model cache a Hugging Face id is found in, the
# memory guard's fragmentation minimum and compaction (spark-preflight's), and
# whether node exporter's textfile directory is there for the probe's metrics.
DEFAULTS = defaults(
    (
        *SETTINGS,
        *(s for s in stack_locks.SETTINGS if s.key in ("python_venv_path", "python_venv_owner")),
        *(s for s in cuda_env_settings.SETTINGS if s.key == "cuda_env_file"),
        *(
            s
            for s in jobs_settings.SETTINGS
            if s.key in ("jobs_model_cache", "jobs_preflight_min_large_blocks", "jobs_preflight_compact")
        ),
        *(s for s in metrics_settings.SETTINGS if s.key == "metrics_enabled"),
    )
)
