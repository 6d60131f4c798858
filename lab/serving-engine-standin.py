#!/usr/bin/python3 -I
"""A STAND-IN for vLLM's `vllm serve`, for the lab, which has no GPU and no real CPU engine
(Debian 13 ships no llama.cpp server; PyPI has no manylinux wheel of one): the lab's engine.
It takes vLLM's arguments and answers as vLLM's OpenAI-compatible server does: /health,
/metrics (vllm:num_requests_running, vllm:generation_tokens_total, vllm:num_requests_waiting),
/v1/completions making one "token" every 0.1 s, the API key from VLLM_API_KEY. It computes
nothing: it proves the unit around the engine, not an engine.
"""

import argparse
import http.server
import json
import os
import threading
import time

parser = argparse.ArgumentParser(prog="vllm")
parser.add_argument("command", choices=["serve"])
parser.add_argument("model")
parser.add_argument("--served-model-name", required=True)
parser.add_argument("--host", required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--gpu-memory-utilization", type=float, required=True)
args, _ = parser.parse_known_args()
if not os.path.isdir(args.model):
    raise SystemExit(f"stand-in vllm: no model directory {args.model}")
KEY = os.environ.get("VLLM_API_KEY")
lock = threading.Lock()
counts = {"running": 0, "tokens": 0}


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def _send(self, code, body=b"", kind="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200)
        elif self.path == "/metrics":
            with lock:
                text = (
                    f'vllm:num_requests_running{{engine="0",model_name="{args.model}"}} {counts["running"]}.0\n'
                    f'vllm:num_requests_waiting{{engine="0",model_name="{args.model}"}} 0.0\n'
                    f'vllm:generation_tokens_total{{engine="0",model_name="{args.model}"}} {counts["tokens"]}.0\n'
                )
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._send(404)

    def do_POST(self):
        if KEY and self.headers.get("Authorization") != f"Bearer {KEY}":
            self._send(401, b'{"error": "Unauthorized"}')
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/v1/completions" or body.get("model") != args.served_model_name:
            self._send(404)
            return
        with lock:
            counts["running"] += 1
        try:
            for _ in range(int(body.get("max_tokens", 16))):
                time.sleep(0.1)
                with lock:
                    counts["tokens"] += 1
        finally:
            with lock:
                counts["running"] -= 1
        self._send(200, json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": "x"}]}).encode())


time.sleep(2)  # a start that takes a moment: readiness is not the port opening
server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
server.daemon_threads = True
server.serve_forever()
