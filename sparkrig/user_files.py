"""Reads of a path a user controls: never through a link, never blocking, capped in size and time."""

from __future__ import annotations

import shlex

from . import rendering

# Root (or a deploy waiting on a user's process) reads files a user can replace: a build's
# stamp and result, the venv's lock and metadata, authorized_keys. Each such read is
# USER_READ: a regular file only (a FIFO, device, directory or link reads as missing),
# opened without following a link and without blocking (dd's nofollow, nonblock: a FIFO
# swapped in after the check still never blocks), at most LIMIT bytes (a larger file is
# refused on stderr), and killed after READ_TIMEOUT_S seconds whatever happens.
# Exit status: 0 read, 1 missing or not a regular file, 2 too large, 124 timed out.
READ_TIMEOUT_S = 10
USER_READ = rendering.script("sparkrig/user-read.sh.j2", timeout_s=READ_TIMEOUT_S)


def user_read(path: str, limit: int, as_user: str | None = None) -> str:
    """Shell text printing the file at ``path`` (shell syntax, quoted by the caller: e.g.
    ``'"$w/stamp.json"'``) as :data:`USER_READ` reads it, at most ``limit`` bytes; run as
    ``as_user`` (shell syntax too, through ``runuser``) when given."""
    prefix = f"runuser -u {as_user} -- " if as_user else ""
    return f"{prefix}sh -c {shlex.quote(USER_READ)} sparkrig-read {path} {int(limit)}"
