"""Serving: what differs by engine (vLLM, llama.cpp's llama-server): its command line, the
variable its API key is read from, the metrics the probe reads, and when llama-server may run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Each engine's own metrics the probe reads: requests running, a counter that moves while it
# produces tokens, requests waiting.
VLLM_METRICS = ("vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:num_requests_waiting")
# llama.cpp's server (tools/server/server-task.cpp): its llamacpp:tokens_predicted_total counts a
# request's tokens only once the request ends (metrics_on_prediction, at the slot's reset), so a
# long generation would look stalled; n_decode_total counts every llama_decode() call as it runs.
LLAMA_METRICS = ("llamacpp:requests_processing", "llamacpp:n_decode_total", "llamacpp:requests_deferred")
ENGINE_METRICS = {"vllm": VLLM_METRICS, "llama.cpp": LLAMA_METRICS}
# Where each engine reads its API key when no --api-key is given: vLLM's VLLM_API_KEY,
# llama.cpp's LLAMA_API_KEY (common/arg.cpp: --api-key's environment variable).
KEY_VARIABLES = {"vllm": "VLLM_API_KEY", "llama.cpp": "LLAMA_API_KEY"}


def engine(model: Mapping[str, Any]) -> str:
    return model.get("engine", "vllm")


def engine_argv(venv: str, model: Mapping[str, Any], llama_server: str | None = None) -> list[str]:
    """The engine's command line: the venv's `vllm serve`, or llama.cpp's llama-server with the
    model's GGUF file, with what the settings say. Every word is validated
    (sparkrig.operations.serving.settings): no space, quote, '$' or '%'."""
    listen, port = model.get("listen", "127.0.0.1"), str(model["port"])
    if engine(model) == "llama.cpp":
        if not llama_server:
            raise ValueError("llama.cpp's engine needs serving_llama_server")
        return [
            llama_server,
            "--model",
            model["model"],
            "--alias",
            model["name"],
            "--host",
            listen,
            "--port",
            port,
            "--metrics",
            *model.get("engine_args", []),
        ]
    return [
        f"{venv}/bin/vllm",
        "serve",
        model["model"],
        "--served-model-name",
        model["name"],
        "--host",
        listen,
        "--port",
        port,
        "--gpu-memory-utilization",
        f"{model.get('memory_share', 0.9):g}",
        *model.get("engine_args", []),
    ]


def server_problem(path: str, found: Mapping[str, Any]) -> str | None:
    """Why llama.cpp's server at ``path`` is not run (not a file root owns and root alone may
    write, in a directory root alone may write), or None. The unit's user runs it: a program
    another user could change would run that user's code as the venv's owner, and under root's
    guard and readiness."""
    for key, what, kind in (("server", path, "file"), ("server_dir", path.rsplit("/", 1)[0] or "/", "dir")):
        now = found.get(key) or {"kind": "missing", "uid": None, "mode": None}
        if now["kind"] != kind:
            said = "a symbolic link" if now["kind"] == "link" else now["kind"]
            return f"serving_llama_server {path}: {what} is {said}, not a {'file' if kind == 'file' else 'directory'}"
        if now["uid"] != 0:
            return f"serving_llama_server {path}: {what} is owned by uid {now['uid']}, not root"
        if now["mode"] & 0o022:
            return f"serving_llama_server {path}: {what} is writable by group or others (mode {now['mode']:o})"
    return None
