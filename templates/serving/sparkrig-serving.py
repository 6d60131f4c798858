#!/usr/bin/python3 -I
# Managed by sparkrig (sparkrig.operations.serving); change group_data, not this file.
"""sparkrig-serving: what keeps the model endpoints alive (docs/serving.md).

  sparkrig-serving probe        (the timer, root) each active model: restart it when requests
                                run while its generated-token counter stays still for
                                stall_s, or when /health failed health_failures times in a row
  sparkrig-serving guard NAME   (ExecStartPre, root) drop caches, then spark-preflight with the
                                model's memory requirement and the large free blocks minimum
                                (compacting first where asked): a refused start says why
  sparkrig-serving ready NAME   (ExecStartPost, root) wait until one completion of one token
                                has come back: the unit counts as started then
  sparkrig-serving complete NAME  one completion of one token, once (the controls, a rollout)
  sparkrig-serving exec VAR -- PROGRAM ARG...  (ExecStart, the engine's user) run the engine
                                with the API key systemd handed the unit in VAR, never on a
                                command line

Runs with Python's -I from root's path, the standard library alone; it talks to the engine
over HTTP with a timeout on every request and a bound on every answer, and never runs a
user's program (systemctl, spark-preflight and spark-drop-caches are root's).
"""

import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

CONFIG = os.environ.get("SPARKRIG_SERVING_CONFIG", "/etc/sparkrig/serving/models.json")
# How long one HTTP request may take, and the most of an answer read.
HTTP_TIMEOUT_S = 5
ANSWER_LIMIT = 4 << 20
PROGRAM_TIMEOUT_S = 20
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^{}\n]*\})?[ \t]+([-+0-9.eEInfNa]+)([ \t]+-?[0-9]+)?")


def log(message):
    # One line, printable: an engine's bytes cannot forge journal lines.
    print("".join(c if c.isprintable() else "?" for c in message), flush=True)


def load_config():
    with open(CONFIG, encoding="utf-8") as stream:
        return json.load(stream)


def model_of(config, name):
    for model in config["models"]:
        if model["name"] == name:
            return model
    raise SystemExit(f"sparkrig-serving: no model {name!r} in {CONFIG}")


def api_key(model):
    if not model.get("key_file"):
        return None
    with open(model["key_file"], encoding="ascii") as stream:
        return stream.read(4096).strip()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # The engine is its user's code: a redirect would take root's request, and the key, past
    # the engine's own IP filter.
    def redirect_request(self, *args, **kwargs):
        return None


# No proxy from the environment, no redirect followed.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def http(model, path, body=None, timeout=HTTP_TIMEOUT_S):
    """(status, answer bytes) of one request to the model's endpoint; (None, why) when none came."""
    url = f"http://{model['connect']}:{model['port']}{path}"
    headers = {"Content-Type": "application/json"}
    key = api_key(model)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    deadline = time.monotonic() + timeout
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            chunks, size = [], 0
            # The socket timeout bounds each read; the deadline bounds a trickle of them.
            while size <= ANSWER_LIMIT and time.monotonic() < deadline:
                chunk = answer.read(65536)
                if not chunk:
                    return answer.status, b"".join(chunks)
                chunks.append(chunk)
                size += len(chunk)
            return None, b"answer too large or too slow"
    except urllib.error.HTTPError as error:
        return error.code, b""
    except (OSError, ValueError) as error:
        return None, str(error).encode()


def parse_metrics(text, names):
    """The sum of each metric of ``names`` over its label sets, None where absent; None for
    the whole when the text is not Prometheus' exposition format."""
    found = dict.fromkeys(names)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line.strip())
        if not match:
            return None
        name, value = match[1], match[3]
        if name in found:
            try:
                number = float(value)
            except ValueError:
                return None
            if not math.isfinite(number):
                return None
            found[name] = (found[name] or 0.0) + number
    return found


def sample(model, names):
    """What one probe run sees of a model: /health answered 200, and (running, tokens,
    waiting) from its metrics, None when they could not be read."""
    status, _ = http(model, "/health")
    metrics = None
    # An engine that did not answer at all is not asked again: a probe run stays short.
    code, text = http(model, "/metrics") if status is not None else (None, b"")
    if code == 200:
        try:
            parsed = parse_metrics(text.decode("utf-8"), names)
        except UnicodeDecodeError:
            parsed = None
        if parsed and parsed[names[0]] is not None and parsed[names[1]] is not None:
            metrics = (parsed[names[0]], parsed[names[1]], parsed[names[2]] or 0.0)
    return {"health": status == 200, "metrics": metrics}


