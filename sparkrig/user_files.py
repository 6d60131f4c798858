"""The one reader of a path a user controls: no link in any component, never blocking,
capped in size and time."""

from __future__ import annotations

import shlex

from . import rendering

# Root (or a deploy waiting on a user's process) reads files a user can replace: a build's
# stamp, result and product, the venv's lock and metadata, authorized_keys. Each such read
# is USER_READ (templates/sparkrig/user-read.sh says how): an absolute path with no link in
# any component, a regular file only, opened without following a link and without
# blocking, at most its limit (a larger file is refused on stderr), and all of it (the
# directory walk and stat too) killed after its time limit whatever happens.
# Exit status: 0 read, 1 missing, not a regular file or a link on the way, 2 too large,
# 124 timed out.
READ_TIMEOUT_S = 10
USER_READ = rendering.script("sparkrig/user-read.sh")


def user_read(path: str, limit: int, as_user: str | None = None, timeout_s: int | None = None) -> str:
    """Shell text printing the file at ``path`` (shell syntax, quoted by the caller: e.g.
    ``'"$w/stamp.json"'``) as :data:`USER_READ` reads it, at most ``limit`` bytes, killed
    after ``timeout_s`` seconds (:data:`READ_TIMEOUT_S` unless given); run as ``as_user`` (shell syntax too, through ``runuser``)
    when given."""
    prefix = f"runuser -u {as_user} -- " if as_user else ""
    return f"{prefix}timeout -k 1 {int(timeout_s or READ_TIMEOUT_S)} sh -c {shlex.quote(USER_READ)} sparkrig-read {path} {int(limit)}"
