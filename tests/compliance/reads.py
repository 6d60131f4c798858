"""
How the compliance suite reads a host: every read-only control through one layer, each read
declared once.

A read-only control states what it reads as a **need**: a function of a :class:`Reader`,
registered with :func:`need`, that asks the reader for commands, paths and files and returns
what the control checks. The control takes the ``read`` fixture and calls ``read(NEED)``;
it never calls ``host.run``/``host.file`` itself (the suite's conftest refuses it while a
read-only control runs, and tests/repo/test_compliance_reads.py checks the source).

The same function is the prefetch's declaration: before any control runs, the controller
evaluates every registered need of a host against the answers read so far, and reads
everything they asked in ONE command per round, the commands run side by side on the host
(:func:`prefetch`). A need that uses an answer not read yet (:class:`Pending`) asks again
in the next round; :data:`ROUNDS` at most, and a converged host needs two. ``read(NEED)``
then evaluates the need again with those answers: nothing is sent. Whatever it asks that
was not read (a host the prefetch could not reach, a control marked ``action``) is read
then, through the same script, in one command per round.

**The rule: a prefetched answer is the host's state at the suite's start.** A control that
acts (starts a job, runs a container, cuts a connection, computes on the GPU) is marked
``@pytest.mark.action``: it may call testinfra's host itself, and the answers of its
``read(NEED)`` are read fresh.

How each read runs on the host: from ``/``, by ``sh`` as the login user, as root through
``sudo -n`` where asked, each killed after :data:`READ_TIMEOUT_S` seconds; files a user
controls through ``sparkrig.user_files.user_read`` (no link, no blocking, capped); outputs
travel base64-encoded, so no byte a host prints can forge another answer, and answers are
bytes until a control decodes them (undecodable bytes replaced, never raised).

Action controls still use testinfra's host; for them a host-wide constant (who am I, the
OS release...) is asked once, and every question about one path (``test -e P``, ``stat -Lc
%U P``...) is answered from one reading of it (:class:`HostReads`), forgotten at the next
other command.
"""

from __future__ import annotations

import base64
import json
import os
import re
import selectors
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from testinfra.backend.base import BaseBackend, CommandResult

from sparkrig import parts, user_files
from sparkrig.tools.report import printable
from sparkrig.user_files import user_read

from . import early

# testinfra's questions about one path (modules/file.py), its path shell-quoted as it quotes it.
_PATH_QUESTION = re.compile(r"(?P<ask>test -[edfLSx]|stat -Lc %[UGaug]|readlink -f|realpath) (?P<path>\S+|'[^']*')")
# Host-wide questions whose answer no control changes.
_CONSTANT = re.compile(
    r"id -nu|id -u [a-z_][a-z0-9_-]*|id -un|getconf PAGESIZE|uname -[msr]|dpkg --print-architecture"
    r"|cat -- /etc/os-release|cat /etc/os-release|test -d /run/systemd/system|command -v [a-z0-9_.-]+"
    r"|awk '\$1 == \"MemTotal:\" \{ print \$2 \}' /proc/meminfo"
    r"|uname -m; command -v nvidia-smi .*"
)
# One command that answers every path question: the six tests as 0/1, then stat, then
# readlink -f (which is also realpath's answer: GNU's two canonicalize alike, every component
# but the last one must exist).
_TESTS = "edfLSx"
_READ_PATH = (
    "p=%s; for t in " + " ".join(_TESTS) + '; do if test -$t "$p"; then printf 1; else printf 0; fi; done; echo;'
    ' stat -Lc \'%%U %%G %%a %%u %%g %%s\' -- "$p" 2>/dev/null || echo; readlink -f -- "$p" || echo'
)
_STATS = ("stat -Lc %U", "stat -Lc %G", "stat -Lc %a", "stat -Lc %u", "stat -Lc %g", "stat -Lc %s")


