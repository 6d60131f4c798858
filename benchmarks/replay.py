"""
A STAND-IN for the hosts: their answers, recorded once from real converged hosts, replayed.

``benchmarks/fleet_scale.py`` measures what the controller spends per host at 1 to 256 hosts.
The lab cannot boot 256 hosts, and on this 2-core machine hosts would share the controller's
CPU. So each remote command is answered from a recording made on a real converged lab host:
no network, no SSH, no host CPU, and everything on the controller (pyinfra, sparkrig's
planners and facts, pytest, testinfra, the compliance suite's prefetch and controls) runs as
it does against a fleet. Inventory names ``REAL~N`` are aliases of the recorded host REAL.

Where the transport is cut:

- the deploy (pyinfra): the paramiko client of pyinfra's SSH connector. ``connect`` makes a
  :class:`ReplayClient` instead of opening an SSH connection, and its ``exec_command``
  answers from the recording; pyinfra builds every command (sudo included) and reads the
  output as it does from paramiko. No SSH handshake and no encryption is measured (paramiko's
  share of the controller's cost; ``fleet_scale --real`` measures it on the lab).
  Run: ``python -m benchmarks.replay record|replay FILE -- PYINFRA_ARGS``.
- the compliance suite (pytest plugin ``-p benchmarks.replay`` with ``SPARKRIG_REPLAY=
  record:FILE`` or ``replay:FILE``): testinfra's ``SshBackend.run_ssh``, the call that starts
  one ``ssh`` process per command, and the suite's prefetch (``tests.compliance.reads._read``,
  one ``ssh`` per host and round). Everything above them runs. The ``ssh`` client processes
  themselves are not measured.

A command the recording lacks fails the run loudly (:class:`Unrecorded`, naming the host and
the command): a replay never invents an answer. A recording is JSON: {host: {command:
[exit status, stdout, stderr]}}, outputs as text (pyinfra) or base64 (testinfra, prefetch),
by section.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import sys
import threading
from pathlib import Path

import pluggy  # pytest's marker without pytest: the measured pyinfra process imports this module

ALIAS = "~"  # REAL~N: the N-th alias of the recorded host REAL

# A replay contacts no host, so the reads a real run left for the next one
# (tests/compliance/early.py) are not sent either: they would read the real lab hosts, on the
# controller's cores, while the controller is measured (3.5 s of an 8-host run's wall). Set
# here because a -p plugin is imported before the conftest that sends them.
if os.environ.get("SPARKRIG_REPLAY", "").startswith("replay:"):
    os.environ["SPARKRIG_COMPLIANCE_EARLY"] = "0"


class Unrecorded(RuntimeError):
    """A command that the recording does not hold: the replay cannot answer it."""


def recorded_host(name: str) -> str:
    """The recorded host an inventory name stands for (``lab-deb12~7`` -> ``lab-deb12``)."""
    return name.split(ALIAS, 1)[0]


class Recording:
    """Answers by section ("pyinfra", "testinfra", "prefetch"), host and command."""

    def __init__(self, path: Path | str, recording: bool):
        self.path, self.recording = Path(path), recording
        self.lock = threading.Lock()
        self.data: dict = json.loads(self.path.read_text()) if self.path.exists() and not recording else {}

    def answer(self, section: str, host: str, command: str):
        found = self.data.get(section, {}).get(recorded_host(host), {}).get(command)
        if found is None:
            raise Unrecorded(
                f"replay: {host} ({recorded_host(host)}) has no recorded answer in "
                f"{self.path} [{section}] for: {command}"
            )
        return found

    def add(self, section: str, host: str, command: str, answer) -> None:
        with self.lock:
            self.data.setdefault(section, {}).setdefault(recorded_host(host), {})[command] = answer

    def save(self) -> None:
        if self.recording:
            # A process that records adds to what others (xdist's workers) wrote before it.
            with self.lock, open(self.path.with_name(f".{self.path.name}.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                merged = json.loads(self.path.read_text()) if self.path.exists() else {}
                for section, hosts in self.data.items():
                    for host, answers in hosts.items():
                        merged.setdefault(section, {}).setdefault(host, {}).update(answers)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
                tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
                os.replace(tmp, self.path)


# --- pyinfra ---------------------------------------------------------------------------


class _Lines(list):
    """A paramiko output file as pyinfra reads it: lines to iterate, and the channel's status."""

    def __init__(self, lines, status: int):
        super().__init__(f"{line}\n" for line in lines)
        self.channel = self
        self.status = status

    def recv_exit_status(self) -> int:
        return self.status


class _Stdin:
    def write(self, data) -> None:
        pass

    def close(self) -> None:
        pass


# sparkrig's reading tags its parts with a nonce of the run (sparkrig/reading.py), which the
# host echoes back, inside its base64 output: recorded under NONCE, answered with this run's.
_NONCE = re.compile(r"@@([0-9a-f]{16})")


def without_nonce(command: str) -> tuple[str, str | None]:
    """``command`` with sparkrig's reading nonce replaced by a placeholder, and the nonce."""
    found = _NONCE.search(command)
    return _NONCE.sub("@@NONCE", command), (found[1] if found else None)


def renonced(lines: list[str], old: str | None, new: str | None) -> list[str]:
    """Recorded output lines as the host would print them for nonce ``new`` (base64 lines too)."""
    if not old or not new or old == new:
        return lines
    out = []
    for line in lines:
        try:
            text = base64.b64decode(line, validate=True)
        except ValueError:
            out.append(line.replace(old, new))
            continue
        out.append(
            base64.b64encode(text.replace(old.encode(), new.encode())).decode() if old.encode() in text else line
        )
    return out


