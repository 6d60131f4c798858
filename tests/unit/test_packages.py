"""Debian packages: one command that waits for the dpkg/apt locks, then installs."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from operations import packages
from operations.settings import problems

LOCK_HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "w")
fcntl.lockf(f, fcntl.LOCK_EX)      # a POSIX record lock, as apt and dpkg take
print("locked", flush=True)
time.sleep(60)
"""


def _wait(lock, timeout_s: int) -> subprocess.CompletedProcess[str]:
    """Run the lock-wait script in a real sh against one lock file."""
    return subprocess.run(["sh", "-c", packages.WAIT_FOR_LOCKS, "wait", str(timeout_s), str(lock)],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def held_lock(tmp_path):
    lock = tmp_path / "lock-frontend"
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    yield lock, holder
    holder.kill()
    holder.wait()


def test_a_free_lock_passes_at_once(tmp_path):
    lock = tmp_path / "lock-frontend"
    lock.touch()
    result = _wait(lock, 5)
    assert result.returncode == 0 and result.stderr == ""


def test_a_missing_lock_file_is_free(tmp_path):
    assert _wait(tmp_path / "absent", 0).returncode == 0


def test_a_held_lock_fails_after_the_timeout_naming_its_holder(held_lock):
    lock, holder = held_lock
    started = time.monotonic()
    result = _wait(lock, 2)
    assert time.monotonic() - started >= 2
    assert result.returncode == 75
    assert f"{lock} is held by process {holder.pid} (python" in result.stderr
    assert "still after 2 s (packages_dpkg_lock_timeout_s)" in result.stderr
    assert "waiting for the package manager" in result.stderr


def test_a_lock_released_while_waiting_lets_the_install_go_on(held_lock):
    lock, holder = held_lock
    waiting = subprocess.Popen(["sh", "-c", packages.WAIT_FOR_LOCKS, "wait", "20", str(lock)],
                               stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    holder.kill()
    holder.wait()
    assert waiting.wait(timeout=20) == 0


def test_the_command_waits_completes_dpkg_updates_then_installs():
    command = packages.install_command(["earlyoom", "docker-cli"], 300).get_raw_value()
    assert command.startswith("sh -c ")
    wait, _, rest = command.partition(" sparkrig-wait-for-apt 300 ")
    assert rest.startswith(" ".join(packages.LOCKS) + " && ")
    steps = rest.split(" && ")[1:]
    assert steps == [
        "DEBIAN_FRONTEND=noninteractive dpkg --configure -a",
        "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 update",
        "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 "
        "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install "
        "--no-install-recommends earlyoom docker-cli",
    ]


def test_no_missing_package_refreshes_the_lists_only():
    command = packages.install_command([], 60).get_raw_value()
    assert command.endswith("DPkg::Lock::Timeout=60 update")


def test_package_names_are_quoted():
    command = packages.install_command(["a;rm -rf /"], 60).get_raw_value()
    assert command.endswith("install --no-install-recommends 'a;rm -rf /'")


@pytest.mark.parametrize("bad", [-1, 3601, "300", True, 1.5])
def test_a_bad_timeout_is_refused_naming_the_key(bad):
    found = problems(packages.SETTINGS, {"packages_dpkg_lock_timeout_s": bad})
    assert found == [f"packages_dpkg_lock_timeout_s = {bad!r}: allowed is an integer from 0 to 3600 (seconds)"]
