"""``python -m lab try``: sparkrig's main job against the lab, as a newcomer's first run.

Boots a fresh lab fleet, converges it with ``pyinfra inventory/lab.py deploy.py``, converges it
again (which must change nothing), proves it with the compliance suite (its per-host table is
the last thing printed) and tears the lab down, unless ``--keep``. Each deploy's whole output
goes to a log file in the lab's directory; its summary line is printed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from . import DEFAULT_FLEET, config, down, up
from .stack import make_locks

REPO = Path(__file__).resolve().parent.parent
INVENTORY = "inventory/lab.py"
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def _say(message: str) -> None:
    print(f"try: {message}", flush=True)


def _converge(round_: int) -> str:
    """Run the deploy; its summary line (raises with the log's tail when it fails)."""
    log = config.LAB_DIR / f"try-converge-{round_}.log"
    started = time.monotonic()
    with log.open("w") as out:
        result = subprocess.run(
            [PYINFRA, "-y", INVENTORY, "deploy.py"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    lines = log.read_text().splitlines()
    summary = next((line.split("--> ", 1)[1] for line in reversed(lines) if "--> " in line and " host" in line), "")
    if result.returncode != 0:
        tail = "\n".join(lines[-30:])
        raise SystemExit(f"try: converge {round_}/2 failed (exit {result.returncode}), log {log}:\n{tail}")
    _say(f"converge {round_}/2: {summary or 'done'} in {time.monotonic() - started:.0f} s (log {log})")
    return summary


def run(keep: bool) -> int:
    """The whole job; the process exit status (the compliance suite's)."""
    started = time.monotonic()
    _say("booting a fresh lab (the first time also builds its Debian images: a few minutes)")
    for host in up(DEFAULT_FLEET):  # not the hostile host: ./try converges and proves the fleet
        _say(f"  {host.name}\t{host.flavour}\t{host.address}")
    make_locks()
    try:
        _converge(1)
        second = _converge(2)
        if not second.endswith("no changes"):
            raise SystemExit(f"try: the second converge changed something: {second}")
        _say("proving it: the compliance suite against every host")
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "tests/compliance",
                "--inventory",
                INVENTORY,
                "-q",
            ],
            cwd=REPO,
        ).returncode
    finally:
        if keep:
            _say(
                "--keep: the lab stays up (`uv run python -m lab ssh lab-deb13` logs in; "
                "`uv run python -m lab down` removes it)"
            )
        else:
            _say("tearing the lab down")
            down()
    _say(f"done in {time.monotonic() - started:.0f} s")
    return status
