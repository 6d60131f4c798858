"""
How the compliance suite reads a venv a user owns, without running the user's programs
with anyone else's rights.

- The Python version is read from ``pyvenv.cfg``, and each distribution's name, version and
  ``direct_url.json`` from its ``*.dist-info`` files, as files, through sparkrig's bounded
  reader (``sparkrig.user_files.user_read``: no link, no blocking, capped in size and time),
  as root; what they hold is untrusted text, parsed here.
  The venv is capped as a whole, not only each file: at most :data:`DIST_INFO_LIMIT`
  dist-infos, :data:`HEADERS_LIMIT` bytes of each METADATA's headers (Name and Version come
  first), :data:`VENV_ANSWER_LIMIT` bytes of the whole answer and :data:`VENV_READ_TIMEOUT_S`
  seconds; a venv past a cap fails its controls, naming the cap (many dist-infos hard-linked
  to one large METADATA cost no disk to their owner, and would cost root and the controller
  their size each time).
- Where only the venv's interpreter can answer (does torch import, what GPU does it see), it
  runs as the venv's owner named in the settings (never a user found by following a path),
  with ``-I``, from ``/``, killed after :data:`INTERPRETER_TIMEOUT_S` seconds; as ``nobody``
  when the owner is root. Never as another user than the owner: the owner's program runs with
  the rights its owner already has, none more (an owner who may use sudo could run it with
  sudo themselves; the suite's own login user, who may, never runs it). It runs as a separate
  command (:data:`_RUNNER`, root's Python with ``-I``): no descriptor of the suite's reading
  but its own pipes (stdin empty), its output capped at :data:`INTERPRETER_OUTPUT_LIMIT` bytes,
  and every process it left killed when it returns (a PID namespace of its own, which the
  kernel empties when its first process ends; where the host allows none, its process group).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
from email.parser import HeaderParser

from sparkrig.user_files import user_read

METADATA_LIMIT = 4 * 1024 * 1024  # bytes of one METADATA file read at most (its headers are kept)
HEADERS_LIMIT = 16 * 1024  # bytes of one METADATA's headers kept (torch's are about 2 KB)
DIRECT_URL_LIMIT = 16 * 1024
PYVENV_LIMIT = 64 * 1024
DIST_INFO_LIMIT = 1000  # a Spark's vLLM venv holds about 200
VENV_ANSWER_LIMIT = 8 * 1024 * 1024  # the whole venv's answer, base64 included
VENV_READ_TIMEOUT_S = 60
INTERPRETER_TIMEOUT_S = 80  # torch's first import on a Spark takes seconds; a hang fails its control
INTERPRETER_OUTPUT_LIMIT = 1024 * 1024  # of stdout and of stderr, each

# One line per *.dist-info folder: its METADATA's headers (up to the first blank line,
# capped) and its direct_url.json, each base64-encoded (no byte in them can forge a line),
# and "end" once whole; "more" alone (nothing read) past DIST_INFO_LIMIT folders. The whole answer is
# capped (head -c) and timed: a missing "end" says which cap was met.
_DISTRIBUTIONS = (
    f"{{ timeout -k 1 {VENV_READ_TIMEOUT_S} sh -c '"
    + (
        'set -- "$1"/lib/python3*/site-packages/*.dist-info; '
        f'if [ "$#" -gt {DIST_INFO_LIMIT} ]; then echo more; exit 0; fi; '
        'for d in "$@"; do test -d "$d" || continue; '
        f'm=$({user_read(chr(34) + "$d/METADATA" + chr(34), METADATA_LIMIT)} | sed "/^\\r*$/q" '
        f"| head -c {HEADERS_LIMIT} | base64 -w0); "
        # Most dist-infos have no direct_url.json: the reader (five programs) only for one that
        # may (its checks are the reader's; -f here only spares it the others).
        f'u=; if [ -f "$d/direct_url.json" ]; then '
        f"u=$({user_read(chr(34) + '$d/direct_url.json' + chr(34), DIRECT_URL_LIMIT)} 2>/dev/null | base64 -w0); fi; "
        'printf "%s %s\\n" "$m" "$u"; '
        "done; echo end"
    ).replace("'", "'\\''")
    + f'\' sparkrig-venv "$1"; }} | head -c {VENV_ANSWER_LIMIT}'
)

# Runs argv[3:] as a separate command: every descriptor but its own pipes closed (subprocess's
# close_fds), stdin empty, stdout and stderr each capped at argv[1] bytes, killed after argv[2]
# seconds, in a PID namespace of its own (and its /proc) where the host allows one (unshare: when its first
# process ends the kernel kills every other) and in a session of its own (killed whole when
# it returns). Exit status: the command's; 124 out of time, 125 past the cap.
_RUNNER = r"""
import os, selectors, signal, subprocess, sys, time
limit, seconds, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# /proc mounted anew in the namespace: CUDA's driver fails (error 304) in a PID namespace
# that still sees the host's /proc, and the GPU controls run through here.
unshare = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
try:
    if subprocess.run(unshare + ["true"], timeout=10, **quiet).returncode == 0:
        argv = unshare + argv
