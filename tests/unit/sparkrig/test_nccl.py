"""NCCL's builds on a host (sparkrig.nccl): the reading's output recorded on a real machine
parsed, and its script run for real here over a scratch venv whose libnccl.so.2 is a STAND-IN
(a small file carrying NCCL's version line, no library), attacked as its owner would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig import nccl

DATA = Path(__file__).parent / "data"
# Recorded on the lent GPU machine (an H200, as root): /opt/torch/.venv's nvidia-nccl-cu13 wheel
# (its RECORD: nvidia/nccl/lib/libnccl.so.2, 217995896 bytes) and the system's libnccl2 (held by
# the CUDA image), read by templates/sparkrig/nccl-builds.sh in 1.5 s.
H200 = DATA / "nccl-builds-h200.out"
VENV_SHA = "1c8618b866734cbdd5401715d6178be763ece283b7f808ecf86dedab211162c1"
SYSTEM_SHA = "2db3d5f54a7fa83a0a4a0a3c573a2314cb23cb6fc05f84e7dc26e501d650aaf4"
STAND_IN = b"\x7fELF STAND-IN for libnccl.so.2, not NCCL\x00"


def parse(output: str) -> dict:
    return nccl.NcclBuilds().process(output.splitlines())


def test_the_recorded_reading_of_a_real_wheel_and_libnccl2():
    found = parse(H200.read_text())
    assert found == {
        "venv nvidia-nccl-cu13": {
            "version": "2.28.9",
            "library": "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
            "sha256": VENV_SHA,
            "line": "NCCL version 2.28.9+cuda13.0",
        },
        "system libnccl2": {
            "version": "2.28.3-1+cuda13.0",
            "library": "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3",
            "sha256": SYSTEM_SHA,
            "line": "NCCL version 2.28.3+cuda13.0",
        },
    }
    assert nccl.twins(found) == []  # two versions there: not the same-version trap


def _venv(root: Path, line: bytes = b"NCCL version 2.27.7+cuda13.0", cuda: str = "13") -> Path:
    site = root / "venv/lib/python3.12/site-packages"
    (site / f"nvidia_nccl_cu{cuda}-2.27.7.dist-info").mkdir(parents=True)
    lib = site / "nvidia/nccl/lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(STAND_IN + line + b"\x00NCCL version 2.27.7 compiled with CUDA 13.0\x00")
    return root / "venv"


def _read(venv: Path, prefix_library: str = "/nonexistent/libnccl.so.2") -> list[str]:
    command = nccl.NcclBuilds().command(venv=str(venv), prefix_library=prefix_library).get_raw_value()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd="/", timeout=60, check=True)
    return [line for line in done.stdout.splitlines() if line.split(" ")[1] != "system"]  # this machine's own


def _lib(venv: Path) -> Path:
    return venv / "lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"


def test_the_script_reads_the_venvs_stand_in_and_a_prefix_build(tmp_path):
    venv = _venv(tmp_path)
    prefix = tmp_path / "prefix/lib"
    prefix.mkdir(parents=True)
    (prefix / "libnccl.so.2.27.7").write_bytes(STAND_IN + b"NCCL version 2.27.7+cuda13.0\x00other build")
    (prefix / "libnccl.so.2").symlink_to("libnccl.so.2.27.7")  # root's: resolved, as NCCL's make install links it
    found = nccl.NcclBuilds().process(_read(venv, str(prefix / "libnccl.so.2")))
    assert sorted(found) == ["prefix nccl", "venv nvidia-nccl-cu13"]
    assert found["venv nvidia-nccl-cu13"]["line"] == found["prefix nccl"]["line"] == "NCCL version 2.27.7+cuda13.0"
    assert found["prefix nccl"]["library"] == str(prefix / "libnccl.so.2.27.7")
    # One version, two builds: the trap of a node whose jobs may load either.
    assert nccl.twins(found) == [("prefix nccl", "venv nvidia-nccl-cu13")]


@pytest.mark.parametrize(
    ("attack", "said"),
    [
        ("link", "not a regular file (symbolic link)"),
        ("fifo", "not a regular file (fifo)"),
        ("huge", f"over {nccl.LIBRARY_LIMIT} bytes"),
        ("linked directory", "a link on its way"),
        ("control characters", "control character"),
        ("no version line", "not one 'NCCL version' line"),
        ("two version lines", "not one 'NCCL version' line"),
    ],
)
def test_what_the_venvs_owner_puts_in_place_fails_that_host_naming_why(tmp_path, attack, said):
    """Nothing blocks (a FIFO is never opened for reading), nothing huge is read (a sparse file
    over the limit is refused by its size), no link is followed, and what reaches a message is
    escaped: the host fails, naming the library and why."""
    venv = _venv(tmp_path)
    lib = _lib(venv)
    lib.unlink()
    if attack == "link":
        target = tmp_path / "elsewhere"
        target.write_bytes(STAND_IN + b"NCCL version 2.27.7+cuda13.0\x00")
        lib.symlink_to(target)
    elif attack == "fifo":
        os.mkfifo(lib)
    elif attack == "huge":
        with open(lib, "wb") as handle:
            handle.truncate(nccl.LIBRARY_LIMIT + 1)
    elif attack == "linked directory":
        real = tmp_path / "real-nccl"
        lib.parent.rename(real)
        lib.parent.symlink_to(real)
        (real / "libnccl.so.2").write_bytes(STAND_IN + b"NCCL version 2.27.7+cuda13.0\x00")
    elif attack == "control characters":
        lib.write_bytes(STAND_IN + b"NCCL version 2.27.7+cuda13.0\x1b]0;owned\x07\x00")
    elif attack == "no version line":
        lib.write_bytes(STAND_IN)
    else:
        lib.write_bytes(STAND_IN + b"NCCL version 2.27.7+cuda13.0\x00NCCL version 2.27.8+cuda13.0\x00")
    with pytest.raises(FactProcessError) as raised:
        nccl.NcclBuilds().process(_read(venv))
    message = str(raised.value)
    assert said in message and "libnccl.so.2" in message, message
    assert "\x1b" not in message and "\x07" not in message


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("nvidia_nccl_cu13-2.27.7\nbuild venv x.dist-info", "holds a newline"),
        ("nvidia_nccl_cu13-2.27.7 $(id).dist-info", "names no NCCL wheel"),
    ],
)
def test_a_dist_info_name_that_names_no_nccl_wheel_is_refused(tmp_path, name, said):
    """The owner names the directory: a newline forges no line of the reading."""
    venv = _venv(tmp_path)
    site = venv / "lib/python3.12/site-packages"
    (site / "nvidia_nccl_cu13-2.27.7.dist-info").rename(site / name)
    with pytest.raises(FactProcessError, match=said):
        nccl.NcclBuilds().process(_read(venv))


def _build(sha: str, line: str = "NCCL version 2.27.7+cuda13.0") -> dict:
    return {"version": "2.27.7", "library": "/x/libnccl.so.2", "sha256": sha * 64, "line": line}


def test_differences_name_the_node_and_both_builds():
    mine = {"system libnccl2": _build("a"), "venv nvidia-nccl-cu13": _build("b")}
    theirs = {"system libnccl2": _build("c"), "venv nvidia-nccl-cu13": _build("b")}
    assert nccl.differences("lab-deb12", mine, "lab-deb13", theirs) == [
        "system libnccl2: lab-deb13 has NCCL version 2.27.7+cuda13.0 (sha256 cccccccccccc), "
        "lab-deb12 has NCCL version 2.27.7+cuda13.0 (sha256 aaaaaaaaaaaa)"
    ]
    assert nccl.differences("a", mine, "b", {"venv nvidia-nccl-cu13": _build("b")}) == [
        "system libnccl2: b has none, a has NCCL version 2.27.7+cuda13.0 (sha256 aaaaaaaaaaaa)"
    ]
    assert nccl.differences("a", mine, "b", dict(mine)) == []
    assert nccl.cluster_differences({"a": mine, "b": theirs, "c": mine}) == nccl.differences("a", mine, "b", theirs)


def test_twins_are_one_version_in_two_builds_only():
    assert nccl.twins({"venv x": _build("a"), "system y": _build("b")}) == [("system y", "venv x")]
    assert nccl.twins({"venv x": _build("a"), "system y": _build("a")}) == []
    other = _build("b", "NCCL version 2.28.3+cuda13.0")
    assert nccl.twins({"venv x": _build("a"), "system y": other}) == []


def test_loader_variables_are_those_that_choose_another_library():
    assert nccl.loader_variables({"NCCL_DEBUG": "WARN", "LD_LIBRARY_PATH": "/usr/lib"}) == ["LD_LIBRARY_PATH"]
    assert nccl.loader_variables({"VLLM_NCCL_SO_PATH": "/usr/lib/x/libnccl.so.2", "LD_PRELOAD": ""}) == [
        "VLLM_NCCL_SO_PATH"
    ]
