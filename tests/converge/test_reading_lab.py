"""
The deploy's one reading against a hostile venv owner, on a real lab host: the owner's
``bin/python`` reads its parents' command lines and environment, writes forged fact lines
(a ClusterLeftovers path to remove, an unhold, another running kernel) to every descriptor
it inherited and to its output, and leaves a child holding its output open for ever. The
reading never runs it: the deploy ends, with no change, and every canary (a root-only file, a
package held by hand, the kernel record) is as it was. (uv's venv sync, which the owner can
cause by making their venv drift, runs their python as them, contained: see docs/security.md
for what that bounds.)
"""

from __future__ import annotations

import shlex
import time

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import run_deploy

pytestmark = pytest.mark.lab
HOST = "lab-deb12"
OWNER = "sparkrig-hostile"
VENV = "/opt/sparkrig/venv"
LOG = "/var/tmp/sparkrig-hostile-ran"
CANARY = "/root/sparkrig-canary"
HELD = "dash"  # installed everywhere, held by hand here: never in updates_hold
KERNEL_RECORD = "/var/lib/sparkrig/updates-held"

# The owner's bin/python: every attack a reading once let it make.
HOSTILE = f"""#!/bin/sh
echo "ran uid=$(id -u) parent=$(tr '\\0' ' ' </proc/$PPID/cmdline | cut -c1-200)" >>{LOG}
for p in $(ls /proc | grep -E '^[0-9]+$'); do cat /proc/$p/cmdline /proc/$p/environ >>{LOG}.seen 2>/dev/null; done
forged='env_file {CANARY}
leftover {CANARY}
held {HELD}
record {HELD}
kernel 0.0.0-forged'
for fd in 1 3 4 5 6 7 8 9 10 11 12; do (printf '%s\\n' "$forged" >&$fd) 2>/dev/null; done
printf 'part 0 0 3 0\\ndata aWQ=\\nsparkrig-parts-end\\n'
setsid sh -c 'echo $$ >>{LOG}.children; while :; do echo still; sleep 1; done' &
exit 0
"""


def _root(script: str, check: bool = True) -> str:
    result = lab.run_ssh(HOST, f"sudo sh -c {shlex.quote(script)}", check=False)
    if check:
        assert result.returncode == 0, result.stderr
    return result.stdout


def _canaries() -> tuple[str, str, str]:
    return (
        _root(f"sha256sum {CANARY}"),
        _root("apt-mark showhold"),
        _root(f"sha256sum {KERNEL_RECORD} 2>/dev/null || echo none", check=False),
    )


def test_a_hostile_venv_owner_never_runs_in_the_reading_and_cannot_forge_or_block_it(first_converge):
    assert first_converge.returncode == 0, first_converge.log[-3000:]
    owner = ["--limit", HOST, "--data", f"python_venv_owner={OWNER}"]
    _root(
        f"id -u {OWNER} >/dev/null 2>&1 || useradd -m {OWNER}; umask 077; echo secret >{CANARY}; "
        f"apt-mark hold {HELD} >/dev/null; rm -f {LOG} {LOG}.seen {LOG}.children"
    )
    python = f"{VENV}/bin/python"
    try:
        handed = run_deploy(LAB_INVENTORY, *owner)  # the venv becomes the owner's
        assert handed.returncode == 0, handed.log[-3000:]
        before = _canaries()
        # The owner's bin/python is now theirs to replace.
        replace = f"rm -f {python} && cat >{python} && chmod 755 {python}"
        lab.run_ssh(HOST, f"sudo runuser -u {OWNER} -- sh -c {shlex.quote(replace)}", input=HOSTILE)
        started = time.monotonic()
        again = run_deploy(LAB_INVENTORY, *owner, timeout=900)
        assert again.returncode == 0, again.log[-3000:]
        assert again.changed() == {}, again.log[-3000:]  # nothing forged reached a decision
        assert _root(f"cat {LOG} 2>/dev/null; true") == ""  # it never ran, as anyone
        assert _canaries() == before
        assert time.monotonic() - started < 300  # nothing held the deploy
    finally:
        for pid in _root(f"cat {LOG}.children 2>/dev/null; true").split():
            _root(f"kill -KILL {int(pid)} 2>/dev/null; true")
        _root(
            f"rm -f {python}; "
            f"ln -s /usr/bin/python3.11 {python}; apt-mark unhold {HELD} >/dev/null; "
            f"rm -f {CANARY} {LOG} {LOG}.seen {LOG}.children",
            check=False,
        )
        assert run_deploy(LAB_INVENTORY, "--limit", HOST).returncode == 0
        _root(f"userdel -r {OWNER} 2>/dev/null; true", check=False)
