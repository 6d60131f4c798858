"""sparkrig.parts: the reading's executor, run here by real shells (dash and bash) against
parts that attack it: a hostile part writes to every descriptor it inherited, prints the
answer's structure, looks for a secret on its parents' command lines, leaves children
holding its output open, sleeps past its time, prints without end."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkrig import parts

SHELLS = ["dash", "bash"]

# The hostile program: a stand-in for a user's bin/python that a reading once ran.
HOSTILE = r"""
import os, sys
found = []
for fd in range(3, 64):
    try:
        os.write(fd, b"part 0 0 4 0\npart 1 0 4 0\ndata b25lCm9uZQo=\nsparkrig-parts-end\n")
        found.append(fd)
    except OSError:
        pass
secrets = []
pid = os.getppid()
while pid > 1:
    for what in ("cmdline", "environ"):
        try:
            secrets.append(open(f"/proc/{pid}/{what}", "rb").read())
        except OSError:
            pass
    try:
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
open(sys.argv[1] + "/fds", "w").write(" ".join(map(str, found)))
open(sys.argv[1] + "/seen", "wb").write(b"\0".join(secrets))
print("part 1 0 7 0")
print("data Zm9yZ2VkCg==")
print("sparkrig-parts-end")
sys.stdout.flush()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        import time
        open(sys.argv[1] + "/child.tmp", "w").write(str(os.getpid()))
        os.rename(sys.argv[1] + "/child.tmp", sys.argv[1] + "/child")
        while True:  # holds the part's stdout open, writing, for ever
            try:
                sys.stdout.write("still here\n")
                sys.stdout.flush()
            except OSError:
                pass
            time.sleep(0.05)
    os._exit(0)
import time
while not os.path.exists(sys.argv[1] + "/child"):  # the child is there before this part ends
    time.sleep(0.01)
