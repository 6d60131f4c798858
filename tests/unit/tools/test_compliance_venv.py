"""tests/compliance/venv.py, played against on this machine: a venv whose owner plants files
and programs, read by the suite's real scripts (the bounded reader, runuser), as root."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from testinfra.backend.local import LocalBackend
from testinfra.host import Host

from tests.compliance import reads, venv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs the venv's scripts as root, as the suite does")


@pytest.fixture
def fake_venv():
    """A venv-like tree any user can traverse (nobody runs its python)."""
    root = Path(tempfile.mkdtemp(prefix="sparkrig-venv-"))
    root.chmod(0o755)
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    yield root, site
    shutil.rmtree(root)


def _dist(site: Path, name: str, metadata: str, direct: str | None = None) -> Path:
    d = site / f"{name}.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(metadata)
    if direct is not None:
        (d / "direct_url.json").write_text(direct)
    return d


@reads.need
def venv_reading(r):
    """A test need: the venv's distributions and its pyvenv.cfg's Python."""
    return venv.distributions(r, r.settings["python_venv_path"]), venv.pyvenv_version(r, r.settings["python_venv_path"])


def _read(root: Path):
    host = Host(LocalBackend())
    return reads.answer(host.backend, "@local", venv_reading, {"python_venv_path": str(root)})


def test_distributions_and_the_python_are_read_as_files(fake_venv):
    root, site = fake_venv
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nimplementation = CPython\nversion_info = 3.11.2\n")
    _dist(site, "torch-2.9.0+cu130", "Name: torch\nVersion: 6.6.6\n", '{"url": "file:///w/torch.whl"}')
    _dist(site, "Typing_Extensions-4.16.0", "")
    _dist(site, "broken-1.0", "", "not json")
    found, python = _read(root)
    # The folders' names, as the deploy reads them (a METADATA is never read).
    assert found == {
        "torch": {"version": "2.9.0+cu130", "direct": {"url": "file:///w/torch.whl"}},
        "typing-extensions": {"version": "4.16.0", "direct": None},
        "broken": {"version": "1.0", "direct": None},
    }
    assert python() == "3.11"


def test_a_fifo_or_a_link_planted_in_the_venv_neither_blocks_nor_leaks(fake_venv):
    root, site = fake_venv
    secret = Path(tempfile.mkdtemp()) / "secret"
    secret.write_text('{"url": "SECRET"}')
    secret.chmod(0o600)
    try:
        os.mkfifo(_dist(site, "fifo-1", "") / "direct_url.json")
        (_dist(site, "link-1", "") / "direct_url.json").symlink_to(secret)
        secret_dir = secret.parent / "elsewhere-1.dist-info"
        secret_dir.mkdir()
        (secret_dir / "direct_url.json").write_text('{"url": "SECRET"}')
        (site / "elsewhere-1.dist-info").symlink_to(secret_dir)  # a folder that is a link: skipped
        (site / "evil\n\x1b[31m-1.dist-info").mkdir()  # names no distribution
        (root / "pyvenv.cfg").symlink_to(secret)
        started = time.monotonic()
        found, python = _read(root)
        assert time.monotonic() - started < 30
        assert "SECRET" not in repr(found)
        assert found == {"fifo": {"version": "1", "direct": None}, "link": {"version": "1", "direct": None}}
        with pytest.raises(AssertionError):
            python()  # pyvenv.cfg, a link, reads as missing: the control fails saying so
    finally:
        shutil.rmtree(secret.parent)


def test_a_site_packages_reached_through_a_link_is_not_read(fake_venv):
    root, site = fake_venv
    elsewhere = Path(tempfile.mkdtemp(prefix="sparkrig-elsewhere-"))
    try:
        _dist(elsewhere, "secret-1", "")
        shutil.rmtree(site)
        site.symlink_to(elsewhere)
        with pytest.raises(AssertionError, match="a link on the way to its site-packages"):
            _read(root)
    finally:
        shutil.rmtree(elsewhere)


def test_two_records_of_one_distribution_fail_its_controls(fake_venv):
    root, site = fake_venv
    _dist(site, "torch-2.9.0", "")
    _dist(site, "Torch-6.6.6", "")
    with pytest.raises(AssertionError, match="two records of torch"):
        _read(root)


def _python(root: Path, body: str) -> None:
    script = root / "bin" / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


def test_the_venvs_python_runs_as_its_owner_and_a_root_venvs_as_nobody(fake_venv):
    root, _site = fake_venv
    _python(root, 'echo "$(id -u) $*"')
    for owner, uid in (("root", "65534"), ("nobody", "65534")):
        out = subprocess.run(
            ["sh", "-c", venv.interpreter({"python_venv_owner": owner, "python_venv_path": str(root)}, "print(1)")],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == [uid, "-I", "-c", "print(1)"]


def test_the_venvs_python_is_killed_at_its_time_limit(fake_venv, monkeypatch):
    root, _site = fake_venv
    _python(root, "sleep 30")
    monkeypatch.setattr(venv, "INTERPRETER_TIMEOUT_S", 1)
    started = time.monotonic()
    out = subprocess.run(
        ["sh", "-c", venv.interpreter({"python_venv_owner": "nobody", "python_venv_path": str(root)}, "pass")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 124 and time.monotonic() - started < 10


def test_a_venv_past_its_caps_fails_its_controls_naming_the_cap(fake_venv, monkeypatch):
    root, site = fake_venv
    for i in range(venv.DIST_INFO_LIMIT + 1):
        (site / f"zz_many_{i}-1.dist-info").mkdir()
    with pytest.raises(AssertionError, match=f"more than {venv.DIST_INFO_LIMIT} \\*.dist-info folders"):
        _read(root)
    # Under the count, over the whole answer's bytes (the names' line alone).
    monkeypatch.setattr(
        venv, "_DISTRIBUTIONS", venv._DISTRIBUTIONS.replace(f"head -c {venv.VENV_ANSWER_LIMIT}", "head -c 1000")
    )
    monkeypatch.setattr(venv, "VENV_ANSWER_LIMIT", 1000)
    with pytest.raises(AssertionError, match="not read whole: more than 1000 bytes"):
        _read(root)


def test_a_venv_read_past_its_time_fails_its_controls(fake_venv, monkeypatch):
    """Every direct_url.json is read by the reader (programs of its own): thousands of them
    take longer than the venv's time, and the answer then says it was not read whole."""
    root, site = fake_venv
    for i in range(3000):
        _dist(site, f"zz_slow_{i}-1", "", "{}")
    monkeypatch.setattr(
        venv,
        "_DISTRIBUTIONS",
        venv._DISTRIBUTIONS.replace(f"timeout -k 1 {venv.VENV_READ_TIMEOUT_S} ", "timeout -k 1 1 "),
    )
    started = time.monotonic()
    with pytest.raises(AssertionError, match="not read whole"):
        _read(root)
    assert time.monotonic() - started < 20