# The constants that testinfra and the action controls ask on every host, as they ask them.
EVERY_HOST = (
    "id -nu",
    "uname -s",
    "uname -m",
    "cat /etc/os-release",
    "test -d /run/systemd/system",
    "getconf PAGESIZE",
    "awk '$1 == \"MemTotal:\" { print $2 }' /proc/meminfo",
)
PREFETCH_TIMEOUT_S = 120
# What the controller holds of one host's round at most (its standard output; stderr is not
# kept): past it the round is dropped, and that host's controls fail on their own reads.
PREFETCH_OUTPUT_LIMIT = 64 * 1024 * 1024
READ_TIMEOUT_S = 90  # each read on the host is killed after this long (a hung command fails its control)
PREFETCH_LANES = 8  # reads run at once on a host (most wait on sudo's start or a program's)
ROUNDS = 3  # rounds of a host's needs at most (a converged host needs two)
CONNECT_TIMEOUT_S = early.CONNECT_TIMEOUT_S  # an unreachable host delays the suite's start by this much at most
# Whether the control running in this process acts (``@pytest.mark.action``): its reads are
# never answered from the prefetch (set by the suite's conftest).
acting = False
# Whether a read-only control is running in this process (its call): then any command but the
# layer's is refused (set by the suite's conftest).
guarded = False
_sending = False  # the layer itself is sending (allowed while guarded)
# Every read each host's rounds planned, in order: (ssh config, host) -> the reads (the next
# run sends them early, in one script: early.py).
PLANNED: dict[tuple[str, str], list[str]] = {}
# Answers read by the controller: inventory name -> command -> (exit status, stdout, stderr).
_SEEDS: dict[str, dict[str, tuple[int, bytes, bytes]]] = {}
# Every need, by its qualified name (module.function).
NEEDS: dict[str, Callable[[Reader], Any]] = {}
# The needs the prefetch leaves out (``need(prefetch=False)``).
LIVE: set[str] = set()
# The needs a control asks of a cluster's peers too (``need(peers=True)``): the prefetch reads
# them of each peer a --limit leaves out.
PEERS: set[str] = set()


class Pending(Exception):  # noqa: N818 - not an error: the answer comes in a later round
    """A need used an answer not read yet."""


class OutsideTheLayer(RuntimeError):
    """A read-only control read the host another way than through its needs."""


def need(function: Callable[[Reader], Any] | None = None, *, prefetch: bool = True, peers: bool = False):
    """Register ``function`` as a need: the prefetch reads what it asks of every host.
    ``@need(prefetch=False)``: a need only action controls ask, answered when they run and
    never in the prefetch (what runs the venv's interpreter: importing torch takes seconds,
    which a read-only run would wait for). ``@need(peers=True)``: a control asks it of the
    host's cluster peers too (``read_node``), and the prefetch reads it of each peer a --limit
    leaves out, beside the hosts' own reading (else the control reads the peer then, a
    connection of its own)."""

    def register(function: Callable[[Reader], Any]) -> Callable[[Reader], Any]:
        qualified = f"{function.__module__}.{function.__qualname__}"
        NEEDS[qualified] = function
        if not prefetch:
            LIVE.add(qualified)
        if peers:
            PEERS.add(qualified)
        return function

    return register if function is None else register(function)


# Root (an @local run as root, where sudo may not even be installed) needs no sudo.
AS_ROOT = '$(test "$(id -u)" = 0 || echo sudo -n --) sh -c '


def command_text(command: str, *args: str, sudo: bool = False) -> str:
    """What runs on the host for ``command`` (``%s`` filled with ``args``, shell-quoted as
    testinfra quotes them): from ``/``, as root when asked (through ``sudo -n`` unless root already)."""
    text = "cd / && " + (BaseBackend.quote(command, *args) if args else command)
    return AS_ROOT + shlex.quote(text) if sudo else text


