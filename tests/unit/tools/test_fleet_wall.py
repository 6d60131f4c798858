"""benchmarks/fleet_wall.py's STAND-IN hosts: ``benchmarks/standin-ssh`` (run, with a stand-in
for the real ssh it records) answers each alias as its host answered, after the time it took."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from benchmarks import fleet_wall

# The "real ssh" of the recording: it says what it was asked, on both streams, after a while.
REAL_SSH = """#!/bin/sh
sleep 0.3
for a in "$@"; do last=$a; done
printf 'out of %s\\n' "$last"
printf 'err\\n' >&2
exit 3
"""


def _standin(tmp_path: Path, mode: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    real = tmp_path / "real-ssh"
    if not real.exists():
        real.write_text(REAL_SSH)
        real.chmod(0o755)
    env = fleet_wall.standin_env(tmp_path, mode)
    env["SPARKRIG_STANDIN_SSH"] = str(real)
    started = time.monotonic()
    run = subprocess.run(["ssh", *args], env=env, capture_output=True, timeout=30)
    return run, time.monotonic() - started


def test_a_recorded_answer_is_played_with_its_bytes_status_and_time_for_every_alias(tmp_path):
    options = ["-F", "/x/config", "-o", "BatchMode=yes", "-oConnectTimeout=10"]
    recorded, _ = _standin(tmp_path, "record", *options, "lab-deb12~0", "cat /etc/fstab")
    assert (recorded.returncode, recorded.stdout, recorded.stderr) == (3, b"out of cat /etc/fstab\n", b"err\n")
    for alias in ("lab-deb12~0", "lab-deb12~7"):
        played, seconds = _standin(tmp_path, "play", *options, alias, "cat", "/etc/fstab")  # ssh joins the words
        assert (played.returncode, played.stdout, played.stderr) == (3, b"out of cat /etc/fstab\n", b"err\n")
        assert seconds >= 0.3  # the time the host took
    assert not (tmp_path / "answers" / "misses").exists()


def test_a_command_or_host_not_recorded_is_unreachable_and_listed(tmp_path):
    _standin(tmp_path, "record", "lab-deb12~0", "true")
    for host, command in (("lab-deb12~1", "false"), ("lab-deb13~0", "true")):
        played, seconds = _standin(tmp_path, "play", host, command)
        assert played.returncode == 255 and played.stdout == b"" and seconds < 0.3
    listed = (tmp_path / "answers" / "misses").read_text().split("\n")
    assert [line.split(" ")[0] for line in listed if line] == ["lab-deb12", "lab-deb13"]


def test_a_control_command_is_answered_at_once_and_never_recorded(tmp_path):
    recorded, _ = _standin(tmp_path, "record", "-O", "exit", "lab-deb12~0")
    assert recorded.returncode == 3
    assert list((tmp_path / "answers" / "lab-deb12").iterdir()) == []
    played, seconds = _standin(tmp_path, "play", "-O", "exit", "lab-deb12~3")
    assert played.returncode == 0 and seconds < 0.3


def test_each_alias_has_its_host_s_data_out_of_any_cluster_and_prometheus(tmp_path):
    base = tmp_path / "base.py"
    base.write_text("lab = [('h', {'cluster_name': 'c', 'prometheus_server': 'h', 'ssh_port': 2}), ('g', {})]\n")
    names = fleet_wall.fleet_names(["h", "g"], 3)
    assert names == ["h~0", "g~0", "h~1"]
    found: dict = {}
    exec(fleet_wall.alias_inventory(base, names, tmp_path / "fleet.py").read_text(), found)  # noqa: S102
    assert found["lab"] == [("h~0", {"ssh_port": 2}), ("g~0", {}), ("h~1", {"ssh_port": 2})]


def test_the_per_host_table_is_read_row_by_row():
    out = "\n".join(
        [
            "..s",
            "=== sparkrig compliance, per host ===",
            "host          passed  failed  skipped",
            "lab-deb12~0       57       0       53",
            "lab-deb13~0       65       1       45",
            "failed controls:",
            "  lab-deb13~0: test_swap.py::test_x: no",
        ]
    )
    assert fleet_wall.per_host(out) == {"lab-deb12~0": (57, 0, 53), "lab-deb13~0": (65, 1, 45)}
    assert fleet_wall.per_host("no table") == {}
    assert os.access(fleet_wall.STANDIN, os.X_OK)