class ReplayClient:
    """Stands in for paramiko's SSHClient of one host: ``exec_command`` from the recording."""

    def __init__(self, recording: Recording, host: str):
        self.recording, self.host = recording, host

    def exec_command(self, command: str, get_pty: bool = False):
        key, nonce = without_nonce(command)
        status, stdout, stderr, recorded = self.recording.answer("pyinfra", self.host, key)
        return (
            _Stdin(),
            _Lines(renonced(stdout, recorded, nonce), status),
            _Lines(renonced(stderr, recorded, nonce), status),
        )

    def get_transport(self):
        """The connection's far end, as recorded (the cluster concern asks which address the
        deploy arrives at)."""
        return self

    def getpeername(self):
        return tuple(self.recording.answer("peer", self.host, "getpeername"))

    def close(self) -> None:
        pass


class _Tee:
    """A real paramiko output file whose lines and exit status are also recorded."""

    def __init__(self, real, sink: list):
        self.real, self.sink, self.channel = real, sink, self

    def __iter__(self):
        for line in self.real:
            self.sink.append(line.rstrip("\n") if isinstance(line, str) else line.decode().rstrip("\n"))
            yield line

    def recv_exit_status(self) -> int:
        return self.real.channel.recv_exit_status()


def install_pyinfra(recording: Recording) -> None:
    """pyinfra's SSH connector records into, or answers from, ``recording``."""
    from pyinfra.connectors.ssh import SSHConnector  # noqa: PLC0415 - after pyinfra_cli, which patches for gevent

    if not recording.recording:

        def connect(self) -> None:
            self.client = ReplayClient(recording, self.host.name)

        def put_file(self, *args, **kwargs):
            raise Unrecorded(f"replay: {self.host.name}: a file upload in a run that should change nothing")

        SSHConnector.connect = connect
        SSHConnector.put_file = put_file
        return

    real_connect = SSHConnector._connect

    def recording_connect(self) -> None:
        real_connect(self)
        client, name = self.client, self.host.name
        recording.add("peer", name, "getpeername", list(client.get_transport().getpeername()))
        real_exec = client.exec_command

        def exec_command(command, get_pty=False, **kwargs):
            stdin, stdout, stderr = real_exec(command, get_pty=get_pty, **kwargs)
            out, err = [], []

            def status():
                code = stdout.channel.recv_exit_status()
                key, nonce = without_nonce(command)
                recording.add("pyinfra", name, key, [code, out, err, nonce])
                return code

            tee_out = _Tee(stdout, out)
            tee_out.recv_exit_status = status
            return stdin, tee_out, _Tee(stderr, err)

        client.exec_command = exec_command

    SSHConnector._connect = recording_connect


def pyinfra_main(argv: list[str]) -> int:
    """``record|replay FILE -- PYINFRA_ARGS``: pyinfra's own command line, its SSH recorded
    or replayed."""
    mode, path, *rest = argv
    if mode not in ("record", "replay") or rest[:1] != ["--"]:
        raise SystemExit("usage: python -m benchmarks.replay record|replay FILE -- PYINFRA_ARGS")
    from pyinfra_cli.main import main as pyinfra  # noqa: PLC0415 - first: it patches the standard library for gevent

    recording = Recording(path, mode == "record")
    install_pyinfra(recording)
    sys.argv = ["pyinfra", *rest[1:]]
    try:
        pyinfra()
    except SystemExit as done:
        recording.save()
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    recording.save()
    return 0


# --- the compliance suite (a pytest plugin) --------------------------------------------


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def install_testinfra(recording: Recording) -> None:
    """testinfra's SSH backend and the suite's prefetch record into, or answer from, ``recording``."""
    # Not at the top: the measured pyinfra process imports this module and needs neither.
    from testinfra.backend.ssh import SshBackend  # noqa: PLC0415

    from tests.compliance import reads  # noqa: PLC0415

    run_ssh, read = SshBackend.run_ssh, reads._read

    def replayed_run_ssh(self, command: str):
        name = self.get_hostname()
        if recording.recording:
            out = run_ssh(self, command)
            recording.add("testinfra", name, command, [out.rc, _encode(out.stdout_bytes), _encode(out.stderr_bytes)])
            return out
        rc, out, err = recording.answer("testinfra", name, command)
        return self.result(rc, self.encode(command), base64.b64decode(out), base64.b64decode(err))

    def replayed_read(ssh_config: str, name: str, commands: list[str]):
        if recording.recording:
            found = read(ssh_config, name, commands)
            for command, (rc, out, err) in found.items():
                recording.add("prefetch", name, command, [rc, _encode(out), _encode(err)])
            return found
        answers = {}
        for command in commands:
            rc, out, err = recording.answer("prefetch", name, command)
            answers[command] = (rc, base64.b64decode(out), base64.b64decode(err))
        return answers

    SshBackend.run_ssh = replayed_run_ssh
    reads._read = replayed_read


_SUITE: Recording | None = None


# First: the suite's conftest starts its prefetch in a thread from its own pytest_configure, and
# a prefetch that began before the transport was cut read the real hosts (at times: a race).
@pluggy.HookimplMarker("pytest")(tryfirst=True)
def pytest_configure(config) -> None:
    global _SUITE
    mode, _, path = os.environ.get("SPARKRIG_REPLAY", "").partition(":")
    if mode not in ("record", "replay") or not path:
        raise SystemExit("benchmarks.replay as a pytest plugin needs SPARKRIG_REPLAY=record:FILE or replay:FILE")
    if _SUITE is None:
        _SUITE = Recording(path, mode == "record")
        install_testinfra(_SUITE)


def pytest_unconfigure(config) -> None:
    if _SUITE is not None:
        _SUITE.save()


if __name__ == "__main__":
    sys.exit(pyinfra_main(sys.argv[1:]))
