"""
A pyinfra inventory as the tools read it: its hosts with their data (asked of pyinfra's own
CLI), a ``--limit`` applied as pyinfra applies it, and where the caller's project is.

A command runs in the caller's project: a sparkrig checkout (its deploy.py beside the tools) or,
from the wheel, the directory of the caller's deploy file (``./deploy.py`` unless named), where
pyinfra finds its config.py and group_data/ as it would for ``pyinfra INVENTORY deploy.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

# The checkout the tools belong to (sparkrig/tools links to its tools/); installed from the
# wheel there is none (site-packages/sparkrig holds no deploy.py) and the caller's directory
# is the project.
HOME = Path(__file__).resolve().parent.parent
REPO = HOME if (HOME / "deploy.py").is_file() else Path.cwd()
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def in_checkout() -> bool:
    """Whether the tools run from a checkout (its deploy.py and compliance suite beside them)."""
    return (HOME / "deploy.py").is_file() and (HOME / "tests" / "compliance").is_dir()


def limit_hosts(groups_of: dict[str, list[str]], limit: Sequence[str]) -> list[str]:
    """The hosts (in inventory order) that pyinfra's ``--limit`` picks: each pattern
    (comma-separated, or given several times) names a group, else is a glob on host
    names. No pattern: every host. A pattern that matches nothing is an error."""
    patterns = [p.strip() for item in limit for p in item.split(",") if p.strip()]
    if not patterns:
        return list(groups_of)
    chosen: set[str] = set()
    for pattern in patterns:
        matched = {name for name, groups in groups_of.items() if pattern in groups}
        matched = matched or {name for name in groups_of if fnmatch(name, pattern)}
        if not matched:
            raise ValueError(f"--limit {pattern!r} matches no host or group of the inventory")
        chosen |= matched
    return [name for name in groups_of if name in chosen]


def data_args(extra: Sequence[str]) -> list[str]:
    """The ``--data KEY=VALUE`` options among pyinfra's (they change what a host's settings are)."""
    found = []
    for i, arg in enumerate(extra):
        if arg == "--data" and i + 1 < len(extra):
            found += [arg, extra[i + 1]]
        elif arg.startswith("--data="):
            found.append(arg)
    return found


class InventoryError(RuntimeError):
    """pyinfra could not load the inventory, or refused a host's settings: ``line`` says why in one line."""

    def __init__(self, line: str, output: str):
        super().__init__(f"{line}\n{output}")
        self.line = line


def _why(output: str) -> str:
    """pyinfra's one line that says why it could not load an inventory: sparkrig's settings
    error (one line naming the host, the key and what is allowed) when it is one, else the
    last line that is not a traceback's frame."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("host ") and " = " in line and "allowed" in line:
            return line
    said = [line for line in lines if not line.startswith(("File ", "Traceback", "^", "--> "))]
    return (said or lines or ["pyinfra failed and said nothing"])[-1]


def read_inventory(
    inventory: str, timeout: float = 120, data: Sequence[str] = (), cwd: Path | None = None
) -> list[dict]:
    """Every host of a pyinfra inventory, in order: ``{"name", "groups", "data"}``, its data
    merged as pyinfra merges it (group_data included), read from the project ``cwd``.

    Asked of the pyinfra CLI itself (``debug-inventory --json``, which also validates every
    host's settings), in a subprocess: importing pyinfra's CLI would monkey-patch this
    process with gevent. Raises InventoryError with pyinfra's output when it cannot load it.
    """
    result = subprocess.run(
        [PYINFRA, *data, str(Path(inventory).resolve()), "debug-inventory", "--json"],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        output = f"{result.stderr}{result.stdout}"
        raise InventoryError(f"{inventory}: {_why(output)}", f"pyinfra could not load {inventory}:\n{output}")
    return json.loads(result.stdout)


def load_inventory(inventory: str) -> list[dict]:
    """:func:`read_inventory`'s answer for an inventory file, read in this process by pyinfra's
    own loader (``pyinfra_cli.inventory.make_inventory``, as ``debug-inventory`` loads it, from
    the repository, its group_data included; every command from ``/``, as config.py sets it):
    no second interpreter that imports pyinfra again (0.65 s here, on an idle machine). Every
    host's settings are validated as config.py validates them before a deploy. Anything but a
    file (a host list, a module's function) is asked of the CLI. Raises RuntimeError, naming
    the inventory and why, when it cannot load it or a setting is bad.

    pyinfra_cli's package patches the whole process for gevent when imported, which a
    caller with threads, subprocesses and signals of its own (pytest) must not get: its
    loader module is imported without running that package's ``__init__``, which is then
    forgotten again, so a later ``import pyinfra_cli`` (pyinfra's CLI itself) patches as usual."""
    path = Path(inventory).resolve()
    if not path.is_file():
        return read_inventory(inventory)
    import importlib  # noqa: PLC0415 - the loader is imported only when an inventory is read
    import importlib.util  # noqa: PLC0415

    from pyinfra.api import Config, State  # noqa: PLC0415
    from pyinfra.context import ctx_config, ctx_state  # noqa: PLC0415

    from sparkrig.connection import from_slash  # noqa: PLC0415
    from sparkrig.operations import declaring  # noqa: PLC0415
    from sparkrig.settings import validate_hosts  # noqa: PLC0415

    stub = "pyinfra_cli" not in sys.modules
    if stub:
        sys.modules["pyinfra_cli"] = importlib.util.module_from_spec(importlib.util.find_spec("pyinfra_cli"))
    try:
        make_inventory = importlib.import_module("pyinfra_cli.inventory").make_inventory
        json_encode = importlib.import_module("pyinfra_cli.util").json_encode
    finally:
        if stub:
            del sys.modules["pyinfra_cli"]
    state = State(check_for_changes=False)
    state.cwd = str(REPO)
    try:
        with ctx_state.use(state), ctx_config.use(Config()):
            loaded = make_inventory(str(path), cwd=str(REPO))
            from_slash(loaded)
            hosts = [{"name": host.name, "groups": list(host.groups), "data": host.data.dict()} for host in loaded]
        declaring()
        validate_hosts([(host["name"], host["data"]) for host in hosts])
    except (Exception, SystemExit) as error:  # an inventory file may exit, as the lab's does when it is down
        raise InventoryError(
            f"{inventory}: {_why(str(error))}", f"pyinfra could not load {inventory}:\n{error}"
        ) from None
    # As debug-inventory's JSON has it (tuples as lists, pyinfra's own types as it writes them).
    return json.loads(json.dumps(hosts, default=json_encode))