def _interpreter(root: Path, **pass_fds) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", "-c", venv.interpreter({"python_venv_owner": "nobody", "python_venv_path": str(root)}, "pass")],
        capture_output=True,
        timeout=60,
        **pass_fds,
    )


def test_the_venvs_python_gets_no_descriptor_of_the_reading_and_leaves_nothing_running(fake_venv):
    """The owner's program writes to every descriptor it inherited and leaves a child writing
    forever: it sees none of the suite's descriptors but its own pipes, and its child is dead
    when the run returns (it would otherwise write into the prefetch's deleted output file)."""
    root, _site = fake_venv
    beats = root / "beats"
    beats.touch()
    beats.chmod(0o666)
    _python(
        root,
        f"for fd in 3 4 5 6 7 8 9; do (echo LEAK >&$fd) 2>/dev/null; done\n"
        f"setsid sh -c 'trap \"\" PIPE; while :; do echo FOREVER; echo beat >> {beats}; sleep 0.1; done' &\n"
        "echo started; sleep 0.5",
    )
    read_end, write_end = os.pipe()
    try:
        started = time.monotonic()
        out = _interpreter(root, pass_fds=(write_end,))
        assert time.monotonic() - started < 20
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as leaked:
        assert leaked.read() == b""
    assert out.returncode == 0 and out.stdout.startswith(b"started\n"), out
    time.sleep(0.5)
    before = beats.stat().st_size
    time.sleep(1)
    assert before > 0 and beats.stat().st_size == before, "the child the venv's python left still runs"


def test_the_venvs_python_output_is_capped(fake_venv):
    root, _site = fake_venv
    _python(root, "head -c 5000000 /dev/zero")
    out = _interpreter(root)
    assert out.returncode == 125 and len(out.stdout) <= venv.INTERPRETER_OUTPUT_LIMIT
    assert b"printed more than" in out.stderr


