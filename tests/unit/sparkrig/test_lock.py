"""
The deploy lock: its shell run by real sh, and where pyinfra's execution puts it.

The shell tests tie the lock to a STAND-IN for a run's sshd session process: a copy of
sh named ``sshd`` (so its comm is what the lock looks for), holding SSH_CONNECTION as
sshd hands it to a session, which runs the lock's command and then waits.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import signal
import stat
import subprocess
import time

import pytest
from pyinfra import host
from pyinfra.api import Config, Inventory, State
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.api.command import StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy, deploy
from pyinfra.api.operation import operation
from pyinfra.api.operations import run_ops
from pyinfra.connectors.util import make_unix_command
from pyinfra.context import ctx_state

from sparkrig import lock
from sparkrig.operations import install

util_linux = pytest.mark.skipif(
    not (shutil.which("flock") and shutil.which("setsid")), reason="flock and setsid (util-linux) are needed"
)

SINCE = r"since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class Session:
    """A STAND-IN sshd session (a copy of sh named sshd) that runs the lock's command."""

    def __init__(self, tmp_path, lock_file, client: str, wait_s: int = 1):
        standin = tmp_path / "sshd"
        if not standin.exists():
            shutil.copy("/bin/sh", standin)
        self.process = subprocess.Popen(
            [str(standin), "-c", 'sh -c "$TAKE" sh "$LOCK" "$WAIT"; echo "rc=$?" >&2; exec sleep 600'],
            env={
                "TAKE": lock.TAKE,
                "LOCK": str(lock_file),
                "WAIT": str(wait_s),
                "SSH_CONNECTION": f"{client} 22",
                "PATH": os.environ["PATH"],
            },
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = []
        while not (lines and lines[-1].startswith("rc=")):
            lines.append(self.process.stderr.readline().rstrip("\n"))
        self.returncode = int(lines[-1][3:])
        self.stderr = "\n".join(lines[:-1])

    def end(self):
        """The connection ends: the session process exits."""
        self.process.kill()
        self.process.wait()


def held(lock_file) -> bool:
    return subprocess.run(["flock", "-n", str(lock_file), "true"]).returncode != 0


def until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.fixture
def sessions(tmp_path):
    started: list[Session] = []

    def start(client: str, wait_s: int = 1) -> Session:
        session = Session(tmp_path, tmp_path / "deploy.lock", client, wait_s)
        started.append(session)
        return session

    yield start
    for session in started:
        session.end()


@util_linux
def test_a_free_lock_is_taken_and_held_after_the_command_ends(tmp_path, sessions):
    lock_file = tmp_path / "deploy.lock"
    first = sessions("10.0.0.1 41111 10.0.0.2")
    assert first.returncode == 0, first.stderr
    info = lock_file.read_text()
    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    assert re.fullmatch(
        rf"{me} from 10\.0\.0\.1 port 41111 \(sshd pid {first.process.pid}\), {SINCE}; lock holder pid \d+\n", info
    ), info
    assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600
    assert held(lock_file), "the lock's command returned and nothing holds the lock"


@util_linux
def test_a_live_holder_refuses_the_second_run_naming_the_first(tmp_path, sessions):
    lock_file = tmp_path / "deploy.lock"
    first = sessions("10.0.0.1 41111 10.0.0.2")
    assert first.returncode == 0, first.stderr
    started = time.monotonic()
    second = sessions("10.0.0.3 43333 10.0.0.2", wait_s=1)
    assert second.returncode == 1
    assert time.monotonic() - started >= 1, "refused without waiting for an ending run"
    assert re.search(
        rf"^sparkrig: another deploy is changing this host: \S+ from 10\.0\.0\.1 port 41111 "
        rf"\(sshd pid {first.process.pid}\), {SINCE}; lock holder pid \d+; this run leaves the host alone",
        second.stderr,
    ), second.stderr
    assert "10.0.0.3" not in lock_file.read_text(), "the refused run overwrote the holder's name"


@util_linux
def test_the_lock_is_free_once_the_first_runs_session_is_gone(tmp_path, sessions):
    lock_file = tmp_path / "deploy.lock"
    first = sessions("10.0.0.1 41111 10.0.0.2")
    assert first.returncode == 0, first.stderr
    first.end()  # the connection is cut: its session process exits, the holder follows
    assert until(lambda: not held(lock_file), 3.0), "the dead run's holder still holds the lock"
    third = sessions("10.0.0.5 45555 10.0.0.2")
    assert third.returncode == 0, third.stderr
    assert "from 10.0.0.5 port 45555" in lock_file.read_text()


@util_linux
def test_the_lock_is_free_once_its_holder_is_killed(tmp_path, sessions):
    lock_file = tmp_path / "deploy.lock"
    first = sessions("10.0.0.1 41111 10.0.0.2")
    assert first.returncode == 0, first.stderr
    holder = int(re.search(r"lock holder pid (\d+)", lock_file.read_text()).group(1))
    os.kill(holder, signal.SIGKILL)
    assert until(lambda: not held(lock_file), 2.0)
    assert sessions("10.0.0.5 45555 10.0.0.2").returncode == 0


@util_linux
@pytest.mark.parametrize("plant", ["symlink", "mode 644", "fifo"])
def test_a_planted_lock_file_is_refused(tmp_path, sessions, plant):
    lock_file = tmp_path / "deploy.lock"
    target = tmp_path / "target"
    target.write_text("keep\n")
    target.chmod(0o600)
    if plant == "symlink":
        lock_file.symlink_to(target)
    elif plant == "mode 644":
        lock_file.write_text("")
        lock_file.chmod(0o644)
    else:
        os.mkfifo(lock_file)
    run = sessions("10.0.0.1 41111 10.0.0.2")
    assert run.returncode == 1
    assert run.stderr.startswith("sparkrig: ") and "refusing" in run.stderr, run.stderr
    assert target.read_text() == "keep\n"


# Where pyinfra's execution puts it ------------------------------------------------------


@operation()
def _noop():
    host.noop("nothing to do")
    return
    yield


@operation()
def _writes(*commands: str):
    yield from commands


def _run(ops, busy: bool = False):
    """Execute ``ops`` (name -> commands; none: a no-change operation) on a @fake host,
    ``spark``, with the deploy lock on, as pyinfra's CLI does. With ``busy``, a second
    host, ``busy``, finds its lock taken. Each host's commands as sent (the lock's as
    "lock"), and the failed hosts."""
    refused = {lock.LOCK: {"success": False, "stderr": "sparkrig: another deploy is changing this host: ..."}}
    fake = {"fake_delay": 0, "fake_delay_jitter": 0}
    hosts = [("@fake/spark", dict(fake))] + [("@fake/busy", {**fake, "fake_responses": refused})] * busy
    inventory = Inventory((hosts, {}))
    state = State()
    lock.lock_on(state)  # as config.py does, before the CLI initialises the state
    state.init(inventory, Config())
    connect_all(state)

    @deploy("lock test")
    def lock_test():
        for name, commands in ops.items():
            _writes(*commands, name=name) if commands else _noop(name=name)

    add_deploy(state, lock_test)
    run_ops(state)
    sent = {
        each.name.removeprefix("@fake/"): [
            "lock" if lock.LOCK in command else command for command in each.connector.executed_commands
        ]
        for each in inventory
    }
    return sent, sorted(each.name.removeprefix("@fake/") for each in state.failed_hosts)


def test_a_no_change_run_sends_nothing_and_takes_no_lock():
    assert _run({"a": (), "b": ()}) == ({"spark": []}, [])


def test_the_lock_comes_once_before_the_first_command_sent():
    sent, failed = _run({"a": (), "b": ("echo b1", "echo b2"), "c": (), "d": ("echo d",)})
    assert (sent, failed) == ({"spark": ["lock", "echo b1", "echo b2", "echo d"]}, [])


def test_a_refused_lock_stops_that_host_before_its_first_write_and_others_go_on():
    sent, failed = _run({"a": ("echo a",), "b": ("echo b",)}, busy=True)
    assert (sent, failed) == ({"spark": ["lock", "echo a", "echo b"], "busy": ["lock"]}, ["busy"])


def test_the_lock_is_taken_as_root():
    assert lock.take_lock().connector_arguments == {"_sudo": True}


def test_every_command_a_run_sends_starts_in_slash():
    """config.py's one call (sparkrig.operations.install, its hooks) gives every host
    `_chdir="/"`: pyinfra puts `cd /` inside the shell that sudo starts, for facts and
    operations alike (their global arguments' default)."""
    inventory = Inventory(([("@fake/spark", {"_sudo": True})], {}))
    state = State()
    with ctx_state.use(state):
        install()  # as config.py does
    state.init(inventory, Config())
    host = inventory.get_host("@fake/spark")
    arguments, _ = pop_global_arguments(state, host, {})
    taken = inspect.signature(make_unix_command).parameters
    connector = {key: value for key, value in arguments.items() if key in taken}
    command = make_unix_command(StringCommand("python3 -I -c pass"), **connector).get_raw_value()
    assert command == "sudo -H -n sh -c 'cd / && python3 -I -c pass'"
