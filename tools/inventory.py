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
