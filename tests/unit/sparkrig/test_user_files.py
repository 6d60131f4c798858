"""The one reader of a path a user controls (sparkrig.user_files), run for real here by dash:
each test plays the user who controls part of the path, or the fault."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from sparkrig import user_files

AS_ROOT = os.geteuid() == 0 and shutil.which("runuser") is not None


@pytest.fixture
def shared_dir():
    """A directory others may enter (pytest's tmp_path is root's alone): the owner's
    directory goes in it."""
    path = Path(tempfile.mkdtemp(prefix="sparkrig-read-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _as_owner(owner_dir: Path, *argv: str) -> None:
    """``argv`` run by the directory's owner: nobody, where this runs as root."""
    if AS_ROOT:
        shutil.chown(owner_dir, "nobody")
        subprocess.run(["runuser", "-u", "nobody", "--", *argv], check=True)
    else:
        subprocess.run(list(argv), check=True)


def _read(path, limit: int = 1 << 20, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["dash", "-c", user_files.user_read(shlex.quote(str(path)), limit)], capture_output=True, timeout=30, env=env
    )


def test_a_link_in_a_middle_directory_the_owner_controls_reads_as_missing(shared_dir):
    """The owner of ``owner/`` replaces ``owner/entry`` (a directory root reads a file in)
    by a link to a directory only root may read: root reads nothing of it, says why."""
    secret = shared_dir / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "stamp.json").write_text("SECRET\n")
    owner = shared_dir / "owner"
    owner.mkdir()
    (owner / "entry").mkdir()
    (owner / "entry" / "stamp.json").write_text("theirs\n")
    assert _read(owner / "entry" / "stamp.json").stdout == b"theirs\n"
    _as_owner(owner, "sh", "-c", 'mv "$1/entry" "$1/old" && ln -s "$2" "$1/entry"', "plant", str(owner), str(secret))
    run = _read(owner / "entry" / "stamp.json")
    assert (run.returncode, run.stdout) == (1, b""), run
    assert b"has a link on its way" in run.stderr
    # Higher up too: a link as the first directory of the path.
    (shared_dir / "top").symlink_to(owner / "old")
    assert (_read(shared_dir / "top" / "stamp.json").returncode, _read(shared_dir / "top" / "stamp.json").stdout) == (
        1,
        b"",
    )


def test_a_relative_path_is_never_read(tmp_path):
    (tmp_path / "f").write_text("x\n")
    run = subprocess.run(
        ["dash", "-c", f"cd {shlex.quote(str(tmp_path))} && " + user_files.user_read("f", 100)],
        capture_output=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout) == (1, b""), run
    assert b"f is not an absolute path" in run.stderr


def test_the_walk_and_stat_run_inside_the_time_limit(tmp_path, monkeypatch):
    """A stat that never returns (an NFS server gone away; here a STAND-IN: a `stat` first
    on PATH that sleeps, since a hung file system cannot be made here): the read is killed
    at its time limit, status 124, like a dd that hangs."""
    monkeypatch.setattr(user_files, "READ_TIMEOUT_S", 2)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "stat").write_text("#!/bin/sh\nexec sleep 300\n")
    (bin_dir / "stat").chmod(0o755)
    (tmp_path / "f").write_text("x\n")
    started = time.monotonic()
    run = _read(tmp_path / "f", env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert run.returncode == 124, run
    assert time.monotonic() - started < 20