class Answer:
    """One command's answer, as testinfra's CommandResult reads (``rc``, ``stdout``,
    ``stderr``, ``succeeded``, ``check()``); :class:`Pending` until it is read."""

    def __init__(
        self,
        answers: Mapping[str, tuple[int, bytes, bytes]],
        text: str,
        shown: str,
        unsaid: Mapping[int, str] | None = None,
    ):
        self._answers, self.text, self.shown = answers, text, shown
        self._unsaid = unsaid or {}  # what a status means where the command says nothing

    def _found(self) -> tuple[int, bytes, bytes]:
        found = self._answers.get(self.text)
        if found is None:
            raise Pending(self.text)
        return found

    @property
    def rc(self) -> int:
        return self._found()[0]

    @property
    def stdout_bytes(self) -> bytes:
        return self._found()[1]

    @property
    def stdout(self) -> str:
        return self._found()[1].decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self._found()[2].decode(errors="replace")

    @property
    def succeeded(self) -> bool:
        return self.rc == 0

    def check(self) -> str:
        """Its stdout without the last line end, as testinfra's ``check_output``; a failure
        names the command and what it said (its control characters escaped: a host's bytes
        never drive the terminal that shows the failure)."""
        if self.rc != 0:
            said = "\n".join(printable(line) for line in self.stderr.strip().splitlines())
            raise AssertionError(f"{self.shown} failed (exit {self.rc}): {said or self._unsaid.get(self.rc, '')}")
        return self.stdout.rstrip("\r\n")


class Path:
    """One reading of a path (testinfra's ``host.file`` questions): ``exists``, ``is_file``,
    ``is_directory``, ``is_symlink``, ``user``, ``group``, ``mode``, ``size``, ``linked_to``..."""

    def __init__(self, answer: Answer, path: str):
        self._answer, self.path = answer, path

    def _found(self) -> dict[str, str]:
        found = HostReads._parse_path(self._answer.rc, self._answer.stdout)
        if found is None:
            raise AssertionError(f"{self.path}: unreadable ({self._answer.stderr.strip()})")
        return found

    def _test(self, t: str) -> bool:
        return self._found()[f"test -{t}"] == "1"

    def _stat(self, ask: str) -> str:
        value = self._found().get(ask)
        if value is None:
            raise AssertionError(f"{self.path} is missing (stat)")
        return value

    exists = property(lambda self: self._test("e"))
    is_file = property(lambda self: self._test("f"))
    is_directory = property(lambda self: self._test("d"))
    is_symlink = property(lambda self: self._test("L"))
    is_socket = property(lambda self: self._test("S"))
    is_executable = property(lambda self: self._test("x"))
    user = property(lambda self: self._stat("stat -Lc %U"))
    group = property(lambda self: self._stat("stat -Lc %G"))
    mode = property(lambda self: int(self._stat("stat -Lc %a"), 8))
    uid = property(lambda self: int(self._stat("stat -Lc %u")))
    gid = property(lambda self: int(self._stat("stat -Lc %g")))
    size = property(lambda self: int(self._stat("stat -Lc %s")))

    @property
    def linked_to(self) -> str:
        target = self._found()["readlink -f"]
        if not target:
            raise AssertionError(f"{self.path}: readlink -f found nothing")
        return target


class Service:
    """testinfra's systemd ``host.service(name)``: ``is_running``, ``is_enabled``, ``exists``."""

    def __init__(self, reader: Reader, name: str, exists: bool = False):
        self.name = name
        self._active = reader.run("systemctl is-active %s", name)
        self._enabled = reader.run("systemctl is-enabled %s", name)
        # Listing every unit file takes a second or two on a busy host (1.9 s on a lab host,
        # against 0.07 s for this one's name as systemctl's own pattern): read only where
        # asked, and only the names that begin as this one does.
        self._listed = (
            reader.run('systemctl list-unit-files --no-legend %s | grep -q "^%s"', name + "*", name) if exists else None
        )

    @property
    def exists(self) -> bool:
        assert self._listed is not None, f"{self.name}: declare service(name, exists=True) to ask whether it exists"
        return self._listed.rc == 0

    is_running = property(lambda self: self._active.rc == 0)
    said_enabled = property(lambda self: self._enabled.stdout.strip())  # what `systemctl is-enabled` said

    @property
    def is_enabled(self) -> bool:
        if self._enabled.rc == 0:
            return True
        if self._enabled.stdout.strip() == "disabled":
            return False
        raise AssertionError(f"unable to determine state of {self.name}: {self._enabled.stdout.strip()}")


class Package:
    """testinfra's Debian ``host.package(name)``: ``is_installed``, ``version``."""

    def __init__(self, reader: Reader, name: str):
        self.name = name
        self._status = reader.run("dpkg-query -f '${Status} ${Version}' -W %s", name)

    @property
    def is_installed(self) -> bool:
        if self._status.rc != 0:
            return False
        out = self._status.stdout.strip().split()
        return bool(out) and out[0] in ("install", "hold") and out[1:3] == ["ok", "installed"]

    @property
    def version(self) -> str:
        assert self.is_installed, f"the package {self.name} is not installed: {self._status.stdout}"
        return self._status.stdout.split()[3]


