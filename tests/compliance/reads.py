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

The read-only controls go further: each compliance module declares what its read-only
controls will ask (``reads(plan, settings)``, from the host's settings, like the deploy's
reading planners in sparkrig/reading.py), and the controller reads every declaration of a
host in ONE command, the commands run side by side on the host (:func:`prefetch`; a
declaration that needs an earlier answer, such as a process id, is planned again with the
answers so far: one more command per round, at most :data:`ROUNDS`). A read-only control
is then answered from that reading whenever it asks, of the host or of a path, exactly what
was declared (the command the host would run, sudo included). **The rule: a prefetched
answer is the host's state at the suite's start.** That is what a read-only control checks
on a converged host; a control that acts (starts a job, runs a container, cuts a connection,
computes on the GPU) is marked ``@pytest.mark.action`` and is never answered from the
prefetch. A command nobody declared is still asked of the host (and counted), so a missing
declaration costs a round trip, never a wrong answer.

Outside the prefetch a control that runs anything else may change what it reads next (it
starts a job, runs a container), so any other command forgets the paths read so far: nothing
is answered from a reading older than the last command that could have changed it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
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
PREFETCH_TIMEOUT_S = 120
ROUNDS = 5  # rounds of declarations at most (a pid, then its cmdline; a stamp, then its wheel)
CONNECT_TIMEOUT_S = 10  # an unreachable host delays the suite's start by this much at most
# Whether the control running in this process acts (``@pytest.mark.action``): its
# questions are never answered from the prefetch (set by the suite's conftest).
acting = False
# Answers read by the controller: host name -> command -> (exit status, stdout, stderr).
_SEEDS: dict[str, dict[str, tuple[int, bytes, bytes]]] = {}


