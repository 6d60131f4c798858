"""Python stack: the state of uv and of one virtualenv, read in one command."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output, rendering, user_files
from sparkrig.venv import LOCK_LIMIT, UV, UV_CACHE, UV_ENV

UV_LINK = "/usr/local/bin/uv"
OFFLINE_DIR = "/var/lib/sparkrig/python-wheels"  # the controller's wheels, on a host
NO_CHANGES = "Would make no changes"
PLAN_TIMEOUT_S = 300  # the longest the offline dry run of the lock may take (emulated aarch64 included)

STACK_SCRIPT = rendering.script(
    "python_stack/stack.sh.j2",
    uv=UV,
    link=UV_LINK,
    cache=UV_CACHE,
    env=" ".join(UV_ENV),
    offline=OFFLINE_DIR,
    read_cfg=user_files.user_read('"$v/pyvenv.cfg"', 1 << 16),
    read_lock=user_files.user_read('"$s/requirements.lock"', LOCK_LIMIT),
    # The owner's venv could make the dry run wait for ever (a FIFO where uv reads).
    plan_timeout=PLAN_TIMEOUT_S,
)


def major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


class PythonStack(FactBase):
    """
    Returns the state of uv and of one virtualenv, read in one command: uv's version,
    whether ``/usr/local/bin/uv`` is taken, whether ``python3 -m venv`` can make a tool
    environment, the venv's Python, owner and usability, the sha256 of its lock, the
    last line of an offline ``uv pip sync --dry-run`` of the lock (run as the owner), and
    the wheel files in ``wheels`` (the controller's wheels, with ``python_offline``; the dry
    run finds wheels there), and whether :data:`OFFLINE_DIR` is there at all
    (``offline_dir``). ``planned``: the dry run's package lines (``~name==version``: a
    reinstall); when it would reinstall any, ``other_platform``: the packages ``uv pip
    check`` says were built for a different platform (see :func:`plan_clean`).

    .. code:: python

        {"uv": "0.13.9", "link_exists": True,
         "venv_module": True, "cache_owner": "spark", "owner_exists": True, "occupied": True, "python": "3.12.3",
         "owner": "spark", "usable": True, "lock": "9a...", "plan": "Would make no changes", "wheels": [],
         "offline_dir": False, "planned": [], "other_platform": []}
    """

    def command(self, venv: str, owner: str, wheels: str = "") -> StringCommand:
        return host_output.encoded(
            StringCommand(
                "v=",
                QuoteString(venv),
                "; o=",
                QuoteString(owner),
                "; w=",
                QuoteString(wheels),
                ";\n",
                STACK_SCRIPT,
                _separator="",
            )
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        return self.parse(host_output.decoded(output))

    def parse(self, output: list[str]) -> dict:
        """The reading from the command's decoded lines."""
        found = self.default()
        for line in output:
            key, _, value = line.partition(" ")
            if key in ("link_exists", "venv_module", "usable", "occupied", "owner_exists", "offline_dir"):
                found[key] = value == "yes"
            elif key in ("wheel", "planned", "other_platform"):
                found[key if key != "wheel" else "wheels"].append(value)
            elif key == "python":  # pyvenv.cfg's, the venv owner's: escaped, then no version we want
                found[key] = host_output.printable(value) or None
            elif key in found:
                found[key] = value or None
        return found

    @staticmethod
    def default() -> dict:
        return {
            "uv": None,
            "link_exists": False,
            "venv_module": False,
            "cache_owner": None,
            "owner_exists": False,
            "occupied": False,
            "python": None,
            "owner": None,
            "usable": False,
            "lock": None,
            "plan": None,
            "wheels": [],
            "offline_dir": False,
            "planned": [],
            "other_platform": [],
        }


def plan_clean(found: Mapping[str, Any]) -> bool:
    """Whether uv's dry run of the lock would change nothing that a sync can change: nothing, or
    only reinstall, at the version installed, packages whose wheel names another platform in
    its WHEEL file (``other_platform``: uv reinstalls those at every sync, and the same pinned
    file keeps the same tags)."""
    if found["plan"] == NO_CHANGES:
        return True
    planned = found.get("planned") or []
    return (
        bool(planned)
        and (found["plan"] or "").lstrip().startswith("~")
        and all(line.startswith("~") and line[1:].split("==")[0] in found.get("other_platform", []) for line in planned)
    )
