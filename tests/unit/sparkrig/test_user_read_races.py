"""The one reader of a user-controlled path (sparkrig/user_files.py, templates/sparkrig/user-read.sh)
run here by dash: a file that is not a regular one, a file over the limit, and a file swapped
after the reader's check for a link or a FIFO. The swap races the check; a STAND-IN `stat`
first on PATH (a script written here) reports "regular file" for whatever is there, which is
what the check sees when the owner swaps the file right after it. The open must then still
refuse the link (nofollow) and never wait on the FIFO (nonblock).

tests/mutants.py changes each of these mechanisms by one line; a test here fails for each."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from sparkrig import user_files


def _read(path: Path, limit: int = 1 << 20, path_dirs: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{path_dirs}{os.environ['PATH']}"}
    return subprocess.run(
        ["dash", "-c", user_files.user_read(shlex.quote(str(path)), limit)], capture_output=True, timeout=60, env=env
    )


def _lying_stat(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "stat").write_text("#!/bin/sh\n# STAND-IN stat: the check saw a regular file\necho 'regular file 5'\n")
    (bin_dir / "stat").chmod(0o755)
    return f"{bin_dir}:"


def test_a_file_over_the_limit_is_refused_not_cut(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 100)
    run = _read(tmp_path / "f", limit=10)
    assert (run.returncode, run.stdout) == (2, b""), run
    assert b"is over 10 bytes: not read" in run.stderr
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(1 << 40)  # 1 TiB of nothing
    assert (_read(sparse, limit=4096).returncode, _read(sparse, limit=4096).stdout) == (2, b"")
    assert _read(tmp_path / "f", limit=100).stdout == b"x" * 100


@pytest.mark.parametrize("kind", ["fifo", "directory", "link to a file", "link to /dev/zero"])
def test_what_is_not_a_regular_file_reads_as_missing(tmp_path, kind):
    target = tmp_path / "target"
    target.write_text("SECRET\n")
    f = tmp_path / "f"
    {
        "fifo": lambda: os.mkfifo(f),
        "directory": f.mkdir,
        "link to a file": lambda: f.symlink_to(target),
        "link to /dev/zero": lambda: f.symlink_to("/dev/zero"),
    }[kind]()
    started = time.monotonic()
    run = _read(f)
    assert (run.returncode, run.stdout) == (1, b""), run
    assert b"is not a regular file" in run.stderr and time.monotonic() - started < 10


def test_a_link_swapped_in_after_the_check_is_not_followed(tmp_path):
    (tmp_path / "secret").write_text("SECRET\n")
    (tmp_path / "f").symlink_to(tmp_path / "secret")
    run = _read(tmp_path / "f", path_dirs=_lying_stat(tmp_path))
    assert run.returncode != 0 and b"SECRET" not in run.stdout, run


def test_a_fifo_swapped_in_after_the_check_never_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(user_files, "READ_TIMEOUT_S", 8)
    os.mkfifo(tmp_path / "f")
    started = time.monotonic()
    run = _read(tmp_path / "f", path_dirs=_lying_stat(tmp_path))
    assert run.returncode != 124 and run.stdout == b"", run
    assert time.monotonic() - started < 5