def prefetch_script(commands: Iterable[str], nonce: str) -> str:
    """A shell script that runs each of ``commands`` (reads: none changes the host), side by
    side, each as the host runs an SSH command (the login shell's ``-c``, stdin empty), and
    prints one line per command, in order: ``nonce:status:stdout:stderr``, the outputs
    base64-encoded."""
    quoted = " ".join(shlex.quote(c) for c in commands)
    return (
        'd=$(mktemp -d) || exit 1; trap \'rm -rf "$d"\' EXIT; s=${SHELL:-/bin/sh}; i=0; '
        f'for c in {quoted}; do i=$((i+1)); '
        '{ "$s" -c "$c" >"$d/$i.o" 2>"$d/$i.e" </dev/null; echo $? >"$d/$i.r"; } & done; wait; i=0; '
        f'for c in {quoted}; do i=$((i+1)); '
        f'printf \'{nonce}:%s:%s:%s\\n\' "$(cat "$d/$i.r")" "$(base64 -w0 <"$d/$i.o")" "$(base64 -w0 <"$d/$i.e")"; done'
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


def sudo_command(command: str, user: str | None = None) -> str:
    """``command`` as testinfra's ``host.sudo(user)`` sends it (BaseBackend.get_sudo_command)."""
    return BaseBackend.get_sudo_command(BaseBackend, command, user)  # type: ignore[arg-type]


class Plan:
    """What one host's read-only controls will ask, declared by each module's
    ``reads(plan, settings)``: commands exactly as testinfra sends them, and paths (every
    testinfra question about a path, answered from one reading of it). ``plan.known``
    holds the answers of earlier rounds, for declarations that depend on one."""

    def __init__(self, answers: Mapping[str, tuple[int, bytes, bytes]] | None = None):
        self.wanted: dict[str, None] = {}
        self.answers = answers or {}
        self.name: str | None = None  # the host's inventory name
        self.inventory: dict[str, dict] | None = None  # every host of the inventory (a cluster's peers)

    def run(self, command: str, *args: str, sudo: bool = False, user: str | None = None) -> str:
        """Declare ``host.run(command, *args)`` (inside ``host.sudo(user)`` when ``sudo``)."""
        sent = BaseBackend.quote(command, *args)
        sent = sudo_command(sent, user) if sudo else sent
        self.wanted[sent] = None
        return sent

    def path(self, path: str) -> None:
        """Declare every question testinfra's ``host.file(path)`` asks without reading it
        (exists, is_file, user, mode, linked_to...)."""
        self.run(_READ_PATH, path)

    def file(self, path: str, sudo: bool = False) -> None:
        """A path and its content (``content``, ``content_string``)."""
        self.path(path)
        self.run("cat -- %s", path, sudo=sudo)

    def service(self, name: str) -> None:
        """testinfra's systemd ``host.service(name)``: is_running, is_enabled, exists."""
        self.path("/run/systemd/system/")
        self.run("systemctl is-active %s", name)
        self.run("systemctl is-enabled %s", name)
        self.run('systemctl list-unit-files | grep -q "^%s"', name)

    def package(self, name: str) -> None:
        """testinfra's Debian ``host.package(name)``: is_installed and version."""
        self.run("dpkg-query -f '${Status}' -W %s", name)
        self.run("dpkg-query -f '${Status} ${Version}' -W %s", name)

    def known(self, command: str, *args: str, sudo: bool = False, user: str | None = None) -> str | None:
        """The standard output an earlier round read for this declaration (None until then,
        or when it failed)."""
        sent = BaseBackend.quote(command, *args)
        found = self.answers.get(sudo_command(sent, user) if sudo else sent)
        return found[1].decode(errors="replace") if found and found[0] == 0 else None

    def known_path(self, path: str) -> dict[str, str] | None:
        """An earlier round's reading of ``path`` (as :meth:`HostReads._parse_path` gives it)."""
        found = self.answers.get(BaseBackend.quote(_READ_PATH, path))
        return None if found is None else HostReads._parse_path(found[0], found[1].decode(errors="replace"))


def _read(ssh_config: str, name: str, commands: list[str]) -> dict[str, tuple[int, bytes, bytes]]:
    """One round of :func:`prefetch` on host ``name``: one SSH command."""
    nonce = uuid.uuid4().hex
    if _LOG:
        with open(_LOG, "a") as log:
            log.write(json.dumps({"host": name, "control": "(prefetch)", "command": f"{len(commands)} reads",
                                  "sudo": False, "action": False}) + "\n")
    output = _ssh_output(["ssh", "-F", ssh_config, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                          name, prefetch_script(commands, nonce)])
    return {} if output is None else parse_prefetch(output, commands, nonce)


def _ssh_output(argv: list[str]) -> str | None:
    """The standard output of one prefetch's ssh, or None when it failed or ran out of time.
    Taken as bytes: a host may print bytes that are not UTF-8 (a Latin-1 banner in its
    .bashrc), which must fail no other host's reading; this run's own lines are ASCII."""
    try:
        result = subprocess.run(argv, capture_output=True, timeout=PREFETCH_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.decode("ascii", errors="replace") if result.returncode == 0 else None


def prefetch(ssh_config: str, names: Iterable[str], commands: Iterable[str] = EVERY_HOST,
             planners: Mapping[str, Callable[[Plan], None]] | None = None) -> dict:
    """``commands`` and what ``planners[name]`` declares, read on every host of ``names``
    (over SSH with ``ssh_config``), one command per host and round, the hosts at once:
    {name: {command: [status, stdout, stderr]}}, outputs as base64 text (what pytest-xdist
    hands a worker). A host that cannot be read is left out, a planner that fails stops
    planning for its host: its controls then ask for themselves (and fail there if it is
    unreachable)."""
    commands = list(commands)
    planners = planners or {}

    def one(name: str):
        answers: dict[str, tuple[int, bytes, bytes]] = {}
        for _round in range(ROUNDS):
            plan = Plan(answers)
            for command in commands:
                plan.wanted[command] = None
            if name in planners:
                try:
                    planners[name](plan)
                except Exception as error:  # noqa: BLE001 - a declaration's bug must not stop the suite
                    print(f"sparkrig compliance: {name}: reads not planned ({error!r})", file=sys.stderr)
            todo = [c for c in plan.wanted if c not in answers]
            if not todo:
                break
            found = _read(ssh_config, name, todo)
            if not found:
                break
            answers.update(found)
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
        sent = backend.get_command(command, *args)  # with host.sudo()'s wrapping, if any
        if not acting and sent in self.seeded:  # a read-only control asks what was prefetched
            return self._seeded(backend, sent)
        plain = backend.quote(command, *args)
        # host.sudo() wraps the command (it replaces the backend's get_command): another
        # user's view, asked as it is.
        if backend.sudo or sent != plain:
            return self._forgetting(run, command, args)
        if _CONSTANT.fullmatch(plain):
            if plain not in self.constants and plain in self.seeded:
                self.constants[plain] = self._seeded(backend, plain)
            elif plain not in self.constants:
                self.constants[plain] = run(command, *args)
            return self.constants[plain]
        question = _PATH_QUESTION.fullmatch(plain)
        if question:
            path = shlex.split(question["path"])[0]
            read = backend.quote(_READ_PATH, path)
            if not acting and read in self.seeded:
                rc, out, _err = self.seeded[read]
                found = self._parse_path(rc, out.decode(errors="replace"))
            else:
                if path not in self.paths:
                    self.paths[path] = self._read_path(run, path)
                found = self.paths[path]
            if found is not None:
                return self._result(backend, plain, question["ask"], found)
            return run(command, *args)  # unreadable as one: asked as it is
        return self._forgetting(run, command, args)

    def _seeded(self, backend, sent: str) -> CommandResult:
        rc, out, err = self.seeded[sent]
        return backend.result(rc, backend.encode(sent), out, err)

    def _forgetting(self, run, command, args) -> CommandResult:
        self.paths.clear()
        return run(command, *args)

    @classmethod
    def _read_path(cls, run, path: str) -> dict[str, str] | None:
        out = run(_READ_PATH, path)
        return cls._parse_path(out.rc, out.stdout)

    @staticmethod
    def _parse_path(rc: int, stdout: str) -> dict[str, str] | None:
        lines = stdout.split("\n")
        if rc != 0 or len(lines) < 4 or len(lines[0]) != len(_TESTS) or set(lines[0]) - {"0", "1"}:
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
                                  "command": backend.get_command(command, *args),
                                  "sudo": backend.get_command(command, *args) != backend.quote(command, *args),
                                  "action": acting}) + "\n")
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
