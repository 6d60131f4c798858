"""A service's arguments read from its running process, whatever binfmt interpreter runs it
(tests/compliance/processes.py): natively, through the lab's qemu-aarch64-static entry, and
through Debian's qemu-user-binfmt wrapper; words in front that are not a root-owned
interpreter's fail, naming the service."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.compliance.processes import ProcessError, main_process_command, program_argv

SERVICE = "earlyoom.service"
ARGS = ["-M", "1048576", "-s", "100", "--prefer", "python"]


def output(argv, comm="earlyoom", owner_mode="0 755", exe="/usr/bin/earlyoom", pid="4242") -> str:
    return "\n".join([pid, comm, owner_mode, exe, "--sparkrig-argv--", *argv]) + "\n"


@pytest.mark.parametrize(
    ("argv", "exe"),
    [
        (["/usr/bin/earlyoom", *ARGS], "/usr/bin/earlyoom"),  # native
        # The lab's entry (flags POCF): qemu, the program's path, its preserved argv[0].
        (
            ["/usr/bin/qemu-aarch64-static", "/usr/bin/earlyoom", "/usr/bin/earlyoom", *ARGS],
            "/usr/bin/qemu-aarch64-static",
        ),
        # Debian's qemu-user-binfmt (a link to qemu-aarch64; P in its name: argv[0] preserved).
        (
            ["/usr/libexec/qemu-binfmt/aarch64-binfmt-P", "/usr/bin/earlyoom", "/usr/bin/earlyoom", *ARGS],
            "/usr/bin/qemu-aarch64",
        ),
        # An entry without P: the original argv[0] is gone, the path stands for it.
        (["/usr/bin/qemu-aarch64", "/usr/bin/earlyoom", *ARGS], "/usr/bin/qemu-aarch64"),
    ],
)
def test_the_program_s_own_words_whatever_interpreter_runs_it(argv, exe):
    assert program_argv(output(argv, exe=exe), "earlyoom", SERVICE) == ["/usr/bin/earlyoom", *ARGS]


@pytest.mark.parametrize(
    ("argv", "owner_mode", "comm", "says"),
    [
        # Something else in front: not taken off, whoever owns it.
        (["/usr/local/bin/wrap", "/usr/bin/earlyoom", *ARGS], "0 755", "earlyoom", "not a known binfmt interpreter"),
        # A known name, but not root's alone: group- or other-writable, or another owner's.
        (["/opt/qemu-aarch64", "/usr/bin/earlyoom", *ARGS], "0 775", "earlyoom", "owner uid 0, mode 775"),
        (["/opt/qemu-aarch64", "/usr/bin/earlyoom", *ARGS], "0 757", "earlyoom", "owner uid 0, mode 757"),
        (["/opt/qemu-aarch64", "/usr/bin/earlyoom", *ARGS], "1000 755", "earlyoom", "owner uid 1000"),
        # Another program runs as the service's main process.
        (["/usr/bin/python3", "fake-earlyoom", *ARGS], "0 755", "python3", "is 'python3', not earlyoom"),
        # An interpreter, then not the program.
        (["/usr/bin/qemu-aarch64", "/usr/bin/other", *ARGS], "0 755", "earlyoom", "not earlyoom"),
    ],
)
def test_words_in_front_that_are_not_a_root_owned_interpreter_s_fail_naming_the_service(argv, owner_mode, comm, says):
    with pytest.raises(ProcessError, match=SERVICE) as failed:
        program_argv(output(argv, comm=comm, owner_mode=owner_mode, exe=argv[0]), "earlyoom", SERVICE)
    assert says in str(failed.value)


def test_no_main_process_says_so_with_what_the_host_said():
    with pytest.raises(ProcessError, match="earlyoom.service has no main process to read.*Permission denied"):
        program_argv("0\n", "earlyoom", SERVICE, "stat: cannot stat '/proc/0/exe': Permission denied")


def test_the_command_reads_one_process_s_comm_exe_and_argv(tmp_path):
    """The real command, with a stand-in systemctl naming a process of ours as the main one."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        systemctl = tmp_path / "systemctl"
        systemctl.write_text(f"#!/bin/sh\necho {sleeper.pid}\n")
        systemctl.chmod(0o755)
        env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
        said = subprocess.run(
            ["sh", "-c", main_process_command("sleeper.service")], capture_output=True, text=True, env=env, check=True
        )
        lines = said.stdout.splitlines()
        assert lines[0] == str(sleeper.pid) and lines[1] == "sleep"
        assert os.path.basename(lines[3]) == "sleep"
        if lines[2].split()[0] == "0" and not int(lines[2].split()[1], 8) & 0o022:
            assert program_argv(said.stdout, "sleep", "sleeper.service") == ["sleep", "30"]
    finally:
        sleeper.kill()
        sleeper.wait()
    # No main process (MainPID 0): the command fails, and the parse says so.
    systemctl.write_text("#!/bin/sh\necho 0\n")
    said = subprocess.run(["sh", "-c", main_process_command("gone.service")], capture_output=True, text=True, env=env)
    assert said.returncode != 0
    with pytest.raises(ProcessError, match="gone.service has no main process"):
        program_argv(said.stdout, "sleep", "gone.service", said.stderr)