def test_the_controller_holds_a_bounded_part_of_one_hosts_answer(monkeypatch):
    """A host that prints without end (or past the cap) costs the controller the cap, not its
    output: the round is dropped, the host named."""
    monkeypatch.setattr(reads, "PREFETCH_OUTPUT_LIMIT", 1 << 20)
    started = time.monotonic()
    assert reads._ssh_output(["sh", "-c", "exec cat /dev/zero"], "noisy") is None
    assert time.monotonic() - started < 30
    assert reads._ssh_output(["sh", "-c", "head -c 1000 /dev/zero | tr '\\0' a"], "quiet") == "a" * 1000


def test_the_venvs_python_sees_a_proc_of_its_own_namespace(fake_venv):
    """CUDA's driver fails (error 304, seen on the lent GPU machine) in a PID namespace that
    still shows the host's /proc: the runner mounts one of its own, where the python is pid 1's
    child and the host's processes are not listed."""
    root, _site = fake_venv
    _python(root, 'ls /proc | grep -c "^[0-9]"')
    out = _interpreter(root)
    assert out.returncode == 0 and int(out.stdout) < 10, out


def test_a_failed_interpreter_question_names_the_venvs_python_and_the_question(fake_venv):
    """A venv with no python (the lent GPU machine, never converged): the control's failure
    named the interpreter's runner, a screen of shell, and not the question."""
    from tests.compliance import test_python_stack  # noqa: PLC0415 - the control module, only here

    root, _ = fake_venv
    settings = {"python_stack": {"torch": "2.11.0"}, "python_venv_path": str(root), "python_venv_owner": "nobody"}
    answers: dict = {}
    answer = test_python_stack._interpreter_answer(reads.Reader("spark", settings, answers), "import torch")
    ran = subprocess.run(["sh", "-c", answer.text], capture_output=True, cwd="/")
    answers[answer.text] = (ran.returncode, ran.stdout, ran.stderr)
    with pytest.raises(AssertionError) as failed:
        answer.check()
    message = str(failed.value)
    assert message.startswith(
        f"{root}/bin/python, run as its owner nobody (nobody where that is root), asked 'import torch' failed (exit "
    ), message
    assert f"{root}/bin/python" in message.split(": ", 1)[1] and "exec python3" not in message, message


class _UvHost:
    """A host whose `uv run` in the owner's scratch project answers ``rc``, ``stdout``, ``stderr``."""

    def __init__(self, rc: int, stdout: str, stderr: str):
        self.answer = type("Answer", (), {"rc": rc, "stdout": stdout, "stderr": stderr})()

    def sudo(self):
        return contextlib.nullcontext()

    def run(self, command):
        assert command.startswith("runuser -l spark -c ")
        return self.answer


def test_uv_run_that_fails_in_the_scratch_project_says_how_and_why():
    """It said `[]`: the script's `uv run ... && ls -A; rm -rf` printed nothing once uv was missing."""
    from tests.compliance import test_python_stack  # noqa: PLC0415 - the control module, only here

    host = _UvHost(0, "", "-bash: line 1: uv: command not found\n")
    with pytest.raises(AssertionError) as failed:
        test_python_stack.test_uv_run_in_a_project_uses_the_managed_venv_as_it_is(
            host, None, {"python_venv_owner": "spark"}, "/opt/sparkrig/venv"
        )
    assert str(failed.value).splitlines()[0] == (
        "uv run in a scratch project of spark's (exit 0) printed [], not ['/opt/sparkrig/venv', 'pyproject.toml'] "
        "(its Python's prefix, then the project's files): -bash: line 1: uv: command not found"
    )


def test_uv_no_sync_missing_from_the_login_shell_says_what_it_found_and_where_it_comes_from():
    """It said `assert 'UV_NO_SYNC=' == 'UV_NO_SYNC=1'` on the lent GPU machine."""
    from tests.compliance import test_python_stack  # noqa: PLC0415 - the control module, only here

    def read(found):
        return lambda need: {"no_sync": type("Answer", (), {"check": lambda self: found})()}

    test_python_stack.test_uv_run_never_resyncs_for_the_owner(read("motd\nUV_NO_SYNC=1"))
    with pytest.raises(AssertionError) as failed:
        test_python_stack.test_uv_run_never_resyncs_for_the_owner(read("UV_NO_SYNC="))
    assert str(failed.value).splitlines()[0] == (
        "a login shell of the venv's owner has UV_NO_SYNC=, not UV_NO_SYNC=1, from the system's profile "
        "(/etc/profile.d/sparkrig-cuda.sh, written by the cuda_env concern)"
    )
