"""
Run a sparkrig ``@deploy`` against pyinfra's ``@fake`` connector and return its plan.

Facts are answered from recorded outputs (``responses``: a substring of the fact's
command mapped to its output lines); nothing runs anywhere. The plan lists, per
operation, the shell commands it would run (a Python callback as ``python: NAME``)
and the files it would upload, so a test can assert exactly what a host would be
asked to do.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra import host as pyinfra_host
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileDownloadCommand, FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host, ctx_state

from sparkrig import host_output, reading


def encode(lines: list[str]) -> list[str]:
    """What a fact of :func:`host_output.encoded` prints for these output lines."""
    text = "".join(f"{line}\n" for line in lines)
    return [base64.b64encode(text.encode("utf-8", "surrogateescape")).decode(), host_output.END]


def user_field(text: str) -> str:
    """A field of a user's as a fact's command sends it (host_output.FIELD)."""
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode()


_lookup_response = FakeConnector._lookup_response


def _lookup_encoded(self, command_str: str):
    """Recorded outputs are what a fact's command prints; a command of host_output.encoded()
    pipes that through base64 and adds its end line, as the real host's shell does. A
    response ``{"as_sent": LINES}`` is what pyinfra receives, unchanged (forged output)."""
    for matcher, response in (self.data.get("fake_responses") or {}).items():
        if isinstance(matcher, str) and matcher in command_str and isinstance(response, dict) and "as_sent" in response:
            return True, CommandOutput([OutputLine("stdout", line) for line in response["as_sent"]])
    success, output = _lookup_response(self, command_str)
    if f"echo {host_output.END}" not in command_str:
        return success, output
    stdout = [line.line for line in output if line.buffer_name == "stdout"]
    stderr = [line for line in output if line.buffer_name != "stdout"]
    return success, CommandOutput([OutputLine("stdout", line) for line in encode(stdout)] + stderr)


FakeConnector._lookup_response = _lookup_encoded


def _read_alone(parts):
    """Unit tests answer each fact from its own recorded output: the part a concern asks
    for is read alone, as one fact (sparkrig.reading's one command, which joins every
    planned part, is tested for real in tests/unit/sparkrig/test_reading.py)."""
    wanted = parts[0]
    value = pyinfra_host.get_fact(wanted.fact, **dict(wanted.kwargs))
    return {wanted: None if host_output.fact_failed() else value}


reading.read = _read_alone


@dataclass
class PlannedOp:
    name: str
    commands: list[str] = field(default_factory=list)
    uploads: dict[str, bytes] = field(default_factory=dict)


def _fake_host(deploy_func, data: dict | None, responses: dict | None):
    host_data = {"fake_delay": 0, "fake_delay_jitter": 0, "fake_responses": responses or {}}
    host_data.update(data or {})
    inventory = Inventory(([("@fake/spark", host_data)], {}))
    state = State(inventory, Config())
    connect_all(state)
    add_deploy(state, deploy_func)
    (host,) = list(inventory)
    return state, host


def _record(planned: PlannedOp, command) -> None:
    if isinstance(command, FileUploadCommand):
        src = command.src
        planned.uploads[command.dest] = src.getvalue() if hasattr(src, "getvalue") else Path(src).read_bytes()
    elif isinstance(command, FileDownloadCommand):
        planned.commands.append(f"download: {command.src} -> {command.dest}")
    elif isinstance(command, StringCommand):
        planned.commands.append(command.get_raw_value())
    elif isinstance(command, FunctionCommand):
        planned.commands.append(f"python: {command.function.__name__}")
    else:  # pragma: no cover - sparkrig yields nothing else
        raise AssertionError(f"unexpected command {command!r}")


def plan(deploy_func, data: dict | None = None, responses: dict | None = None) -> list[PlannedOp]:
    """Every operation's commands as pyinfra plans them (``_if`` conditions not evaluated)."""
    state, host = _fake_host(deploy_func, data, responses)
    ops = []
    for op_hash in state.get_op_order():
        planned = PlannedOp(name=" ".join(sorted(state.op_meta[op_hash].names)))
        with ctx_state.use(state), ctx_host.use(host):
            for command in state.get_op_data_for_host(host, op_hash).command_generator():
                _record(planned, command)
        ops.append(planned)
    return ops


def execute(deploy_func, data: dict | None = None, responses: dict | None = None) -> list[PlannedOp]:
    """Like :func:`plan`, but as pyinfra executes: operations in order, each one completed
    (every command succeeding) before the next is generated, so ``_if=op.did_change``
    conditions are evaluated. Facts keep answering from ``responses``.
    """
    state, host = _fake_host(deploy_func, data, responses)
    state.is_executing = True
    ops = []
    for op_hash in state.get_op_order():
        op_data = state.get_op_data_for_host(host, op_hash)
        planned = PlannedOp(name=" ".join(sorted(state.op_meta[op_hash].names)))
        commands = []
        with ctx_state.use(state), ctx_host.use(host):
            for command in op_data.command_generator():
                commands.append(command)
                _record(planned, command)
        op_data.operation_meta.set_complete(True, commands, CommandOutput([]))
        ops.append(planned)
    return ops


def digest(text: str, mode: int = 0o644) -> list[str]:
    """FileDigest's output for a file holding ``text``."""
    return [f"{mode:o} root root", f"{hashlib.sha256(text.encode()).hexdigest()}  /path"]


# atomic.HostState's command holds this; its response is built by host_state().
HOST_STATE = "echo nofile"


def host_state(files: dict | None = None, units: dict | None = None, packages: dict | None = None) -> list[str]:
    """HostState's output: ``files`` maps a path to its text, or ``(text, mode)``, or None
    (no file); ``units`` a unit to ``(active, enabled)`` booleans; ``packages`` a package
    to its installed version, or None (not installed)."""
    lines = []
    for path, spec in (files or {}).items():
        if spec is None:
            lines.append(f"nofile {path}")
            continue
        text, mode = spec if isinstance(spec, tuple) else (spec, 0o644)
        lines.append(f"file {mode:o} root root {hashlib.sha256(text.encode()).hexdigest()} {path}")
    for unit, (active, enabled) in (units or {}).items():
        lines.append(f"unit {'active' if active else 'inactive'} {'enabled' if enabled else 'disabled'} {unit}")
    for name, version in (packages or {}).items():
        lines.append(f"package ii  {version} {name}" if version else f"package un  {name}")
    return lines