class Reader:
    """What a need asks of one host, answered from ``answers`` (every ask is recorded in
    ``wanted``, read or not)."""

    def __init__(
        self,
        name: str,
        settings: Mapping,
        answers: Mapping[str, tuple[int, bytes, bytes]],
        inventory: Callable[[], Mapping[str, dict] | None] | None = None,
        only: set[str] | None = None,
    ):
        self.name, self.settings, self.answers = name, settings, answers
        self._inventory = inventory
        self.only = only  # the needs the prefetch plans with this reader (None: every one)
        self.wanted: dict[str, None] = {}

    @property
    def inventory(self) -> Mapping[str, dict] | None:
        """Every host of the inventory with its data (a cluster's peers), None if unknown."""
        return self._inventory() if self._inventory else None

    def run(
        self,
        command: str,
        *args: str,
        sudo: bool = False,
        shown: str | None = None,
        unsaid: Mapping[int, str] | None = None,
    ) -> Answer:
        """``command`` (``%s`` filled with ``args``, quoted), as root when ``sudo``; a failure
        names it as ``shown`` (the command itself unless given), and says what ``unsaid``
        gives for its status where it said nothing."""
        text = command_text(command, *args, sudo=sudo)
        self.wanted[text] = None
        return Answer(self.answers, text, shown or (BaseBackend.quote(command, *args) if args else command), unsaid)

    def check_output(self, command: str, *args: str, sudo: bool = False) -> str:
        return self.run(command, *args, sudo=sudo).check()

    def path(self, path: str, sudo: bool = False) -> Path:
        return Path(self.run(_READ_PATH, path, sudo=sudo), path)

    def file(self, path: str, sudo: bool = False) -> Answer:
        """The content of a file only root can change (``cat``; ``user_file`` for one a user can)."""
        return self.run("cat -- %s", path, sudo=sudo)

    def user_file(self, path: str, limit: int, as_user: str | None = None) -> Answer:
        """A file a user controls, through sparkrig's bounded reader (``path`` is shell
        syntax: ``shlex.quote`` a plain path), as root or as ``as_user`` (a plain name). A
        failure names the file, not the reader's twenty lines of shell."""
        return self.run(
            user_read(path, limit, shlex.quote(as_user) if as_user else None),
            sudo=True,
            shown=f"reading {path}" + (f" as {as_user}" if as_user else "") + " (sparkrig's bounded reader)",
            unsaid=user_files.UNSAID,
        )

    def service(self, name: str, exists: bool = False) -> Service:
        return Service(self, name, exists)

    def package(self, name: str) -> Package:
        return Package(self, name)


def system_login(script: str, user: str | None = None) -> str:
    """``script`` in bash as a login shell of ``user`` (the suite's login user when None)
    sees the system's profile (``/etc/profile`` and ``/etc/profile.d``, root's files), and
    nothing of the user's own: their start-up files can run anything and take any time (a
    pyenv hook), and the controls ask what sparkrig set. Run ``sudo=True`` for another
    user."""
    inner = "bash --noprofile --norc -c " + shlex.quote(". /etc/profile; " + script)
    if user is None:
        return inner
    q = shlex.quote(user)
    return (
        f'runuser -u {q} -- env -i HOME="$(getent passwd {q} | cut -d: -f6)" USER={q} LOGNAME={q} '
        f"SHELL=/bin/bash PATH=/usr/local/bin:/usr/bin:/bin {inner}"
    )


def _as_root(command: str) -> str | None:
    """The text root runs for ``command`` when :func:`command_text` made it ``sudo``, else None."""
    if not command.startswith(AS_ROOT):
        return None
    inner = shlex.split(command[len(AS_ROOT) :])
    return inner[0] if len(inner) == 1 and AS_ROOT + shlex.quote(inner[0]) == command else None