os._exit(0)
"""


def run(script: str, shell: str, extra_fd: int | None = None, timeout: float = 60) -> tuple[str, float]:
    """``script`` run by ``shell`` as pyinfra runs a command (stdin a pipe left open);
    with ``extra_fd``, that descriptor open on the script's own stdout, as a careless
    caller could leave it."""
    argv = [shell, "-c", script if extra_fd is None else f"exec {extra_fd}>&1\n{script}"]
    started = time.monotonic()
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/")
    out, _ = process.communicate(timeout=timeout)
    return out.decode(), time.monotonic() - started


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("shell", SHELLS)
def test_each_part_comes_back_as_it_printed_it(shell):
    commands = ["printf 'one\\n'; echo oops >&2", "printf 'caf\\351'", "exit 3", "true"]
    answers = parts.parse(run(parts.script(commands), shell)[0].splitlines(), len(commands))
    assert answers == [
        parts.Answer(0, b"one\n", b"oops\n"),
        parts.Answer(0, b"caf\xe9", b""),
        parts.Answer(3, b"", b""),
        parts.Answer(0, b"", b""),
    ]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("units", [None, [[0, 1, 2], [3, 4]]], ids=["alone", "in-units"])
def test_a_hostile_part_neither_forges_nor_blocks_another_part_and_leaves_nothing_running(tmp_path, shell, units):
    program = tmp_path / "python"
    program.write_text(HOSTILE)
    commands = [
        "echo first",
        f"{sys.executable} -I {program} {tmp_path}",
        "cat",  # reads stdin: the caller's pipe, never closed, would hold it for ever
        f"sleep 1000 >/dev/null 2>&1 & echo $! >{tmp_path}/bg; echo last",
        'stat -c %a "$(dirname "$(readlink /proc/self/fd/2)")"',
    ]
    out, took = run(parts.script(commands, [20] * len(commands), units=units), shell, extra_fd=5)
    answers = parts.parse(out.splitlines(), len(commands))
    assert took < 19, took  # below the parts' 20 s: nothing waited for its limit
    assert answers[0] == parts.Answer(0, b"first\n", b"")
    assert answers[2] == parts.Answer(0, b"", b"")  # stdin is /dev/null
    assert answers[3] == parts.Answer(0, b"last\n", b"")
    assert answers[4].stdout == b"700\n"  # the outputs' directory is this user's alone
    # The hostile part's lines are its own answer's bytes, nothing more.
    assert answers[1].status == 0 and answers[1].stdout.startswith(b"part 1 0 7 0\ndata Zm9yZ2VkCg==\n")
    assert (tmp_path / "fds").read_text() == ""  # descriptor 5 was closed before it ran
    # Nothing secret on any parent's command line or in its environment: the same parts
    # always make the same script, and it holds no tag a part could learn.
    # (It did read them: what it found there helps it no more than the script's own text.)
    assert parts.script(commands) == parts.script(commands)
    assert b"sparkrig-parts-end" in (tmp_path / "seen").read_bytes()
    # Its double-forked child (a session of its own) holding stdout open, and a plain
    # background child, are gone once the reading returned.
    time.sleep(0.2)
    assert not alive(int((tmp_path / "child").read_text()))
    assert not alive(int((tmp_path / "bg").read_text()))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_part_past_its_time_or_its_bytes_is_killed_and_named(shell):
    commands = ["sleep 100", "trap '' TERM; sleep 100", "cat /dev/zero", "echo fine"]
    script = parts.script(commands, [1, 1, 30, 5], part_bytes=1 << 16, file_bytes=1 << 20)
    out, took = run(script, shell)
    answers = parts.parse(out.splitlines(), len(commands), part_bytes=1 << 16)
    assert took < 25, took  # below cat's 30 s
    assert answers[0].status == 124 and "after 1 s" in parts.failure(answers[0], 1)
    assert answers[1].status == 137  # TERM ignored: KILL 2 s later
    assert parts.failure(answers[2], part_bytes=1 << 16) == "printed more than 65536 bytes"
    assert answers[3] == parts.Answer(0, b"fine\n", b"")


@pytest.mark.parametrize("shell", SHELLS)
def test_parts_run_in_one_unit_answer_as_each_alone(shell):
    """Several cheap parts share a unit's shell: each still has its own status and outputs,
    and what one does to its shell (a directory, a variable, an exit, a trap) reaches no other."""
    commands = [
        "printf 'one\\n'; echo oops >&2",
        "cd /tmp; x=set; trap 'echo trapped' EXIT; exit 3",
        'pwd; echo "${x-unset}"',
        "cat",  # stdin: /dev/null, as alone
        "sh -c 'kill -s TERM $PPID'; echo unreached",
        "echo after",
    ]
    out, _ = run(parts.script(commands, units=[list(range(len(commands)))]), shell)
    answers = parts.parse(out.splitlines(), len(commands))
    assert answers[:4] == [
        parts.Answer(0, b"one\n", b"oops\n"),
        parts.Answer(3, b"trapped\n", b""),
        parts.Answer(0, b"/\nunset\n", b""),
        parts.Answer(0, b"", b""),
    ]
    assert answers[4].status == 143 and answers[5] == parts.Answer(0, b"after\n", b"")
    with pytest.raises(ValueError, match="every command"):
        parts.script(commands, units=[[0, 1, 2], [2, 3, 4, 5]])


@pytest.mark.parametrize("shell", SHELLS)
def test_a_unit_past_its_time_answers_the_part_it_ran_as_killed_and_the_rest_as_cut(shell):
    commands = ["echo a", "sleep 100", "echo c", "echo alone"]
    out, took = run(parts.script(commands, [1, 2, 1, 1], units=[[0, 1, 2], [3]]), shell)
    answers = parts.parse(out.splitlines(), len(commands))
    assert took < 20, took  # below sleep's 100 s
    assert answers[0] == parts.Answer(0, b"a\n", b"")
    assert answers[1].status == 124 and "after 2 s" in parts.failure(answers[1], 2)  # the unit's limit: its largest
    assert answers[2].status == "cut" and "not started" in parts.failure(answers[2])
    assert answers[3] == parts.Answer(0, b"alone\n", b"")


@pytest.mark.parametrize("shell", SHELLS)
def test_no_part_starts_once_the_readings_time_is_spent(shell):
    commands = ["sleep 2; echo a", "echo b"]
    out, _ = run(parts.script(commands, [5, 5], lanes=1, reading_timeout_s=1), shell)
    answers = parts.parse(out.splitlines(), 2)
    assert answers[0] == parts.Answer(0, b"a\n", b"")
    assert answers[1].status == "late" and "not started" in parts.failure(answers[1])


@pytest.mark.parametrize("shell", SHELLS)
def test_the_parts_run_side_by_side(shell):
    """Each part says when it started and ended: all four were running at once (by the
    clock of the parts themselves, whatever the machine's load)."""
    command = "date +%s%N; sleep 2; date +%s%N"
    out, _ = run(parts.script([command] * 4, lanes=4), shell)
    spans = [tuple(map(int, a.stdout.split())) for a in parts.parse(out.splitlines(), 4)]
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans
    one_lane, _ = run(parts.script([command] * 2, lanes=1), shell)
    first, second = (tuple(map(int, a.stdout.split())) for a in parts.parse(one_lane.splitlines(), 2))
    assert first[1] <= second[0]  # one lane: one after another


def test_an_output_over_its_cap_is_not_sent_though_the_command_may_write_more():
    """apt-cache writes its caches (tens of MB) as a reading's part: the file size limit is
    above them; only the output is capped."""
    commands = ["head -c 70000 /dev/zero >/dev/null; head -c 70000 /dev/zero", "head -c 100 /dev/zero"]
    out, _ = run(parts.script(commands, part_bytes=1 << 16, file_bytes=1 << 20), "dash")
    answers = parts.parse(out.splitlines(), 2, part_bytes=1 << 16)
    assert answers[0] == parts.Answer("big", b"", b"") and answers[1] == parts.Answer(0, b"\0" * 100, b"")


def test_the_readings_bytes_are_capped():
    commands = ["head -c 3000 /dev/zero", "head -c 3000 /dev/zero", "echo x"]
    out, _ = run(parts.script(commands, reading_bytes=5000), "dash")
    answers = parts.parse(out.splitlines(), 3)
    assert answers[0].status == 0 and [a.status for a in answers[1:]] == ["over", "over"]


def test_a_reading_that_inherited_a_descriptor_it_cannot_close_refuses_to_start():
    script = "exec 12>&1; dash -c " + shlex.quote(parts.script(["echo x"]))
    process = subprocess.run(["bash", "-c", script], capture_output=True)
    assert process.returncode == 3 and b"inherited descriptor 12" in process.stderr


@pytest.mark.parametrize(
    "lines",
    [
        [],
        ["garbage"],
        ["sparkrig-parts 1", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 4 0", "data b25lCg=="],
        ["sparkrig-parts 1", "part 0 0 4 0", "part 0 0 4 0", "data b25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 1 0 4 0", "data b25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 5 0", "data b25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 4 0", "data b25lCg==b25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 4 0", "data b25lCgb25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 x 4 0", "data b25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 4 0", "data b25l!g==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 4 0 extra", "data b25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 4 0", "data b25lCg== extra", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 4 0", "b25lCg==", "sparkrig-parts-end"],
        ["sparkrig-parts 1", "part 0 0 -4 0", "data -", "sparkrig-parts-end"],
        ["noise", "sparkrig-parts 1", "part 0 0 4 0", "data b25lCg==", "sparkrig-parts-end"],
    ],
)
def test_anything_but_the_structure_is_refused(lines):
    with pytest.raises(ValueError):
        parts.parse(lines, 1)


def test_a_login_shells_preamble_is_skipped_only_when_asked():
    lines = ["Welcome", "sparkrig-parts 1", "part 0 0 4 0", "data b25lCg==", "sparkrig-parts-end"]
    assert parts.parse(lines, 1, preamble=True) == [parts.Answer(0, b"one\n", b"")]


def test_the_outputs_directory_is_removed(tmp_path):
    out, _ = run(parts.script(["readlink /proc/self/fd/1"]), "dash")
    where = Path(parts.parse(out.splitlines(), 1)[0].stdout.decode().strip()).parent
    assert not where.exists() and stat.S_ISDIR(os.stat(where.parent).st_mode)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_contained_command_relays_its_output_and_status_and_leaves_nothing_behind(tmp_path, shell):
    """A user's program run by a command of its own (uv's sync starts the venv's python):
    its double-forked child holding stdout open neither holds the command nor outlives it."""
    program = tmp_path / "python"
    program.write_text(HOSTILE)
    command = f"{sys.executable} -I {program} {tmp_path}; echo said >&2; exit 7"
    started = time.monotonic()
    result = subprocess.run([shell, "-c", parts.contained(command, 20)], capture_output=True, timeout=60)
    assert time.monotonic() - started < 19  # below its 20 s limit
    assert result.returncode == 7 and result.stderr == b"said\n"
    assert result.stdout.startswith(b"part 1 0 7 0\ndata Zm9yZ2VkCg==\nsparkrig-parts-end\n")
    time.sleep(0.2)
    assert not alive(int((tmp_path / "child").read_text()))
    timed_out = subprocess.run([shell, "-c", parts.contained("sleep 30", 1)], capture_output=True, timeout=60)
    assert timed_out.returncode == 124


def test_a_commands_bash_runs_no_start_up_file_of_the_user_over_ssh(tmp_path):
    """Bash that finds SSH_CLIENT in its environment sources ~/.bashrc (Debian builds it so):
    over SSH a user's start-up file would print into every answer of the suite's prefetch,
    whose commands run in the login shell. The executor runs them without it."""
    (tmp_path / ".bashrc").write_text("echo BANNER\n")
    script = parts.script(["uname -s"], shell="/bin/bash")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SSH_CLIENT": "10.0.0.1 5000 22", "SHLVL": "0"}
    process = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    (answer,) = parts.parse(process.stdout.splitlines(), 1)
    assert answer == parts.Answer(0, b"Linux\n", b""), answer


def test_a_contained_command_makes_files_others_may_read(tmp_path):
    """The executor keeps its own files private (umask 077); a contained command (a venv's
    sync) makes files as any command does: a root-owned venv run as nobody must read them."""
    made = tmp_path / "made"
    result = subprocess.run(
        ["sh", "-c", parts.contained(f"touch {made}; stat -c %a {made}", 20)], capture_output=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout == b"644\n", result
