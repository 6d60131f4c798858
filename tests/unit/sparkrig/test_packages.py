"""Debian packages: one command that waits for the dpkg/apt locks, then installs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig import packages
from sparkrig.settings import problems

LOCK_HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "w")
fcntl.lockf(f, fcntl.LOCK_EX)      # a POSIX record lock, as apt and dpkg take
print("locked", flush=True)
time.sleep(60)
"""


def _wait(lock, timeout_s: int) -> subprocess.CompletedProcess[str]:
    """Run the lock-wait script in a real sh against one lock file."""
    return subprocess.run(
        ["sh", "-c", packages.WAIT_FOR_LOCKS, "wait", str(timeout_s), str(lock)],
        capture_output=True,
        text=True,
        timeout=30,
    )


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
    waiting = subprocess.Popen(
        ["sh", "-c", packages.WAIT_FOR_LOCKS, "wait", "20", str(lock)], stderr=subprocess.PIPE, text=True
    )
    time.sleep(1.5)
    holder.kill()
    holder.wait()
    assert waiting.wait(timeout=20) == 0


def test_the_command_waits_completes_dpkg_updates_then_installs():
    command = packages.install_command(["earlyoom", "docker-cli"], 300).get_raw_value()
    assert command.startswith("sh -c ")
    wait, _, rest = command.partition(" sparkrig-wait-for-apt 300 ")
    assert rest.startswith(" ".join(packages.LOCKS) + " && ")
    steps = rest.split(" && DEBIAN_FRONTEND=")[1:]
    complete = f"noninteractive sh -c {shlex.quote(packages.COMPLETE_DPKG)} sparkrig-complete-dpkg "
    assert steps[0].startswith(complete) and steps[0].endswith(
        "apt-get -q -y -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
    )
    assert ["DEBIAN_FRONTEND=" + step for step in steps[1:]] == [
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


def _complete_dpkg(tmp_path, first_configure: int, statuses: str, journal: bool = False) -> tuple[int, list[str]]:
    """Run COMPLETE_DPKG with STAND-IN dpkg, dpkg-query and apt-get that record their calls:
    the first `dpkg --configure -a` exits ``first_configure``, later ones 0. With ``journal``,
    dpkg's journal is pending: apt-get refuses to run until dpkg --configure -a has."""

    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    scripts = {
        "dpkg": f'echo "dpkg $*" >> {log}; [ -e {tmp_path}/configured ] && exit 0; '
        f"touch {tmp_path}/configured; exit {first_configure}",
        "dpkg-query": f"printf '{statuses}'",
        "apt-get": f'echo "apt-get $*" >> {log}; '
        f"if [ -e {tmp_path}/journal ] && [ ! -e {tmp_path}/configured ]; then "
        'echo "E: dpkg was interrupted, you must manually run dpkg --configure -a" >&2; exit 100; fi',
    }
    if journal:
        (tmp_path / "journal").touch()
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    result = subprocess.run(
        ["sh", "-c", packages.COMPLETE_DPKG, "sparkrig-complete-dpkg", "apt-get", "-y"],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
    )
    return result.returncode, log.read_text().splitlines() if log.exists() else []


def test_a_clean_dpkg_costs_one_configure(tmp_path):
    assert _complete_dpkg(tmp_path, 0, "ii  earlyoom\\niU  half-configured-is-dpkgs-job\\n") == (
        0,
        ["dpkg --configure -a"],
    )


def test_a_package_half_unpacked_by_a_power_cut_is_reinstalled_then_configured(tmp_path):
    """dpkg --configure -a passes over it (exit 0), and the install after it fails on it
    ("package is in a very bad inconsistent state"): apt reinstalls it first."""
    status, calls = _complete_dpkg(tmp_path, 0, "ii  python3\\niHR python3.11-venv\\nrU  x\\n")
    assert status == 0
    assert calls == [
        "dpkg --configure -a",
        "apt-get -y update",
        "apt-get -y install --reinstall python3.11-venv",
        "dpkg --configure -a",
    ]


@pytest.mark.parametrize("first_configure", [0, 1])
def test_a_half_unpacked_package_and_a_pending_journal_are_both_settled(tmp_path, first_configure):
    """A power cut mid-unpack leaves dpkg's journal pending too: apt refuses to run until dpkg
    has replayed it (which may fail on what depends on the broken package), then reinstalls."""
    status, calls = _complete_dpkg(tmp_path, first_configure, "iHR python3.11-venv\\n", journal=True)
    assert status == 0
    assert calls == [
        "dpkg --configure -a",
        "apt-get -y update",
        "apt-get -y install --reinstall python3.11-venv",
        "dpkg --configure -a",
    ]


# Candidates ---------------------------------------------------------------------------------

# Recorded: `LC_ALL=C apt-cache policy -- fwupd` on a Debian 12 box (the
# development machine, 2026-11-28); for a package it cannot locate apt prints nothing.
POLICY = (Path(__file__).parents[1] / "operations/data/fwupd/apt-cache-policy-fwupd-debian12.txt").read_text()


def test_candidates_read_apts_candidate_and_none_where_apt_has_none():
    found = packages.Candidates().process(POLICY.splitlines())
    assert found == {"fwupd": "2.0.20-1~deb12u2"}
    assert packages.Candidates().process([]) == {}
    pinned_away = POLICY.replace("Candidate: 2.0.20-1~deb12u2", "Candidate: (none)")
    assert packages.Candidates().process(pinned_away.splitlines()) == {"fwupd": None}


@pytest.mark.parametrize("bad", ["  Candidate: 1.0\x1b[2J", "fw\x07upd:", "  Candidate: 1.0; reboot"])
def test_candidates_refuse_control_characters_and_what_is_no_version(bad):
    with pytest.raises(FactProcessError):
        packages.Candidates().process(["fwupd:", bad])
