"""
Many reads in one remote command, none able to forge or block another's answer: the
executor of the deploy's one reading (:mod:`sparkrig.reading`) and of the compliance
suite's prefetch (tests/compliance/reads.py).

:func:`script` runs the commands side by side (:data:`LANES` at once), each from ``/``
with stdin from ``/dev/null``, its stdout and stderr into files of a fresh ``mktemp -d``
(0700) and no other descriptor (3 to 9 closed; the script refuses to start with one above 9
open), in a process group of its own killed when it ended, under ``timeout -k`` and a file
size limit; any process still holding one of its files is killed before the files are read.
Only then does the shell print, for each command in order, its exit status and the lengths of
its output and standard error, then every output in one base64 line
(templates/sparkrig/run-parts.sh).
No nonce, no tag: nothing a command prints can reach the answer's structure, and there is
no secret to find on any command line. :func:`parse` refuses anything but that structure.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Sequence
from typing import NamedTuple

from pyinfra.api import StringCommand

from . import rendering

DRIVER = rendering.script("sparkrig/run-parts.sh")
LANES = 4  # commands run at once: most parts wait on a disk or a program's start, few on a CPU
PART_TIMEOUT_S = 60  # each command is killed (TERM, then KILL 2 s later) after this long
READING_TIMEOUT_S = 120  # no command starts after this long: a reading lasts this + one command's limit
PART_BYTES = 16 << 20  # each command's stdout, and its stderr, at most (a larger one is not sent)
# The most a command may write to any file (RLIMIT_FSIZE: killed beyond it): a bound on the
# host's disk, above what a reading's programs write themselves (apt-cache its caches).
FILE_BYTES = 256 << 20
READING_BYTES = 64 << 20  # every command's output together at most (the controller holds it)
START = "sparkrig-parts"
END = "sparkrig-parts-end"
# Exit status of timeout when it killed the command (TERM: 124; KILL after -k: 137), of a
# command killed by its file size limit (SIGXFSZ: 128 + 25).
TIMED_OUT = (124, 137)
OVER_SIZE = 153
_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class Answer(NamedTuple):
    """What one command did: its exit status (an int), or ``"late"`` (not started: the
    reading's time was spent), ``"cut"`` (not started: its unit ran out of time),
    ``"over"`` (the reading's bytes were spent), ``"big"`` (an output over its cap, not
    sent), ``"lost"`` (no status came back); its stdout and stderr as bytes."""

    status: int | str
    stdout: bytes
    stderr: bytes


def script(
    commands: Sequence[str | StringCommand],
    timeouts: Sequence[int] | None = None,
    *,
    shell: str = "sh",
    lanes: int = LANES,
    reading_timeout_s: int = READING_TIMEOUT_S,
    part_bytes: int = PART_BYTES,
    reading_bytes: int = READING_BYTES,
    file_bytes: int = FILE_BYTES,
    units: Sequence[Sequence[int]] | None = None,
) -> str:
    """The shell text running ``commands`` (each ``shell -c COMMAND``; ``shell`` is shell
    syntax: ``"${SHELL:-/bin/sh}"`` for the login shell), each killed after its entry of
    ``timeouts`` (:data:`PART_TIMEOUT_S` each unless given).

    ``units`` (default: each command its own): the commands' indexes grouped, every index
    once; a unit of several runs them one after another in one shell, each in a subshell
    (its own stdin, outputs and status), under one time limit, the largest of theirs: for
    cheap reads, whose start (a ``timeout`` and a shell, about 3 ms of a host's CPU) costs
    more than they do. A unit killed at its limit answers the command it was running with
    the unit's status, and those it never reached with ``"cut"``. In a unit, ``$$`` is the
    unit's shell (a subshell's, as POSIX has it), not the command's own."""
    timeouts = list(timeouts) if timeouts is not None else [PART_TIMEOUT_S] * len(commands)
    if len(timeouts) != len(commands):
        raise ValueError("one time limit per command")
    units = [list(unit) for unit in units] if units is not None else [[i] for i in range(len(commands))]
    if sorted(i for unit in units for i in unit) != list(range(len(commands))) or not all(units):
        raise ValueError("the units must hold every command's index once")
    head = [
        f"n={len(commands)}",
        f"units={len(units)}",
        f"lanes={max(1, int(lanes))}",
        f"blocks={max(1, int(max(file_bytes, part_bytes)) // 512)}",
        f"cap={int(part_bytes)}",
        f"reading_s={int(reading_timeout_s)}",
        f"total={int(reading_bytes)}",
        f"sh={shell}",
        # Bash sees SSH_CLIENT and takes itself for sshd's shell, sourcing the user's ~/.bashrc
        # (Debian's SSH_SOURCE_BASHRC): without it no command's shell runs start-up files,
        # whose output would become that command's answer.
        "unset SSH_CLIENT SSH2_CLIENT",
    ]
    for index, command in enumerate(commands):
        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        head.append(f"c{index}={shlex.quote(text)}")
    for index, unit in enumerate(units):
        head += [f"m{index}='{' '.join(map(str, unit))}'", f"t{index}={max(int(timeouts[i]) for i in unit)}"]
    return "\n".join(head) + "\n" + DRIVER


def parse(lines: Sequence[str], count: int, *, preamble: bool = False, part_bytes: int = PART_BYTES) -> list[Answer]:
    """The ``count`` answers :func:`script` printed, in order; ValueError for anything else
    (a missing or extra line, a field that is not what it must be, an output over
    ``part_bytes``, outputs that are not as long as the parts' lines say). With
    ``preamble``, lines before the start are skipped (a login shell's start-up files print
    there, before the script runs; nothing a command prints can)."""
    lines = list(lines)
    header = f"{START} {count}"
    if preamble and header in lines:
        lines = lines[lines.index(header) :]
    if not lines or lines[0] != header:
        raise ValueError(f"the reading did not start with {header!r}")
    if len(lines) != count + 3 or lines[-1] != END:
        raise ValueError(f"the reading has {len(lines)} lines, not {count + 3} ending in {END!r}")
    heads = []
    for index, line in enumerate(lines[1:-2]):
        fields = line.split(" ")
        if len(fields) != 5 or fields[0] != "part" or fields[1] != str(index):
            raise ValueError(f"line {index + 1} of the reading is not part {index}'s")
        status_text, lengths = fields[2], fields[3:]
        if status_text in ("late", "cut", "over", "lost", "big"):
            status: int | str = status_text
        elif status_text.isdigit() and len(status_text) <= 3:
            status = int(status_text)
        else:
            raise ValueError(f"part {index}: status {status_text[:20]!r}")
        for length in lengths:
            if not length.isdigit() or len(length) > 12 or int(length) > part_bytes:
                raise ValueError(f"part {index}: an output length {length[:20]!r} (at most {part_bytes} bytes)")
        heads.append((status, int(lengths[0]), int(lengths[1])))
    field, _, text = lines[-2].partition(" ")
    text = "" if text == "-" else text
    if field != "data" or not _B64.fullmatch(text):
        raise ValueError("the reading's outputs are not one base64 line")
    data = base64.b64decode(text, validate=True)
    if len(data) != sum(out + err for _, out, err in heads):
        raise ValueError(f"the reading's outputs are {len(data)} bytes, not what its parts' lines say")
    answers, at = [], 0
    for status, out, err in heads:
        answers.append(Answer(status, data[at : at + out], data[at + out : at + out + err]))
        at += out + err
    return answers


def printed(answers: Sequence[Answer]) -> list[str]:
    """The lines :func:`script` prints for ``answers``, as :func:`parse` reads them (what a
    host's reading looks like, for a test to change)."""
    data = b"".join(answer.stdout + answer.stderr for answer in answers)
    return [
        f"{START} {len(answers)}",
        *(f"part {i} {a.status} {len(a.stdout)} {len(a.stderr)}" for i, a in enumerate(answers)),
        f"data {base64.b64encode(data).decode() or '-'}",
        END,
    ]


def failure(answer: Answer, timeout_s: int = PART_TIMEOUT_S, part_bytes: int = PART_BYTES) -> str | None:
    """Why ``answer`` is no answer (a command that ran out of time or bytes, or never
    ran), in words; None for an exit status the command itself chose."""
    status = answer.status
    if status == "late":
        return f"not started: the reading's {READING_TIMEOUT_S} s were spent"
    if status == "over":
        return f"not read: the reading's {READING_BYTES} bytes were spent"
    if status == "cut":
        return "not started: a command run before it in its unit was killed at the unit's limit"
    if status == "lost":
        return "its status never came back"
    if status == "big":
        return f"printed more than {part_bytes} bytes"
    if status == OVER_SIZE:
        return f"wrote more than {FILE_BYTES} bytes to a file: killed"
    if status in TIMED_OUT:
        return f"still running after {timeout_s} s: killed"
    return None


def contained(
    command: str | StringCommand, timeout_s: int, part_bytes: int = PART_BYTES, file_bytes: int = FILE_BYTES
) -> str:
    """Shell text running ``command`` alone as :func:`script` runs a part (stdin from
    ``/dev/null``, its output into a private file, no other descriptor, killed after
    ``timeout_s``, whatever it leaves killed when it ends, no file it writes over
    ``file_bytes``), then printing its stdout and stderr (at most ``part_bytes`` each) and
    exiting with its status: for a command that
    must run a program a user controls (as that user), outside any reading, so that the
    program can neither hold the caller's output open nor outlive the command."""
    relay = (
        'read -r h && read -r _ _ s o e && read -r _ b && read -r end && [ "$end" = sparkrig-parts-end ] || exit 1; '
        'case $o$e in ""|*[!0-9]*) exit 1;; esac; '
        '[ "$b" = - ] || { printf %s "$b" | base64 -d | head -c "$o"; '
        'printf %s "$b" | base64 -d | tail -c "+$((o + 1))" >&2; }; '
        'case $s in ""|*[!0-9]*) echo "sparkrig: the command did not end ($s)" >&2; exit 1;; esac; exit "$s"'
    )
    # The executor's umask (077, for its private files) is not the command's: what it makes (a
    # venv's files) must be readable by others as with any command pyinfra runs.
    text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
    driver = script(
        [f"umask 022; {text}"],
        [timeout_s],
        lanes=1,
        reading_timeout_s=max(60, timeout_s),
        part_bytes=part_bytes,
        file_bytes=file_bytes,
    )
    return f"sh -c {shlex.quote(driver)} | {{ {relay}; }}"