except (OSError, subprocess.SubprocessError):
    pass
child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, cwd="/")
out = {child.stdout: bytearray(), child.stderr: bytearray()}
pick = selectors.DefaultSelector()
for pipe in out:
    pick.register(pipe, selectors.EVENT_READ)
deadline, status, ended = time.monotonic() + seconds, None, None
while pick.get_map():
    if child.poll() is not None and ended is None:
        ended = time.monotonic()
    now = time.monotonic()
    if now > deadline:
        status = 124
        break
    if ended is not None and now > ended + 2:
        break  # a leftover holds the pipes open: it is killed below
    for key, _ in pick.select(0.2):
        data = os.read(key.fd, 65536)
        if not data:
            pick.unregister(key.fileobj)
        elif len(out[key.fileobj]) + len(data) > limit:
            status = 125
            break
        else:
            out[key.fileobj] += data
    if status is not None:
        break
try:
    os.killpg(child.pid, signal.SIGKILL)
except OSError:
    pass
child.kill()
code = child.wait()
if status == 125:
    out[child.stderr] += b"sparkrig: the interpreter printed more than %d bytes: stopped\n" % limit
elif status == 124:
    out[child.stderr] += b"sparkrig: the interpreter did not end in %d s: stopped\n" % seconds
os.write(1, bytes(out[child.stdout]))
os.write(2, bytes(out[child.stderr]))
sys.exit(status if status is not None else (code if code >= 0 else 128 - code))
"""

# The venv's interpreter as its owner (see the module's docstring), through _RUNNER: $1 owner,
# $2 venv, $3 code, $4 the time limit, $5 the runner, $6 its output cap.
_INTERPRETER = (
    'u=$1; if [ "$(id -u -- "$u")" = 0 ]; then u=nobody; fi; '
    'cd / && exec python3 -I -c "$5" "$6" "$4" runuser -u "$u" -- "$2/bin/python" -I -c "$3"'
)


def distributions(r, venv: str) -> dict[str, dict]:
    """The distributions of ``venv`` as its dist-info files say: {name: {"version", "direct"}}
    (``direct``: direct_url.json's object, or None). A need's part: it reads through ``r``."""
    answer = r.run("sh -c %s sparkrig-venv %s", _DISTRIBUTIONS, venv, sudo=True)
    lines = answer.check().splitlines()
    if "more" in lines:
        raise AssertionError(f"{venv} holds more than {DIST_INFO_LIMIT} *.dist-info folders: not read")
    if not lines or lines[-1] != "end":
        raise AssertionError(
            f"{venv}'s dist-info folders were not read whole: more than {VENV_ANSWER_LIMIT} bytes, "
            f"or more than {VENV_READ_TIMEOUT_S} s"
        )
    found = {}
    for line in lines[:-1]:
        fields = line.split(" ")
        if len(fields) != 2:
            continue
        try:
            metadata, direct = (base64.b64decode(f, validate=True).decode(errors="replace") for f in fields)
        except (binascii.Error, ValueError):
            continue
        headers = HeaderParser().parsestr(metadata)
        name, version = headers.get("Name"), headers.get("Version")
        if not name or not version:
            continue
        try:
            direct_url = json.loads(direct) if direct.strip() else None
        except ValueError:
            direct_url = None
        found[name.strip()] = {
            "version": version.strip(),
            "direct": direct_url if isinstance(direct_url, dict) else None,
        }
    return found


def pyvenv_version(r, venv: str):
    """A function giving the venv's Python as "X.Y", from pyvenv.cfg (read now, parsed when called)."""
    answer = r.user_file(shlex.quote(f"{venv}/pyvenv.cfg"), PYVENV_LIMIT)

    def version() -> str | None:
        for line in answer.check().splitlines():
            key, _, value = line.partition("=")
            match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?\S*", value.strip())
            if key.strip() in ("version_info", "version") and match:
                return f"{match[1]}.{match[2]}"
        return None

    return version


def interpreter(settings, code: str) -> str:
    """Shell text running ``code`` with the venv's interpreter as its owner (run it as root)."""
    return (
        f"sh -c {shlex.quote(_INTERPRETER)} sparkrig-python {shlex.quote(settings['python_venv_owner'])} "
        f"{shlex.quote(settings['python_venv_path'])} {shlex.quote(code)} {int(INTERPRETER_TIMEOUT_S)} "
        f"{shlex.quote(_RUNNER)} {int(INTERPRETER_OUTPUT_LIMIT)}"
    )
