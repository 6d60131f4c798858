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
# What a status means where the reader says nothing: it names a link on the way, a file that
# is not a regular one and a size on stderr, but not a file (or directory) that is not there.
UNSAID = {1: "no such file, or its directory cannot be entered", 124: f"not read within {READ_TIMEOUT_S} s"}


def user_read(path: str, limit: int, as_user: str | None = None, timeout_s: int | None = None) -> str:
    """Shell text printing the file at ``path`` (shell syntax, quoted by the caller: e.g.
    ``'"$w/stamp.json"'``) as :data:`USER_READ` reads it, at most ``limit`` bytes, killed
    after ``timeout_s`` seconds (:data:`READ_TIMEOUT_S` unless given); run as ``as_user``
    (shell syntax too, through ``runuser``) when given."""
    prefix = f"runuser -u {as_user} -- " if as_user else ""
    return (
        f"{prefix}timeout -k 1 {int(timeout_s or READ_TIMEOUT_S)} "
        f"sh -c {shlex.quote(USER_READ)} sparkrig-read {path} {int(limit)}"
    )


def copy_out(path: str, dest: str, limit: int, as_user: str, timeout_s: int, what: str) -> str:
    """Shell text copying the file ``path`` a user controls, read by ``as_user`` through the
    one reader (at most ``limit`` bytes, within ``timeout_s`` seconds), into ``dest``
    (root's, named by the caller); where it cannot, ``dest`` is removed and the command
    fails with one line naming ``what`` and the file (a FIFO, a device, a link, a sparse
    file larger than the limit: nothing is copied)."""
    read = user_read(shlex.quote(path), limit, as_user=shlex.quote(as_user), timeout_s=timeout_s)
    said = (
        f"sparkrig: {what}: {path} not copied (status %s): it must be a regular file of at most {limit} bytes, "
        f"with no link on its way, read as {as_user} within {timeout_s} s\\n"
    )
    return (
        f"{{ {read} > {shlex.quote(dest)} || {{ s=$?; rm -f {shlex.quote(dest)}; "
        f'printf {shlex.quote(said)} "$s" >&2; exit 1; }}; }}'
    )
