"""
Each host's reads, every round of them, sent as the suite starts, before it is loaded.

Half a second of a read-only run went to importing the suite (pyinfra, every concern's
settings) and loading the inventory before the first round of a host's reads could be planned
and sent; the round then took a second more, and a second round (reads planned from the
first's answers: the unit sshd runs as, where CUDA_HOME points) another round trip. What a
host's rounds read depends on its settings, the suite's code and, for the later rounds, the
host's state, so on a converged host it is the same run after run: each run leaves, per
inventory and --limit, each host's reads (all its rounds'), the one script that reads them
and the SSH config it went through in the user's private directory (the one of the suite's
SSH sockets, 0700), and the next run sends those scripts as soon as it starts (:func:`start`,
from the first conftest, before any heavy import), when the inventory file and the SSH config
are still byte for byte what they were.

When the suite has planned its own first round (``reads._read``), it takes the early answer
only if the script is the one it would send for those reads, byte for byte (the same reads,
order and limits), the reads include every read it planned, and it came through the same SSH
config; else that answer's process is killed and the round sent as always. The answers to the
reads it has not planned yet answer its later rounds where they plan the same reads; a read no
round plans is left unused. An early answer is read at the suite's start too: the prefetch's
rule holds.
``SPARKRIG_COMPLIANCE_EARLY=0`` sends nothing early (the benchmarks time the rounds alone).
Residual: a host's address changed by its group data, not by the inventory file, receives one
early read-only round at the old address before the run drops its answer.

Imports nothing heavy: it runs before pytest loads the suite.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import json
import os
import stat
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

CONNECT_TIMEOUT_S = 10  # an unreachable host delays the suite's start by this much at most
CACHE_BYTES = 16 << 20  # the early reads' file at most (a host's reads and script: tens of KB)
# Sent early: (ssh config, host) -> (the script, the reads it answers, its ssh process).
_SENT: dict[tuple[str, str], tuple[str, list[str], subprocess.Popen]] = {}


def argv(ssh_config: str, name: str, script: str) -> list[str]:
    """ssh's command line for one round of ``name``'s reads."""
    return ["ssh", "-F", ssh_config, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", name, script]


def directory() -> Path:
    """The user's private directory of the suite's SSH sockets and early reads (the
    conftest's ``control_dir`` makes and checks it)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "sparkrig-ssh" if runtime else Path.home() / ".cache" / "sparkrig" / "ssh"


def _file(inventory: str, limit: Sequence[str]) -> Path:
    key = json.dumps([os.path.realpath(inventory), list(limit)])
    return directory() / f"early-reads-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _private(path: Path, directory: bool) -> bool:
    """Whether ``path`` is this user's alone: a directory (or a regular file), no link, no
    access for anyone else."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    return kind(found.st_mode) and found.st_uid == os.geteuid() and not found.st_mode & 0o077


def options(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The ``--inventory`` and the ``--limit``s of a pytest command line."""
    inventory, limit, args = None, [], list(args)
    for index, arg in enumerate(args):
        for option in ("--inventory", "--limit"):
            value = None
            if arg == option and index + 1 < len(args):
                value = args[index + 1]
            elif arg.startswith(option + "="):
                value = arg.split("=", 1)[1]
            if value is None:
                continue
            if option == "--inventory":
                inventory = value
            else:
                limit.append(value)
    return inventory, limit


def start(args: Sequence[str]) -> None:
    """Send each host's reads as the last run of this inventory and --limit left them
    (``args``: pytest's command line), where the inventory file and the SSH config are
    unchanged; nothing for a run without --inventory, nor in an xdist worker."""
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("SPARKRIG_COMPLIANCE_EARLY") == "0":
        return
    inventory, limit = options(args)
    if not inventory:
        return
    path = _file(inventory, limit)
    if not _private(path.parent, directory=True) or not _private(path, directory=False):
        return
    try:
        if path.stat().st_size > CACHE_BYTES:
            return
        found = json.loads(path.read_text())
        ssh_config, hosts = str(found["ssh_config"]), dict(found["hosts"])
        if found["inventory"] != _digest(inventory) or found["config"] != _digest(ssh_config):
            return
    except (OSError, ValueError, KeyError, TypeError):
        return
    for name, sent in hosts.items():
        script, reads = (sent.get("script"), sent.get("reads")) if isinstance(sent, dict) else (None, None)
        if not isinstance(script, str) or not isinstance(reads, list) or not all(isinstance(r, str) for r in reads):
            continue
        if name == "@local" or (ssh_config, name) in _SENT:
            continue
        try:
            process = subprocess.Popen(
                argv(ssh_config, name, script),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        except OSError:
            return
        if not _SENT:
            atexit.register(drop)  # a run that never took them (stopped, or another suite's)
        _SENT[(ssh_config, name)] = (script, reads, process)


def collect_later(args: Sequence[str]) -> None:
    """A run against hosts (``--inventory`` or ``--hosts`` in ``args``: pytest's command line)
    collects no garbage while it starts. Its imports and its collection make objects that live
    as long as the run, and a full collection among them walked them all for little (82 ms
    for 30 objects, in a one-host run of 1.7 s). The suite's conftest freezes what they made
    and collects again once the controls are collected."""
    inventory, _limit = options(args)
    if inventory or any(arg == "--hosts" or arg.startswith("--hosts=") for arg in args):
        gc.disable()


def take(
    ssh_config: str, name: str, covers: Callable[[str, list[str]], bool]
) -> tuple[subprocess.Popen, list[str]] | None:
    """The process that sent ``name`` its reads early through ``ssh_config``, and those reads,
    where ``covers(script, reads)`` (the suite's judgement: the script is the one it sends for
    those reads, and they include the round it planned); any other early round is ended."""
    sent = _SENT.pop((ssh_config, name), None)
    if sent is None:
        return None
    script, reads, process = sent
    if covers(script, reads):
        return process, reads
    _end(process)
    return None


def drop(pairs: Iterable[tuple[str, str]] | None = None) -> None:
    """End the early rounds no one took (all of them by default)."""
    for key in list(_SENT if pairs is None else pairs):
        sent = _SENT.pop(key, None)
        if sent is not None:
            _end(sent[2])


def _end(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()
    process.stdout.close()


def remember(
    inventory: str, limit: Sequence[str], ssh_config: str, rounds: Mapping[str, tuple[str, Sequence[str]]]
) -> None:
    """Keep ``rounds`` (each host's reads of this run, every round's, and the one script that
    reads them) for the next run of this inventory and --limit, written atomically, 0600, in
    :func:`directory` (made and checked by the conftest's ``control_dir`` before)."""
    path = _file(inventory, limit)
    if not _private(path.parent, directory=True):
        return
    text = json.dumps(
        {
            "inventory": _digest(inventory),
            "ssh_config": ssh_config,
            "config": _digest(ssh_config),
            "hosts": {name: {"script": script, "reads": list(reads)} for name, (script, reads) in rounds.items()},
        }
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
