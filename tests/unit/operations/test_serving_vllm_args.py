"""
The serving unit's engine command line against the real vLLM's own argument parser (opt-in:
``uv run pytest -m real_stack``; GBs of wheels). The venv is the fleet's own x86_64 lock
(group_data/python_stack.locks/x86_64-py3.12.txt, installed as hosts install it:
``uv pip sync --require-hashes``) into a cache directory on the controller, or the one
``SPARKRIG_VLLM_VENV`` names. data/serving/vllm_serve_args.py parses the words after
``serve`` as ``vllm serve`` does before it loads a model; there is no GPU here, so vLLM's CPU
platform gives the parser its device defaults (the arguments are the same).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkrig.operations.serving import deploy as serving
from sparkrig.operations.serving import settings as serving_settings
from tests.support import REPO

pytestmark = pytest.mark.real_stack

PARSE = Path(__file__).parent / "data" / "serving" / "vllm_serve_args.py"
LOCK = REPO / "group_data" / "python_stack.locks" / "x86_64-py3.12.txt"
MODEL = {
    "name": "tiny",
    "model": "/srv/models/tiny",
    "port": 8000,
    "memory_share": 0.5,
    "key": True,
    "engine_args": ["--max-model-len", "4096", "--enable-prefix-caching", "--kv-cache-dtype=fp8"],
}


@pytest.fixture(scope="module")
def vllm_python() -> str:
    venv = Path(os.environ.get("SPARKRIG_VLLM_VENV") or Path.home() / ".cache" / "sparkrig" / "vllm-args-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        uv = shutil.which("uv")
        found = subprocess.run([uv, "python", "find", "3.12"], capture_output=True, text=True)
        if found.returncode != 0:
            pytest.skip("no Python 3.12 on this controller for the fleet's x86_64 lock (uv python find 3.12)")
        subprocess.run([uv, "venv", "-q", "-p", found.stdout.strip(), str(venv)], check=True)
        subprocess.run(
            [uv, "pip", "sync", "-q", "--require-hashes", "--python", str(python), str(LOCK)], check=True, timeout=3600
        )
    return str(python)


def _parse(python: str, words: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-I", str(PARSE), *words], capture_output=True, text=True, cwd="/", timeout=900)


def test_the_units_engine_command_line_means_to_vllm_what_the_settings_say(vllm_python):
    assert serving_settings.model_problem(MODEL) is None
    argv = serving.engine_argv("/opt/sparkrig/venv", MODEL)
    assert argv[:2] == ["/opt/sparkrig/venv/bin/vllm", "serve"]
    parsed = _parse(vllm_python, argv[2:])
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    args = json.loads(parsed.stdout.splitlines()[-1])
    assert args["model_tag"] == "/srv/models/tiny"
    assert args["served_model_name"] == ["tiny"]
    assert (args["host"], args["port"]) == ("127.0.0.1", 8000)
    assert args["gpu_memory_utilization"] == 0.5
    assert args["max_model_len"] == 4096
    assert args["enable_prefix_caching"] is True
    assert args["kv_cache_dtype"] == "fp8"
    assert args["api_key"] is None  # the key reaches vLLM in VLLM_API_KEY, never on its command line


def test_the_parser_is_vllms_own_and_refuses_a_word_it_does_not_know(vllm_python):
    argv = serving.engine_argv("/opt/sparkrig/venv", {**MODEL, "engine_args": ["--max-model-length", "4096"]})
    parsed = _parse(vllm_python, argv[2:])
    assert parsed.returncode == 2, parsed.stdout[-2000:]
    assert "--max-model-length" in parsed.stderr, parsed.stderr[-2000:]