def _grouped(commands: list[str]) -> tuple[list[str], dict[str, str]]:
    """The commands run as the login user, and the ``sudo`` ones with the text root runs for
    each, in order, when two or more: those run in one :func:`root_script` behind one sudo."""
    inner = {command: _as_root(command) for command in commands}
    root = {command: text for command, text in inner.items() if text is not None}
    if len(root) < 2:
        return commands, {}
    return [command for command in commands if command not in root], root


# Root's reads of one round run in one sudo (a sudo costs a host about 10 ms of CPU, thirty
# of them a third of the reading), under their own executor: each still killed after
# ROOT_READ_TIMEOUT_S, none started after ROOT_READING_S, their outputs together within one
# read's cap (base64 makes 3 bytes 4).
ROOT_READ_TIMEOUT_S = READ_TIMEOUT_S - 10
ROOT_READING_S = 15
ROOT_GROUP_TIMEOUT_S = ROOT_READ_TIMEOUT_S + ROOT_READING_S + 10
ROOT_BYTES = parts.PART_BYTES // 4 * 3 - (1 << 16)


# Reads run UNIT_READS to a unit of the executor (one timeout and one shell, each read in a
# subshell of its own): most reads cost less than starting them alone. The suite's prefetch
# of a converged lab host (benchmarks/host_reading.py --unit-reads, docs/performance.md):
# 1.43 s and 1.85 s of its CPU one to a unit, 1.03 s and 1.38 s at 8.
UNIT_READS = 8


