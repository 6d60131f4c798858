"""
Two deploys at once on one host: the second fails that host, naming the first, and the
first converges; a run killed mid-way blocks no later run.

Real `pyinfra` runs on lab-deb12, each with a change to make (`--data cuda_env_extra=…`).
The first is stopped (SIGSTOP to its process group) right after its lock command
returned, so it holds the lock, its SSH connection open, while the second runs; then it
goes on. The host is left with the default settings, as the converge made it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

import lab
from sparkrig.lock import LOCK
from tests.conftest import LAB_INVENTORY
from tests.support import PYINFRA, REPO, DeployResult, inventory_host_data, run_deploy

pytestmark = pytest.mark.lab

HOST = "lab-deb12"
ENV_FILE = "/etc/sparkrig/cuda.env"


def extra(value: str) -> tuple[str, ...]:
    """pyinfra arguments that limit a run to HOST with a change to make there."""
    return ("--limit", HOST, "--data", "cuda_env_extra=" + json.dumps({"SPARKRIG_LOCK_TEST": value}))


class StoppedDeploy:
    """A deploy started in its own process group and stopped as soon as its lock command
    returned on HOST: from then on it holds HOST's lock with its SSH connection open."""

    def __init__(self, value: str):
        self.process = subprocess.Popen(
            [PYINFRA, "-y", "--json", "--debug", *extra(value), LAB_INVENTORY, "deploy.py"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        log = []
        sent = False
        for line in self.process.stderr:
            log.append(line)
            if f"Running command on {HOST}" in line:
                sent = False
            if f"sh {LOCK} " in line:
                sent = True
            if sent and "Command exit status:" in line:
                os.killpg(self.process.pid, signal.SIGSTOP)
                assert line.split()[-1] == "0", "".join(log[-40:])
                break
        else:
            pytest.fail("the deploy ended without taking the lock:\n" + "".join(log[-60:]))
        self.log = "".join(log)

    def connection(self, address: str) -> tuple[str, str]:
        """The controller's address and port of this deploy's SSH connection to HOST (at ``address``)."""
        sockets = subprocess.run(
            ["ss", "-tnpH", "state", "established", "dst", f"{address}:22"], capture_output=True, text=True, check=True
        ).stdout
        mine = [line.split()[2] for line in sockets.splitlines() if f"pid={self.process.pid}," in line]
        assert len(mine) == 1, sockets
        return tuple(mine[0].rsplit(":", 1))

    def resume(self) -> DeployResult:
        os.killpg(self.process.pid, signal.SIGCONT)
        stdout, stderr = self.process.communicate(timeout=600)
        try:
            report = json.loads(stdout)
        except json.JSONDecodeError:
            report = None
        return DeployResult(self.process.returncode, report, self.log + stderr + stdout * (report is None))

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.communicate(timeout=60)


def env_value() -> str:
    found = lab.run_ssh(HOST, f"grep -h '^SPARKRIG_LOCK_TEST=' {ENV_FILE} || true").stdout.strip()
    return found.partition("=")[2]


@pytest.fixture
def back_to_default(first_converge):
    assert first_converge.returncode == 0, "the first converge failed; see its test"
    yield
    restore = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert restore.returncode == 0 and restore.errors() == {}, restore.log
    assert env_value() == ""


def test_a_second_deploy_fails_the_host_naming_the_first_which_converges(back_to_default):
    first = StoppedDeploy("first")
    try:
        data = inventory_host_data(LAB_INVENTORY, [HOST])[HOST]
        address, port = first.connection(data["ssh_hostname"])
        second = run_deploy(LAB_INVENTORY, *extra("second"), timeout=300)
    finally:
        result = first.resume()

    # HOST was the run's only host: pyinfra ends with "No hosts remaining!" and no report.
    assert second.returncode != 0, second.log
    # (pyinfra pads "[HOST]" to the inventory's longest name.)
    assert re.search(rf"\[{HOST}\] +Error: executed 0 commands", second.log), second.log
    named = re.search(
        rf"\[{HOST}\] +sparkrig: another deploy is changing this host: (.*?); "
        "this run leaves the host alone",
        second.log,
    )
    assert named, second.log
    assert re.fullmatch(
        rf"{data['ssh_user']} from {re.escape(address)} port {port} \(sshd(-session)? pid \d+\), "
        r"since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; lock holder pid \d+",
        named.group(1),
    ), named.group(1)

    assert result.returncode == 0 and result.errors() == {}, result.log
    assert HOST in result.changed(), result.log
    assert env_value() == "first"

    third = run_deploy(LAB_INVENTORY, *extra("first"))
    assert third.returncode == 0, third.log
    assert third.changed() == {}, third.log


def test_a_deploy_killed_mid_way_does_not_block_the_next(back_to_default):
    killed = StoppedDeploy("killed")
    killed.kill()  # its SSH connection closes with it; the host still runs its holder
    after = run_deploy(LAB_INVENTORY, *extra("afterkill"), timeout=300)
    assert after.returncode == 0 and after.errors() == {}, after.log
    assert HOST in after.changed(), after.log
    assert env_value() == "afterkill"
