"""atomic.HostState: one command reads a concern's files, units and packages; its output
is parsed as the shell prints it, and up_to_date() compares it with the wanted file."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess

from sparkrig import atomic, user_files
from sparkrig.operations.cluster import facts as cluster_facts

SHA = hashlib.sha256(b"x\n").hexdigest()


def test_process_reads_files_units_and_packages_as_printed():
    found = atomic.HostState().process(
        [
            f"file 644 root root {SHA} /etc/default/earlyoom",
            "nofile /etc/a b",
            "unit active enabled earlyoom.service",
            "unit unknown unknown nosuch.service",
            "package ii  1.7-1+b1 earlyoom",  # dpkg's Status-Abbrev ends in a space
            "package rc  2.0 docker.io",  # removed, configuration left: not installed
        ]
    )
    assert found == {
        "files": {
            "/etc/default/earlyoom": {"sha256": SHA, "mode": 0o644, "user": "root", "group": "root"},
            "/etc/a b": None,
        },
        "units": {
            "earlyoom.service": {"active": "active", "enabled": "enabled"},
            "nosuch.service": {"active": "unknown", "enabled": "unknown"},
        },
        "packages": {"earlyoom": "1.7-1+b1", "docker.io": None},
    }
    assert atomic.HostState.default() == {"files": {}, "units": {}, "packages": {}}


def test_the_command_runs_in_sh_and_prints_what_process_reads(tmp_path):
    present = tmp_path / "present file"
    present.write_text("x\n")
    command = atomic.HostState().command(paths=(str(present), str(tmp_path / "absent"))).get_raw_value()
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    files = atomic.HostState().process(output.splitlines())["files"]
    assert files[str(present)]["sha256"] == SHA
    assert files[str(tmp_path / "absent")] is None


def test_up_to_date_compares_content_mode_and_owner():
    state = {"sha256": SHA, "mode": 0o644, "user": "root", "group": "root"}
    assert atomic.up_to_date(state, "x\n")
    assert not atomic.up_to_date(state, "y\n")
    assert not atomic.up_to_date(state, "x\n", mode=0o755)
    assert not atomic.up_to_date({**state, "user": "spark"}, "x\n")
    assert not atomic.up_to_date(None, "x\n")


# Reads of a user's files ---------------------------------------------------------------


def _user_read(path, limit: int = 1024) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["dash", "-c", user_files.user_read(shlex.quote(str(path)), limit)],
        capture_output=True,
        timeout=user_files.READ_TIMEOUT_S + 30,
    )


def test_a_users_file_is_read_whole_when_regular_and_small(tmp_path):
    (tmp_path / "f").write_bytes(b"a\x00b\n")
    assert (_user_read(tmp_path / "f").returncode, _user_read(tmp_path / "f").stdout) == (0, b"a\x00b\n")
    assert _user_read(tmp_path / "missing").returncode == 1


def test_a_users_fifo_link_or_large_file_is_never_read(tmp_path):
    """A FIFO (no writer: an open would block), a link to a file root alone may read, a file
    over the limit: none is read, none blocks, each says why on stderr."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "secret").write_bytes(b"SECRET" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    for name, status in (("fifo", 1), ("link", 1), ("secret", 2)):
        run = _user_read(tmp_path / name, limit=100)
        assert (run.returncode, run.stdout) == (status, b""), (name, run)
        assert b"sparkrig: " in run.stderr


def test_the_cluster_users_authorized_keys_is_read_as_a_users_file(tmp_path):
    (tmp_path / ".ssh").mkdir()
    os.mkfifo(tmp_path / ".ssh" / "authorized_keys")
    run = subprocess.run(
        ["dash", "-c", cluster_facts.READ_AUTHORIZED, "sparkrig", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout) == (0, "")
