"""
What the compliance suite reads of a host, read once.

The controls ask testinfra small questions, one remote command each: a file's owner, its
group and its mode are three commands (``stat -Lc %U``, ``%G``, ``%a``), its existence and
type more (``test -e``, ``test -f``...), and the same host-wide questions (``id -nu``, the
hardware, the page size) come back from control after control. Over a link of 50 ms each
costs a few round trips. Here:

- a question about a path (``test -[edfLSx] P``, ``stat -Lc %U|%G|%a|%u|%g P``,
  ``readlink -f P``, ``realpath P``) reads everything about that path in one command, and the other
  questions about P are answered from that reading;
- a host-wide question that no control changes (who am I, the kernel's architecture, the
  page size, the memory size, the OS release, whether systemd is PID 1) is asked once.

The controller reads the host-wide constants every host is asked (:data:`EVERY_HOST`) in one
command per host before any control runs (:func:`prefetch`), and hands the answers to
each pytest-xdist worker (:func:`seed`): with a host's controls spread over several
workers, each would otherwise ask them again.

A control that runs anything else may change what it reads next (it starts a job, runs a
container), so any other command forgets the paths read so far: nothing is answered from a
reading older than the last command that could have changed it. The answers are those the
host would give the same commands at that point; only the number of round trips changes.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from testinfra.backend.base import BaseBackend, CommandResult

# testinfra's questions about one path (modules/file.py), its path shell-quoted as it quotes it.
_PATH_QUESTION = re.compile(r"(?P<ask>test -[edfLSx]|stat -Lc %[UGaug]|readlink -f|realpath) (?P<path>\S+|'[^']*')")
# Host-wide questions whose answer no control changes.
_CONSTANT = re.compile(
    r"id -nu|id -u [a-z_][a-z0-9_-]*|id -un|getconf PAGESIZE|uname -[msr]|dpkg --print-architecture"
    r"|cat -- /etc/os-release|cat /etc/os-release|test -d /run/systemd/system|command -v [a-z0-9_.-]+"
    r"|awk '\$1 == \"MemTotal:\" \{ print \$2 \}' /proc/meminfo"
    r"|uname -m; command -v nvidia-smi .*"
)
# One command that answers every path question: the six tests as 0/1, then stat, then readlink.
_TESTS = "edfLSx"
_READ_PATH = (
    "p=%s; for t in " + " ".join(_TESTS) + "; do if test -$t \"$p\"; then printf 1; else printf 0; fi; done; echo;"
    " stat -Lc '%%U %%G %%a %%u %%g' -- \"$p\" 2>/dev/null || echo; readlink -f -- \"$p\" || echo; realpath -- \"$p\" || echo"
)


# The constants that testinfra and the controls ask on every host, as they ask them.
EVERY_HOST = (
    "id -nu", "uname -s", "uname -m", "cat /etc/os-release", "test -d /run/systemd/system",
    "getconf PAGESIZE", "awk '$1 == \"MemTotal:\" { print $2 }' /proc/meminfo",
)
PREFETCH_TIMEOUT_S = 60
CONNECT_TIMEOUT_S = 10  # an unreachable host delays the suite's start by this much at most
# Answers read by the controller: host name -> command -> (exit status, stdout, stderr).
_SEEDS: dict[str, dict[str, tuple[int, bytes, bytes]]] = {}


def prefetch_script(commands: Iterable[str], nonce: str) -> str:
    """A shell script that runs each of ``commands`` (constants: none changes the host) and
    prints one line per command: ``nonce:status:stdout:stderr``, the outputs base64-encoded."""
    for command in commands:
        if not _CONSTANT.fullmatch(command):
            raise ValueError(f"not a host-wide constant: {command!r}")
    quoted = " ".join(shlex.quote(c) for c in commands)
    return (
        'd=$(mktemp -d) || exit 1; trap \'rm -rf "$d"\' EXIT; '
        f'for c in {quoted}; do sh -c "$c" >"$d/o" 2>"$d/e" </dev/null; r=$?; '
        f'printf \'{nonce}:%s:%s:%s\\n\' "$r" "$(base64 -w0 <"$d/o")" "$(base64 -w0 <"$d/e")"; done'
    )


def parse_prefetch(output: str, commands: Iterable[str], nonce: str) -> dict[str, tuple[int, bytes, bytes]]:
    """The answers in :func:`prefetch_script`'s ``output``, in the order of ``commands``; empty
    when the output is not whole (lines for every command, each with this run's nonce)."""
    commands = list(commands)
    lines = [line for line in output.splitlines() if line.startswith(f"{nonce}:")]
    if len(lines) != len(commands):
        return {}
    answers = {}
    for command, line in zip(commands, lines):
        fields = line.split(":")
        if len(fields) != 4 or not fields[1].isdigit():
            return {}
        try:
            answers[command] = (int(fields[1]), base64.b64decode(fields[2], validate=True),
                                base64.b64decode(fields[3], validate=True))
        except ValueError:
            return {}
    return answers


def prefetch(ssh_config: str, names: Iterable[str], commands: Iterable[str] = EVERY_HOST) -> dict:
    """``commands`` read on every host of ``names`` (over SSH with ``ssh_config``), one command
    per host, the hosts at once: {name: {command: [status, stdout, stderr]}}, outputs as
    base64 text (what pytest-xdist hands a worker). A host that cannot be read is left out:
    its controls then ask for themselves, and fail there if it is unreachable."""
    commands = list(commands)

    def one(name: str):
        nonce = uuid.uuid4().hex
        try:
            result = subprocess.run(
                ["ssh", "-F", ssh_config, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                 name, prefetch_script(commands, nonce)],
                capture_output=True, text=True, timeout=PREFETCH_TIMEOUT_S, stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return name, {}
        answers = parse_prefetch(result.stdout, commands, nonce) if result.returncode == 0 else {}
        return name, {c: [rc, base64.b64encode(out).decode(), base64.b64encode(err).decode()]
                      for c, (rc, out, err) in answers.items()}

    names = [n for n in names if n != "@local"]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
        return {name: found for name, found in pool.map(one, names) if found}


def seed(found: Mapping[str, Mapping[str, list]]) -> None:
    """Answer the constants :func:`prefetch` read from them, in this process."""
    for name, answers in found.items():
        _SEEDS[name] = {c: (int(rc), base64.b64decode(out), base64.b64decode(err))
                        for c, (rc, out, err) in answers.items()}


class HostReads:
    """The answers read so far on one host (one per testinfra backend)."""

    def __init__(self, seeded: Mapping[str, tuple[int, bytes, bytes]] | None = None):
        self.paths: dict[str, dict[str, str] | None] = {}
        self.constants: dict[str, CommandResult] = {}
        self.seeded = dict(seeded or {})
        self.commands = 0

    def answer(self, backend: BaseBackend, run, command: str, args: tuple) -> CommandResult:
        if backend.sudo:  # another user's view: asked as it is
            return self._forgetting(run, command, args)
        plain = backend.quote(command, *args)
        if _CONSTANT.fullmatch(plain):
            if plain not in self.constants and plain in self.seeded:
                rc, out, err = self.seeded[plain]
                self.constants[plain] = backend.result(rc, backend.encode(plain), out, err)
            elif plain not in self.constants:
                self.constants[plain] = run(command, *args)
            return self.constants[plain]
        question = _PATH_QUESTION.fullmatch(plain)
        if question:
            path = shlex.split(question["path"])[0]
            if path not in self.paths:
                self.paths[path] = self._read_path(backend, run, path)
            found = self.paths[path]
            if found is not None:
                return self._result(backend, plain, question["ask"], found)
            return run(command, *args)  # unreadable as one: asked as it is
        return self._forgetting(run, command, args)

    def _forgetting(self, run, command, args) -> CommandResult:
        self.paths.clear()
        return run(command, *args)

    @staticmethod
    def _read_path(backend, run, path: str) -> dict[str, str] | None:
        out = run(_READ_PATH, path)
        lines = out.stdout.split("\n")
        if out.rc != 0 or len(lines) < 4 or len(lines[0]) != len(_TESTS) or set(lines[0]) - {"0", "1"}:
            return None
        stat = lines[1].split()
        found = {f"test -{t}": lines[0][i] for i, t in enumerate(_TESTS)}
        if len(stat) == 5:
            found.update(zip(("stat -Lc %U", "stat -Lc %G", "stat -Lc %a", "stat -Lc %u", "stat -Lc %g"), stat))
        found["readlink -f"], found["realpath"] = lines[2], lines[3]
        return found

    @staticmethod
    def _result(backend, command: str, ask: str, found: dict[str, str]) -> CommandResult:
        if ask.startswith("test -"):
            rc, out = (0 if found[ask] == "1" else 1), b""
        elif ask in found and (ask not in ("readlink -f", "realpath") or found[ask]):
            rc, out = 0, (found[ask] + "\n").encode()
        else:  # stat or readlink of a path that is not there
            rc, out = 1, b""
        return backend.result(rc, backend.encode(command), out, b"")


# SPARKRIG_COMPLIANCE_LOG=FILE: every command sent to a host is logged there, one JSON line
# (host, control, command), to see what each control asks (benchmarks count them).
_LOG = os.environ.get("SPARKRIG_COMPLIANCE_LOG")


def _logged(run, backend):
    def sent(command, *args):
        with open(_LOG, "a") as log:
            log.write(json.dumps({"host": backend.get_hostname(), "control": os.environ.get("PYTEST_CURRENT_TEST", ""),
                                  "command": backend.quote(command, *args), "sudo": bool(backend.sudo)}) + "\n")
        return run(command, *args)

    return sent


def install(backend_class) -> None:
    """Answer ``backend_class``'s commands through one :class:`HostReads` per backend."""
    run = backend_class.run
    if getattr(run, "sparkrig_reads", False):
        return

    def answered(self, command, *args, **kwargs):
        reads = self.__dict__.get("_sparkrig_reads")
        if reads is None:
            reads = self.__dict__["_sparkrig_reads"] = HostReads(_SEEDS.get(self.get_hostname()))
        send = lambda c, *a: run(self, c, *a, **kwargs)  # noqa: E731
        return reads.answer(self, _logged(send, self) if _LOG else send, command, args)

    answered.sparkrig_reads = True
    answered.__wrapped__ = run
    backend_class.run = answered
