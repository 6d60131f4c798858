"""The lab's Python stack: its STAND-IN manifests (inventory/lab.py, one per Debian suite and
architecture, in the lab's state) locked on the controller by the real command, as a user
refreshes group_data/python_stack.locks. ``up`` does it once the hosts are up (the manifests
name the hosts' gateway), so a deploy to a lab brought up by hand finds its locks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .system import LabError

REPO = Path(__file__).resolve().parents[1]


def make_locks() -> list[str]:
    """Lock every stand-in manifest (a lock already fresh is left as it is); what the
    command said of each. Needs PyPI (the registries)."""
    # The lab's inventory loads only once the lab is up (and it imports this module).
    from inventory import lab as lab_inventory  # noqa: PLC0415

    said = []
    for manifest in lab_inventory.write_lab_manifests():
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sparkrig.tools",
                "lock",
                "--manifest",
                str(manifest),
                "--locks",
                str(lab_inventory.LAB_LOCKS),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if result.returncode != 0:
            raise LabError(f"locking the lab's stand-in stack {manifest.name} failed:\n{result.stderr[-3000:]}")
        said.append(result.stderr)
    return said
