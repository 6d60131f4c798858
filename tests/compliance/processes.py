"""
A service's running process as the kernel knows it, for controls that check its arguments.

``/proc/PID/cmdline`` alone says too little: on a host that runs programs of a foreign
architecture through binfmt_misc (qemu-user, as the lab's aarch64 host; or a machine with
Debian's ``qemu-user-binfmt``, whose ``/usr/libexec/qemu-binfmt/aarch64-binfmt-P`` comes
first), the kernel puts the interpreter's path and the program's path in front of the
program's own words, and with binfmt's ``P`` flag its original argv[0] after them. So the
process is recognised by what the interpreter cannot change: its ``comm`` (the kernel sets it
from the executed file's name) and the file the kernel runs (``/proc/PID/exe``: the program,
or the interpreter). The words in front are taken off only where that file is a known
interpreter, owned by root and writable by nobody else.
"""

from __future__ import annotations

import os
import re

# How binfmt_misc interpreters are named: qemu-user's (qemu-aarch64, qemu-aarch64-static) and
# Debian's qemu-user-binfmt wrappers (aarch64-binfmt-P).
KNOWN_INTERPRETER = re.compile(r"qemu-[a-z0-9_]+(?:-static)?|[a-z0-9_]+-binfmt-P")
# Separates the one command's parts (its argv comes last, one word a line).
_MARK = "--sparkrig-argv--"


def main_process_command(service: str) -> str:
    """One command (as root: /proc/PID/exe is the process owner's to read) printing, of
    ``service``'s main process: its pid, comm, the owner and mode of the file the kernel runs
    and that file's path, then a mark and its argv, one word a line. One pid for all of it,
    so a restart between two reads cannot mix two processes."""
    return (
        f'pid=$(systemctl show --property MainPID --value {service}) && [ "$pid" -gt 0 ] && '
        'echo "$pid" && cat "/proc/$pid/comm" && stat -L -c "%u %a" "/proc/$pid/exe" && '
        f'readlink "/proc/$pid/exe" && echo {_MARK} && tr "\\0" "\\n" < "/proc/$pid/cmdline"'
    )


class ProcessError(AssertionError):
    """The process's arguments cannot be told apart: what was found, for the control's message."""


def program_argv(output: str, program: str, service: str, stderr: str = "") -> list[str]:
    """``program``'s own argv (argv[0] first) from :func:`main_process_command`'s output.

    Fails (ProcessError, naming the service and what to check) when there is no main
    process, when it is not ``program`` (its comm), or when words stand in front of it
    that are not a root-owned binfmt interpreter's."""
    head, mark, tail = output.partition(f"\n{_MARK}\n")
    lines = head.splitlines()
    if not mark or len(lines) != 4:
        said = " ".join(part for part in (output.strip()[:200], stderr.strip()[:200]) if part)
        raise ProcessError(f"{service} has no main process to read (is it running?): {said or 'no output'}")
    pid, comm, owner_mode, exe = lines
    argv = tail.splitlines()
    if comm != program[:15]:  # the kernel keeps 15 characters of the name
        raise ProcessError(f"{service}'s main process {pid} is {comm!r}, not {program}")
    if argv and os.path.basename(argv[0]) in (program, comm):
        return argv
    # An interpreter in front: the kernel ran it (exe) with the program's path after it.
    uid, mode = owner_mode.split()
    front = argv[0] if argv else "(nothing)"
    if not KNOWN_INTERPRETER.fullmatch(os.path.basename(front)):
        raise ProcessError(
            f"{service}'s process {pid} ({program}) has {front!r} in front of its arguments, "
            f"not a known binfmt interpreter (qemu-*, *-binfmt-P): {argv[:4]}"
        )
    if uid != "0" or int(mode, 8) & 0o022:
        raise ProcessError(
            f"{service}'s process {pid} ({program}) runs through {exe} (owner uid {uid}, mode {mode}): "
            "an interpreter root does not alone control"
        )
    rest = argv[1:]  # the program's path as executed, then its words
    if not rest or os.path.basename(rest[0]) not in (program, comm):
        raise ProcessError(f"{service}'s process {pid}: after {front} comes {rest[:1]}, not {program}")
    if len(rest) > 1 and os.path.basename(rest[1]) in (program, comm):
        rest = rest[1:]  # binfmt's P flag: the original argv[0] kept after the path
    return rest
