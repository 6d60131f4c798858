"""
How the compliance suite reads a venv a user owns, without running the user's programs
with anyone else's rights (issue 35, finding 1).

- The Python version is read from ``pyvenv.cfg``, and each distribution's name, version and
  ``direct_url.json`` from its ``*.dist-info`` files, as files, through sparkrig's bounded
  reader (``sparkrig.user_files.user_read``: no link, no blocking, capped in size and time),
  as root; what they hold is untrusted text, parsed here.
- Where only the venv's interpreter can answer (does torch import, what GPU does it see), it
  runs as the venv's owner named in the settings (never a user found by following a path),
  with ``-I``, from ``/``, killed after :data:`INTERPRETER_TIMEOUT_S` seconds; as ``nobody``
  when the owner is root. Never as another user than the owner: the owner's program runs with
  the rights its owner already has, none more (an owner who may use sudo could run it with
  sudo themselves; the suite's own login user, who may, never runs it).
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
DIRECT_URL_LIMIT = 64 * 1024
PYVENV_LIMIT = 64 * 1024
INTERPRETER_TIMEOUT_S = 80  # torch's first import on a Spark takes seconds; a hang fails its control

# One line per *.dist-info folder: its path, its METADATA's headers (up to the first blank
# line) and its direct_url.json, each base64-encoded (no byte in them can forge a line).
_DISTRIBUTIONS = (
    'for d in "$1"/lib/python3*/site-packages/*.dist-info; do '
    'test -d "$d" || continue; '
    f'm=$({user_read(chr(34) + "$d/METADATA" + chr(34), METADATA_LIMIT)} | sed "/^\\r*$/q" | base64 -w0); '
    f"u=$({user_read(chr(34) + '$d/direct_url.json' + chr(34), DIRECT_URL_LIMIT)} 2>/dev/null | base64 -w0); "
    'printf "%s %s %s\\n" "$(printf %s "$d" | base64 -w0)" "$m" "$u"; '
    "done"
)

# The venv's interpreter as its owner (see the module's docstring): $1 owner, $2 venv, $3 code,
# $4 the time limit.
_INTERPRETER = (
    'u=$1; if [ "$(id -u -- "$u")" = 0 ]; then u=nobody; fi; '
    'cd / && exec runuser -u "$u" -- timeout -k 5 "$4" "$2/bin/python" -I -c "$3"'
)


def distributions(r, venv: str) -> dict[str, dict]:
    """The distributions of ``venv`` as its dist-info files say: {name: {"version", "direct"}}
    (``direct``: direct_url.json's object, or None). A need's part: it reads through ``r``."""
    answer = r.run("sh -c %s sparkrig-venv %s", _DISTRIBUTIONS, venv, sudo=True)
    found = {}
    for line in answer.check().splitlines():
        fields = line.split(" ")
        if len(fields) != 3:
            continue
        try:
            metadata, direct = (base64.b64decode(f, validate=True).decode(errors="replace") for f in fields[1:])
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
        f"{shlex.quote(settings['python_venv_path'])} {shlex.quote(code)} {int(INTERPRETER_TIMEOUT_S)}"
    )
