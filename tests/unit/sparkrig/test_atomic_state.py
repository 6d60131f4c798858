"""atomic.HostState: one command reads a concern's files, units and packages; its output
is parsed as the shell prints it, and up_to_date() compares it with the wanted file."""

from __future__ import annotations

import hashlib
import subprocess

from sparkrig import atomic

SHA = hashlib.sha256(b"x\n").hexdigest()


def test_process_reads_files_units_and_packages_as_printed():
    found = atomic.HostState().process([
        f"file 644 root root {SHA} /etc/default/earlyoom",
        "nofile /etc/a b",
        "unit active enabled earlyoom.service",
        "unit unknown unknown nosuch.service",
        "package ii  1.7-1+b1 earlyoom",  # dpkg's Status-Abbrev ends in a space
        "package rc  2.0 docker.io",  # removed, configuration left: not installed
    ])
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
