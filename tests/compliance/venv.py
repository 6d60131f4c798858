"""
How the compliance suite reads a venv a user owns, without running the user's programs
with anyone else's rights.

- The Python version is read from ``pyvenv.cfg`` through sparkrig's bounded reader
  (``sparkrig.user_files.user_read``: no link, no blocking, capped in size and time), as root;
  each distribution's name and version from its ``*.dist-info`` folder's name and its
  ``direct_url.json`` through the same reader, as the deploy's own reading reads them
  (templates/python_stack/dists.sh: the suite and the deploy judge the venv on one record, a
  few programs for the whole venv where each METADATA cost eight); what they hold is untrusted
  text, parsed here. The venv is capped as a whole: :data:`VENV_ANSWER_LIMIT` bytes of the
  answer, :data:`VENV_READ_TIMEOUT_S` seconds, at most :data:`DIST_INFO_LIMIT` dist-infos;
  a venv past a cap, or holding two records of one distribution, fails its controls saying so.
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

from sparkrig import rendering
from sparkrig.operations.python_stack import facts as stack_facts
from sparkrig.user_files import USER_READ

PYVENV_LIMIT = 64 * 1024
DIST_INFO_LIMIT = 1000  # a Spark's vLLM venv holds about 200
VENV_ANSWER_LIMIT = 8 * 1024 * 1024  # the whole venv's answer, base64 included
VENV_READ_TIMEOUT_S = 60
INTERPRETER_TIMEOUT_S = 80  # torch's first import on a Spark takes seconds; a hang fails its control
INTERPRETER_OUTPUT_LIMIT = 1024 * 1024  # of stdout and of stderr, each

# The deploy's own reading of the venv (templates/python_stack/dists.sh, the PythonStack
# fact's): every *.dist-info folder's name in one line, then each direct_url.json through
# the one reader, base64-encoded (no byte of a name or a record can forge a line); "end"
# once whole. The whole answer is capped (head -c) and timed: a missing "end" says a cap was met.
# $1 the venv, $2 dists.sh, $3 the reader.
_DISTS = rendering.script("python_stack/dists.sh")
_DISTRIBUTIONS = (
    f'{{ timeout -k 1 {VENV_READ_TIMEOUT_S} sh -c "$2" sparkrig-dists "$1" "$3" {stack_facts.URL_LIMIT} '
    f"&& echo end; }} | head -c {VENV_ANSWER_LIMIT}"
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
    """The distributions of ``venv`` as its records say, read as the deploy reads them: {name
    (normalised): {"version", "direct"}} from each ``*.dist-info`` folder's name
    (``direct``: its direct_url.json's object, or None). A need's part: it reads through ``r``."""
    answer = r.run("sh -c %s sparkrig-venv %s %s %s", _DISTRIBUTIONS, venv, _DISTS, USER_READ, sudo=True)
    lines = answer.check().splitlines()
    if not lines or lines[-1] != "end":
        raise AssertionError(
            f"{venv}'s dist-info folders were not read whole: more than {VENV_ANSWER_LIMIT} bytes, "
            f"or more than {VENV_READ_TIMEOUT_S} s"
        )
    names, records = [], {}
    for line in lines[:-1]:
        key, _, value = line.partition(" ")
        if key == "dists" and value == "unreadable":
            raise AssertionError(f"{venv}: a link on the way to its site-packages: not read")
        fields = value.split(" ")
        try:
            decoded = [base64.b64decode(f, validate=True).decode("utf-8", "surrogateescape") for f in fields]
        except (binascii.Error, ValueError):
            continue
        if key == "dists" and len(decoded) == 1:
            names += filter(None, decoded[0].split("\0"))
        elif key == "url" and len(decoded) == 2:
            records[decoded[0]] = decoded[1]
    if len(names) > DIST_INFO_LIMIT:
        raise AssertionError(f"{venv} holds more than {DIST_INFO_LIMIT} *.dist-info folders: not read")
    found: dict[str, dict] = {}
    for entry in names:
        dist = stack_facts.dist_info(entry)
        if dist is None:
            continue  # names no distribution (the deploy reports it)
        name, version = dist
        if name in found:
            raise AssertionError(f"{venv} holds two records of {name}: {found[name]['version']} and {version}")
        try:
            direct = json.loads(records[entry]) if entry in records else None
        except ValueError:
            direct = None
        found[name] = {"version": version, "direct": direct if isinstance(direct, dict) else None}
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
