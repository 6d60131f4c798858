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

A control that runs anything else may change what it reads next (it starts a job, runs a
container), so any other command forgets the paths read so far: nothing is answered from a
reading older than the last command that could have changed it. The answers are those the
host would give the same commands at that point; only the number of round trips changes.
"""

from __future__ import annotations

import re
import shlex

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


class HostReads:
    """The answers read so far on one host (one per testinfra backend)."""

    def __init__(self):
        self.paths: dict[str, dict[str, str] | None] = {}
        self.constants: dict[str, CommandResult] = {}
        self.commands = 0

    def answer(self, backend: BaseBackend, run, command: str, args: tuple) -> CommandResult:
        if backend.sudo:  # another user's view: asked as it is
            return self._forgetting(run, command, args)
        plain = backend.quote(command, *args)
        if _CONSTANT.fullmatch(plain):
            if plain not in self.constants:
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


def install(backend_class) -> None:
    """Answer ``backend_class``'s commands through one :class:`HostReads` per backend."""
    run = backend_class.run
    if getattr(run, "sparkrig_reads", False):
        return

    def answered(self, command, *args, **kwargs):
        reads = self.__dict__.setdefault("_sparkrig_reads", HostReads())
        return reads.answer(self, lambda c, *a: run(self, c, *a, **kwargs), command, args)

    answered.sparkrig_reads = True
    answered.__wrapped__ = run
    backend_class.run = answered