def units(count: int, size: int | None = None) -> list[list[int]]:
    """``count`` reads in order, ``size`` (:data:`UNIT_READS`) to a unit, fewer where that
    leaves lanes idle (a round of 8 reads: each its own, side by side)."""
    size = max(1, min(size or UNIT_READS, -(-count // PREFETCH_LANES)))
    return [list(range(i, min(i + size, count))) for i in range(0, count, size)]


def root_script(texts: list[str]) -> str:
    """One command running ``texts`` as root (through ``sudo -n`` unless root already),
    side by side, each as :func:`command_text` runs one alone (``sh -c``, from ``/``)."""
    inner = parts.script(
        texts,
        [ROOT_READ_TIMEOUT_S] * len(texts),
        lanes=PREFETCH_LANES,
        reading_timeout_s=ROOT_READING_S,
        part_bytes=ROOT_BYTES,
        reading_bytes=ROOT_BYTES,
        units=units(len(texts)),
    )
    return AS_ROOT + shlex.quote(inner)


def prefetch_script(commands: Iterable[str]) -> str:
    """A shell script that runs each of ``commands`` (reads: none changes the host), side by
    side, each by ``sh -c`` in the login user's environment (stdin empty), killed after
    :data:`READ_TIMEOUT_S` seconds: sparkrig's executor (:mod:`sparkrig.parts`), which
    the deploy's reading runs too; root's reads together behind one sudo, first
    (:func:`root_script`). No command can write into another's answer or hold the prefetch
    open, and no nonce is needed: the answers are length-delimited, base64-encoded, printed
    once every command ended."""
    mine, root = _grouped(list(commands))
    texts = ([root_script(list(root.values()))] if root else []) + mine
    timeouts = ([ROOT_GROUP_TIMEOUT_S] if root else []) + [READ_TIMEOUT_S] * len(mine)
    # Root's group (the longest part) alone, first.
    together = [[0]] + [[i + 1 for i in unit] for unit in units(len(mine))] if root else units(len(mine))
    return parts.script(
        texts,
        timeouts,
        units=together,
        # sh, as the deploy's reading: POSIX whatever the login shell (a zsh, a fish), and
        # started in a third of bash's time (a millisecond of CPU a read).
        shell="sh",
        lanes=PREFETCH_LANES,
        reading_timeout_s=PREFETCH_TIMEOUT_S - READ_TIMEOUT_S - 10,
    )


def _answers(found: list[parts.Answer], commands: list[str]) -> dict[str, tuple[int, bytes, bytes]]:
    """What ``found`` answers of ``commands``: a command that never ran (the reading's time or
    bytes were spent) is left out, its control reads it itself."""
    answers = {}
    for command, answer in zip(commands, found):
        if isinstance(answer.status, int):
            answers[command] = (answer.status, answer.stdout, answer.stderr)
        elif answer.status == "big":
            said = f"sparkrig compliance: {parts.failure(answer)}\n".encode()
            answers[command] = (parts.OVER_SIZE, answer.stdout, answer.stderr + said)
    return answers


def parse_prefetch(output: str, commands: Iterable[str]) -> dict[str, tuple[int, bytes, bytes]]:
    """The answers in :func:`prefetch_script`'s ``output``, in the order of ``commands``; empty
    when the output is not whole (what a login shell's start-up files print before it is
    skipped). Root's group, when its sudo failed, answers each of its commands with that
    failure (as each alone would have); when its output is not whole, none of them."""
    commands = list(commands)
    mine, root = _grouped(commands)
    try:
        found = parts.parse(output.splitlines(), len(mine) + bool(root), preamble=True)
    except ValueError:
        return {}
    if not root:
        return _answers(found, commands)
    answers = _answers(found[1:], mine)
    group = found[0]
    if group.status == 0:
        try:
            inner = parts.parse(group.stdout.decode("ascii").splitlines(), len(root), part_bytes=ROOT_BYTES)
        except (UnicodeDecodeError, ValueError):
            inner = []
        answers.update(_answers(inner, list(root)))
    elif isinstance(group.status, int):
        answers.update(dict.fromkeys(root, (group.status, b"", group.stderr)))
    return {command: answers[command] for command in commands if command in answers}


def _read(ssh_config: str, name: str, commands: list[str]) -> dict[str, tuple[int, bytes, bytes]]:
    """One round of :func:`prefetch` on host ``name``: one command (over SSH; on ``@local``, here)."""
    if _LOG:
        with open(_LOG, "a") as log:
            log.write(
                json.dumps(
                    {
                        "host": name,
                        "control": "(prefetch)",
                        "command": f"{len(commands)} reads",
                        "sudo": False,
                        "action": False,
                    }
                )
                + "\n"
            )
    # This round and the rounds after it, sent as the run started (early.py): taken where it is
    # the script this suite sends for those reads and they hold every read of this round.
    sent = early.take(
        ssh_config, name, lambda script, reads: set(commands) <= set(reads) and prefetch_script(reads) == script
    )
    if sent is not None:
        process, commands = sent
        output = _output(process, name)
    else:
        script = prefetch_script(commands)
        output = _ssh_output(["sh", "-c", script] if name == "@local" else early.argv(ssh_config, name, script), name)
    return {} if output is None else parse_prefetch(output, commands)


def _ssh_output(argv: list[str], name: str = "") -> str | None:
    """The standard output of one prefetch's ssh (or @local's sh), or None when it failed, ran
    out of time or printed more than :data:`PREFETCH_OUTPUT_LIMIT` bytes (the controller's
    memory for one host's answer is bounded). Taken as bytes: a host may print bytes that are
    not UTF-8 (a Latin-1 banner in its .bashrc), which must fail no other host's reading; this
    run's own lines are ASCII."""
    try:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd="/"
        )
    except OSError:
        return None
    return _output(process, name)


def _output(process: subprocess.Popen, name: str) -> str | None:
    """:func:`_ssh_output` of a started process."""
    deadline = time.monotonic() + PREFETCH_TIMEOUT_S
    chunks, size = [], 0
    with process, selectors.DefaultSelector() as pick:
        pick.register(process.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0 and size <= PREFETCH_OUTPUT_LIMIT:
            if not pick.select(min(left, 1.0)):
                continue
            chunk = os.read(process.stdout.fileno(), 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        else:
            process.kill()
            why = "time" if size <= PREFETCH_OUTPUT_LIMIT else f"more than {PREFETCH_OUTPUT_LIMIT} bytes"
            print(f"sparkrig compliance: {name}: the reading stopped ({why})", file=sys.stderr)
            return None
        try:
            returncode = process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            return None
    return b"".join(chunks).decode("ascii", errors="replace") if returncode == 0 else None


def plan(reader: Reader) -> None:
    """Evaluate every need against ``reader`` (what they ask lands in ``reader.wanted``)."""
    for qualified, function in NEEDS.items():
        if qualified in LIVE or (reader.only is not None and qualified not in reader.only):
            continue
        try:
            function(reader)
        except Pending:
            pass
        except (Exception, pytest.skip.Exception, pytest.fail.Exception):  # noqa: BLE001
            pass  # the control meets it again, and fails or skips with it


def prefetch(
    ssh_config: str,
    names: Iterable[str],
    commands: Iterable[str] = EVERY_HOST,
    readers: Mapping[str, Callable[[Mapping], Reader]] | None = None,
) -> dict:
    """``commands`` and what every need asks of each host (``readers[name](answers)``
    gives the host's :class:`Reader`), read on every host of ``names``, one command per host
    and round, the hosts at once: {name: {command: [status, stdout, stderr]}}, outputs as
    base64 text (what pytest-xdist hands a worker). A host that cannot be read is left out:
    its controls then ask for themselves (and fail there if it is unreachable)."""
    commands = list(commands)
    readers = readers or {}

    def one(name: str):
        answers: dict[str, tuple[int, bytes, bytes]] = {}
        planned: dict[str, None] = {}
        for _round in range(ROUNDS):
            wanted = dict.fromkeys(commands)
            if name in readers:
                try:
                    reader = readers[name](answers)
                    plan(reader)
                    wanted.update(reader.wanted)
                except Exception as error:  # noqa: BLE001 - a reader's bug must not stop the suite
                    print(f"sparkrig compliance: {name}: reads not planned ({error!r})", file=sys.stderr)
            planned.update(wanted)
            todo = [c for c in wanted if c not in answers]
            if not todo:
                break
            found = _read(ssh_config, name, todo)
            if not found:
                break
            answers.update(found)
        PLANNED[(ssh_config, name)] = list(planned)
        return name, {
            c: [rc, base64.b64encode(out).decode(), base64.b64encode(err).decode()]
            for c, (rc, out, err) in answers.items()
        }

    names = list(names)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
        return {name: found for name, found in pool.map(one, names) if found}


def seed(found: Mapping[str, Mapping[str, list]]) -> None:
    """Answer what :func:`prefetch` read, in this process."""
    for name, answers in found.items():
        _SEEDS[name] = {
            c: (int(rc), base64.b64decode(out), base64.b64decode(err)) for c, (rc, out, err) in answers.items()
        }


def _send(backend: BaseBackend, commands: list[str]) -> dict[str, tuple[int, bytes, bytes]]:
    """``commands`` read on ``backend``'s host in one command (:func:`prefetch_script`)."""
    global _sending
    _sending = True
    try:
        out = backend.run(prefetch_script(commands))
    finally:
        _sending = False
    return parse_prefetch(out.stdout_bytes.decode("ascii", errors="replace"), commands)


def answer(
    backend: BaseBackend,
    name: str,
    function: Callable[[Reader], Any],
    settings: Mapping,
    inventory: Callable[[], Mapping[str, dict] | None] | None = None,
) -> Any:
    """What the need ``function`` returns for host ``name`` (reached through ``backend``):
    answered from the prefetch (unless the control acts), whatever is missing read in one
    command per round."""
    qualified = f"{function.__module__}.{function.__qualname__}"
    if NEEDS.get(qualified) is not function:
        raise OutsideTheLayer(f"{function.__qualname__} is not a need (decorate it with reads.need)")
    if qualified in LIVE and not acting:
        # Left out of the one reading for what it costs (an interpreter, a login to every
        # peer): a read-only control asking it would cost that on every read-only run.
        raise OutsideTheLayer(f"{function.__qualname__} is asked by action controls only (mark the control action)")
    answers = {} if acting else dict(_SEEDS.get(name, {}))
    for _round in range(ROUNDS + 1):
        reader = Reader(name, settings, answers, inventory)
        try:
            value = function(reader)
        except Pending:
            value = reader  # not done: read what it asked, and ask again
        missing = [c for c in reader.wanted if c not in answers]
        if not missing and value is not reader:
            return value
        if not missing:
            break
        found = _send(backend, missing)
        if not found:
            raise AssertionError(f"{name}: the host did not answer the control's reads")
        answers.update(found)
    raise AssertionError(f"{name}: the control's reads did not settle in {ROUNDS + 1} rounds")


class HostReads:
    """The answers an action control's testinfra host read so far (one per testinfra backend)."""

    def __init__(self, seeded: Mapping[str, tuple[int, bytes, bytes]] | None = None):
        self.paths: dict[str, dict[str, str] | None] = {}
        self.constants: dict[str, CommandResult] = {}
        self.seeded = dict(seeded or {})

    def answer(self, backend: BaseBackend, run, command: str, args: tuple) -> CommandResult:
        sent = backend.get_command(command, *args)  # with host.sudo()'s wrapping, if any
        plain = backend.quote(command, *args)
        # host.sudo() wraps the command (it replaces the backend's get_command): another
        # user's view, asked as it is.
        if backend.sudo or sent != plain:
            return self._forgetting(run, command, args)
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
                out = run(_READ_PATH, path)
                self.paths[path] = self._parse_path(out.rc, out.stdout)
            found = self.paths[path]
            if found is not None:
                return self._result(backend, plain, question["ask"], found)
            return run(command, *args)  # unreadable as one: asked as it is
        return self._forgetting(run, command, args)

    def _forgetting(self, run, command, args) -> CommandResult:
        self.paths.clear()
        return run(command, *args)

    @staticmethod
    def _parse_path(rc: int, stdout: str) -> dict[str, str] | None:
        lines = stdout.split("\n")
        if rc != 0 or len(lines) < 3 or len(lines[0]) != len(_TESTS) or set(lines[0]) - {"0", "1"}:
            return None
        stat = lines[1].split()
        found = {f"test -{t}": lines[0][i] for i, t in enumerate(_TESTS)}
        if len(stat) == len(_STATS):
            found.update(zip(_STATS, stat))
        found["readlink -f"] = found["realpath"] = lines[2]
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
            log.write(
                json.dumps(
                    {
                        "host": backend.get_hostname(),
                        "control": os.environ.get("PYTEST_CURRENT_TEST", ""),
                        "command": backend.get_command(command, *args),
                        "sudo": backend.get_command(command, *args) != backend.quote(command, *args),
                        "action": acting,
                    }
                )
                + "\n"
            )
        return run(command, *args)

    return sent


def backend_name(backend: BaseBackend) -> str:
    """The inventory name of a testinfra backend's host (``@local`` for the local backend)."""
    return "@local" if backend.NAME == "local" else backend.get_hostname()


def sudo_command(backend: BaseBackend, command: str, user: str | None) -> str:
    """``host.sudo()``'s wrapping (testinfra's ``get_sudo_command``), as the reads do it: a
    root login runs the command itself, or as ``user`` through runuser (a root login may
    have no sudo at all: testinfra's own wrapping failed there with "sudo: not found"); any
    other login goes through ``sudo -n`` (no password prompt that would hold the control)."""
    if user is None:
        return backend.quote('$(test "$(id -u)" = 0 || echo sudo -n --) /bin/sh -c %s', command)
    return backend.quote(
        '$(if test "$(id -u)" = 0; then echo runuser -u %s --; else echo sudo -n -u %s --; fi) /bin/sh -c %s',
        user,
        user,
        command,
    )


def install(backend_class) -> None:
    """Route ``backend_class``'s commands through :class:`HostReads` (one per backend), and
    refuse any but the layer's while a read-only control runs; ``host.sudo()`` through
    :func:`sudo_command`."""
    backend_class.get_sudo_command = sudo_command
    run = backend_class.run
    if getattr(run, "sparkrig_reads", False):
        return

    def answered(self, command, *args, **kwargs):
        send = lambda c, *a: run(self, c, *a, **kwargs)  # noqa: E731
        if _sending:
            return (_logged(send, self) if _LOG else send)(command, *args)
        if guarded:
            raise OutsideTheLayer(
                f"a read-only control ran {self.quote(command, *args)[:200]!r} through testinfra's host: "
                "read-only controls read through their needs (tests/compliance/reads.py)"
            )
        reads = self.__dict__.get("_sparkrig_reads")
        if reads is None:
            reads = self.__dict__["_sparkrig_reads"] = HostReads(_SEEDS.get(backend_name(self)))
        return reads.answer(self, _logged(send, self) if _LOG else send, command, args)

    answered.sparkrig_reads = True
    answered.__wrapped__ = run
    backend_class.run = answered