def decide(previous, seen, now, stall_s, health_failures):
    """(the model's new state, the reason to restart it or None), from its previous state
    (None: first seen active), one sample and the time. Metrics that could not be read leave
    the counter where it was: an engine frozen whole answers nothing, and is stalled all the same."""
    state = dict(previous or {"tokens": None, "since": now, "running": 0.0, "health_failed": 0})
    state["health_failed"] = 0 if seen["health"] else state["health_failed"] + 1
    if seen["metrics"] is not None:
        running, tokens, _waiting = seen["metrics"]
        if tokens != state["tokens"]:
            state["since"] = now
        state["tokens"], state["running"] = tokens, running
    if state["running"] <= 0:
        state["since"] = now
    if state["health_failed"] >= health_failures:
        return state, f"/health failed {state['health_failed']} times in a row"
    still = now - state["since"]
    if state["running"] > 0 and still >= stall_s:
        return state, (
            f"stalled: {state['running']:g} request(s) running while the generated-token counter "
            f"stayed at {state['tokens']} for {still:.0f} s (serving_stall_s {stall_s})"
        )
    return state, None


def run(argv, timeout=PROGRAM_TIMEOUT_S):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as error:
        return 1, str(error)
    return done.returncode, (done.stdout + done.stderr).strip()


def unit_show(unit):
    code, text = run(["systemctl", "show", "--property=ActiveState,NRestarts", unit])
    shown = dict(line.split("=", 1) for line in text.splitlines() if "=" in line) if code == 0 else {}
    return shown.get("ActiveState", "unknown"), int(shown.get("NRestarts", "0") or 0)


def read_state(path):
    try:
        with open(path, encoding="utf-8") as stream:
            state = json.load(stream)
        return state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        return {}


