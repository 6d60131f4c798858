"""
Run a sparkrig ``@deploy`` against pyinfra's ``@fake`` connector and return its plan.

Facts are answered from recorded outputs (``responses``: a substring of the fact's
command mapped to its output lines); nothing runs anywhere. The plan lists, per
operation, the shell commands it would run (a Python callback as ``python: NAME``)
and the files it would upload, so a test can assert exactly what a host would be
asked to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.context import ctx_host, ctx_state


@dataclass
class PlannedOp:
    name: str
    commands: list[str] = field(default_factory=list)
    uploads: dict[str, bytes] = field(default_factory=dict)


def plan(deploy_func, data: dict | None = None, responses: dict | None = None) -> list[PlannedOp]:
    host_data = {"fake_delay": 0, "fake_delay_jitter": 0, "fake_responses": responses or {}}
    host_data.update(data or {})
    inventory = Inventory(([("@fake/spark", host_data)], {}))
    state = State(inventory, Config())
    connect_all(state)
    add_deploy(state, deploy_func)
    (host,) = list(inventory)

    ops = []
    for op_hash in state.get_op_order():
        planned = PlannedOp(name=" ".join(sorted(state.op_meta[op_hash].names)))
        with ctx_state.use(state), ctx_host.use(host):
            for command in state.get_op_data_for_host(host, op_hash).command_generator():
                if isinstance(command, FileUploadCommand):
                    planned.uploads[command.dest] = command.src.getvalue()
                elif isinstance(command, StringCommand):
                    planned.commands.append(command.get_raw_value())
                elif isinstance(command, FunctionCommand):
                    planned.commands.append(f"python: {command.function.__name__}")
                else:  # pragma: no cover - sparkrig yields nothing else
                    raise AssertionError(f"unexpected command {command!r}")
        ops.append(planned)
    return ops