def label(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_in_roots_directory(directory, name, text):
    """Write ``name`` in ``directory`` atomically, only where that directory (not a link) is
    root's and nobody else may write it (the metrics concern's /var/lib/sparkrig/metrics is;
    a directory another user could swap, or a link, is never written through)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:
        log(f"sparkrig-serving: {directory} not written: {error}")
        return False
    try:
        found = os.fstat(fd)
        if found.st_uid != 0 or found.st_mode & 0o022:
            log(f"sparkrig-serving: {directory} not written: not root's alone")
            return False
        temp = f".{name}.sparkrig-new"
        try:
            os.unlink(temp, dir_fd=fd)
        except FileNotFoundError:
            pass
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        with os.fdopen(out, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        return True
    finally:
        os.close(fd)


def write_metrics(config, state, shown):
    directory = config.get("textfile_dir")
    if not directory or not os.path.lexists(directory):
        return  # no node exporter here (metrics_enabled off, or the concern not deployed)
    lines = []
    for metric, kind, what in (
        ("sparkrig_serving_up", "gauge", "1: the model's unit is active and its /health answered 200"),
        ("sparkrig_serving_requests_running", "gauge", "requests the engine is running (its own metric)"),
        ("sparkrig_serving_progress_age_seconds", "gauge", "seconds tokens stayed still while requests ran"),
        ("sparkrig_serving_health_failures", "gauge", "probe runs in a row whose /health failed"),
        ("sparkrig_serving_unit_restarts_total", "counter", "systemd's restarts of the unit (NRestarts)"),
        ("sparkrig_serving_probe_restarts_total", "counter", "restarts by the probe, by reason"),
        ("sparkrig_serving_start_refused", "gauge", "1: the last start was refused for memory"),
    ):
        lines += [f"# HELP {metric} {what}", f"# TYPE {metric} {kind}"]
        for model in config["models"]:
            name = label(model["name"])
            mine = state.get(model["name"]) or {}
            active, restarts = shown.get(model["name"], ("unknown", 0))
            if metric == "sparkrig_serving_up":
                lines.append(
                    f'{metric}{{model="{name}"}} {int(active == "active" and mine.get("health_failed", 1) == 0)}'
                )
            elif metric == "sparkrig_serving_requests_running":
                lines.append(f'{metric}{{model="{name}"}} {mine.get("running", 0):g}')
            elif metric == "sparkrig_serving_progress_age_seconds":
                age = state["now"] - mine["since"] if mine.get("since") and mine.get("running", 0) > 0 else 0
                lines.append(f'{metric}{{model="{name}"}} {age:.0f}')
            elif metric == "sparkrig_serving_health_failures":
                lines.append(f'{metric}{{model="{name}"}} {mine.get("health_failed", 0)}')
            elif metric == "sparkrig_serving_unit_restarts_total":
                lines.append(f'{metric}{{model="{name}"}} {restarts}')
            elif metric == "sparkrig_serving_probe_restarts_total":
                for reason in ("stall", "health"):
                    count = state.get("restarts", {}).get(f"{model['name']}/{reason}", 0)
                    lines.append(f'{metric}{{model="{name}",reason="{reason}"}} {count}')
            else:
                refused = os.path.exists(refusal_file(config, model["name"]))
                lines.append(f'{metric}{{model="{name}"}} {int(refused)}')
    write_in_roots_directory(directory, "sparkrig_serving.prom", "\n".join(lines) + "\n")


def refusal_file(config, name):
    return os.path.join(config["state_dir"], f"{name}.refused")


def probe(config):
    state_file = os.path.join(config["state_dir"], "probe.json")
    state = read_state(state_file)
    now = time.time()
    state["now"] = now
    shown = {}
    for model in config["models"]:
        unit = model["unit"]
        active, restarts = unit_show(unit)
        shown[model["name"]] = (active, restarts)
        if active != "active":
            # Starting (its readiness still waits), stopped or drained: nothing to judge.
            state.pop(model["name"], None)
            continue
        seen = sample(model, model["metrics"])
        mine, reason = decide(state.get(model["name"]), seen, now, config["stall_s"], config["health_failures"])
        state[model["name"]] = mine
        if reason:
            kind = "health" if reason.startswith("/health") else "stall"
            key = f"{model['name']}/{kind}"
            state.setdefault("restarts", {})[key] = state.get("restarts", {}).get(key, 0) + 1
            if kind == "stall":
                # A stalled engine finishes nothing: a graceful stop would wait out the drain
                # grace (llama.cpp's server, frozen with a request running, never ends on SIGTERM).
                run(["systemctl", "kill", "--signal=SIGKILL", unit])
            code, said = run(["systemctl", "restart", "--no-block", unit])
            log(
                f"{unit}: restarted by sparkrig-serving probe: {reason}"
                + ("" if code == 0 else f" (systemctl: {said})")
            )
            state.pop(model["name"], None)
    write_in_roots_directory(config["state_dir"], "probe.json", json.dumps(state))
    write_metrics(config, state, shown)
    return 0


def guard(config, name):
    model = model_of(config, name)
    refused = refusal_file(config, name)
    if config.get("drop_caches"):
        code, said = run([config["drop_caches_program"]], timeout=120)
        if code != 0:
            log(f"{model['unit']}: spark-drop-caches failed (going on): {said[-300:]}")
        # Free memory in large blocks: the kernel's compaction, on request (root's /proc file).
        try:
            with open(config["compact_file"], "w", encoding="ascii") as stream:
                stream.write("1")
        except OSError as error:
            log(f"{model['unit']}: memory not compacted (going on): {error}")
    kib = str(model["min_available_kib"])
    # The model's memory, and memory in large blocks where the owner asks (jobs_preflight_*).
    blocks = str(config.get("min_large_blocks", 0))
    argv = [config["preflight"], "--min-available-kib", kib, "--min-large-blocks", blocks]
    code, said = run([*argv, "--compact"] if config.get("compact") else argv, timeout=120)
    # Strays (32) are other models' engines on this box, not a reason to refuse this one.
    failed = code & ~32 if code >= 0 else 1
    if failed:
        reasons = "; ".join(line for line in said.splitlines() if line.startswith("FAIL") and "strays" not in line)
        log(f"{model['unit']}: start refused by spark-preflight (exit {code}): {reasons or said[-300:]}")
        write_in_roots_directory(config["state_dir"], os.path.basename(refused), f"{int(time.time())} {reasons}\n")
        return 1
    if os.path.exists(refused):
        os.unlink(refused)
    return 0


def complete(model, timeout):
    code, text = http(
        model,
        "/v1/completions",
        {"model": model["served_name"], "prompt": "1", "max_tokens": 1, "temperature": 0},
        timeout=timeout,
    )
    if code != 200:
        return f"HTTP {code}" if code else text.decode("utf-8", "replace")[:200]
    try:
        choices = json.loads(text)["choices"]
        if isinstance(choices, list) and choices and isinstance(choices[0].get("text"), str):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return "the answer holds no completion"


def ready(config, name):
    model = model_of(config, name)
    main_pid = os.environ.get("MAINPID", "")
    # systemd's TimeoutStartSec= ends this wait; a dead engine ends it at once.
    while True:
        if main_pid and not os.path.exists(f"/proc/{main_pid}"):
            log(f"{model['unit']}: the engine exited before its first completion")
            return 1
        why = complete(model, timeout=60)
        if why is None:
            log(f"{model['unit']}: ready: one completion of one token answered")
            return 0
        time.sleep(2)


def exec_with_key(argv):
    variable, program = argv[0], argv[2:]
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", variable) or argv[1] != "--" or not program:
        print(__doc__, file=sys.stderr)
        return 2
    path = os.path.join(os.environ.get("CREDENTIALS_DIRECTORY", "/nonexistent"), "key")
    with open(path, encoding="ascii") as stream:
        os.environ[variable] = stream.read(4096).strip()
    os.execv(program[0], program)
    return 1


def main(argv):
    if argv[1:2] == ["exec"]:
        return exec_with_key(argv[2:])
    config = load_config()
    if argv[1:2] == ["probe"] and len(argv) == 2:
        return probe(config)
    if len(argv) == 3 and argv[1] in ("guard", "ready", "complete"):
        if argv[1] == "guard":
            return guard(config, argv[2])
        if argv[1] == "ready":
            return ready(config, argv[2])
        why = complete(model_of(config, argv[2]), timeout=60)
        log(f"{argv[2]}: " + ("one completion of one token answered" if why is None else f"no completion: {why}"))
        return 0 if why is None else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
