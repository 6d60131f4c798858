"""tests/compliance/reads.py: the suite's answers read once are the answers the host gives."""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from testinfra.backend.local import LocalBackend
from testinfra.host import Host

from sparkrig import parts
from tests.compliance import reads

QUESTIONS = ("exists", "is_file", "is_directory", "is_symlink", "is_socket", "is_executable")


def answers(host, path):
    f = host.file(path)
    found = {q: getattr(f, q) for q in QUESTIONS}
    for attribute in ("user", "group", "mode", "uid", "gid", "linked_to"):
        try:
            found[attribute] = getattr(f, attribute)
        except AssertionError:  # testinfra's check_output on a command that failed
            found[attribute] = "failed"
    return found


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "file").chmod(0o640)
    (tmp_path / "dir").mkdir()
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    os.symlink(tmp_path / "file", tmp_path / "link")
    os.symlink(tmp_path / "absent", tmp_path / "dangling")
    (tmp_path / "with space").write_text("y")
    return [str(tmp_path / n) for n in ("file", "dir", "tool", "link", "dangling", "absent", "with space")]


def counting_host(ran: list):
    """A fresh host whose backend records each command in ``ran`` and runs it."""

    def counting(self, command, *args, **kwargs):
        ran.append(command)
        return PLAIN_RUN(self, command, *args, **kwargs)

    return fresh_host(counting)


def fresh_host(run):
    """A testinfra host of its own (testinfra.get_host caches hosts) whose backend runs ``run``."""
    backend = type("Backend", (LocalBackend,), {"run": run})()
    return Host(backend), type(backend)


# LocalBackend.run as testinfra defines it (the compliance suite's conftest may have wrapped it).
PLAIN_RUN = getattr(LocalBackend.run, "__wrapped__", LocalBackend.run)


@contextlib.contextmanager
def seeded_host(found: dict):
    """A counting host (its commands in the list yielded beside it) whose worker holds
    ``found``, the controller's prefetch, as the suite's conftest hands it over."""
    ran = []
    host, backend_class = counting_host(ran)
    reads.install(backend_class)
    name = reads.backend_name(host.backend)
    reads.seed(
        {
            name: {
                c: [rc, base64.b64encode(out).decode(), base64.b64encode(err).decode()]
                for c, (rc, out, err) in found.items()
            }
        }
    )
    try:
        yield host, ran
    finally:
        reads._SEEDS.pop(name, None)


def test_answers_are_the_hosts_and_each_path_costs_one_command(paths):
    plain, _ = fresh_host(PLAIN_RUN)
    expected = {path: answers(plain, path) for path in paths}
    ran = []
    host, backend_class = counting_host(ran)
    reads.install(backend_class)
    assert {path: answers(host, path) for path in paths} == expected
    path_reads = [c for c in ran if c.startswith("p=")]
    assert len(path_reads) == len(paths)
    # The rest: testinfra asking, once, what kind of system it runs on.
    assert sorted(set(ran) - set(path_reads)) == sorted(c for c in ran if c not in path_reads)
    assert all(c.startswith(("uname", "cat /etc/os-release")) for c in ran if c not in path_reads)


def test_a_command_that_may_change_the_host_forgets_what_was_read(tmp_path):
    host, backend_class = fresh_host(PLAIN_RUN)
    reads.install(backend_class)
    path = tmp_path / "later"
    assert not host.file(str(path)).exists
    host.run("touch %s", str(path))
    assert host.file(str(path)).exists
    assert host.check_output("id -nu") == host.check_output("id -nu")


def test_prefetched_constants_are_what_the_host_answers_and_cost_no_command():
    """The controller reads the host-wide constants in one command; a worker answers them
    from that reading, exactly as the host would, and sends none of them itself."""
    plain, _ = fresh_host(PLAIN_RUN)
    expected = {c: plain.run(c) for c in reads.EVERY_HOST}
    with seeded_host(_prefetched(list(reads.EVERY_HOST))) as (host, ran):
        for command, want in expected.items():
            got = host.run(command)
            assert (got.rc, got.stdout, got.stderr) == (want.rc, want.stdout, want.stderr), command
        assert ran == []


_N = len(reads.EVERY_HOST)
_PART = "part {i} 0 3 0\n"
_DATA = "data " + "aWQK" * _N + "\n"  # "id\n" for each part


@pytest.mark.parametrize(
    "output",
    [
        "",  # nothing came back
        f"sparkrig-parts {_N}\n" + _PART.format(i=0) + _DATA + "sparkrig-parts-end\n",  # fewer lines than commands
        f"sparkrig-parts {_N}\n" + "".join(_PART.format(i=i) for i in range(_N)) + _DATA,  # no end
        f"sparkrig-parts {_N}\n" + "".join(f"part {i} x 0 0\n" for i in range(_N)) + "data -\nsparkrig-parts-end\n",
        f"sparkrig-parts {_N}\n"
        + "".join(_PART.format(i=i) for i in range(_N))
        + "data not base64!!\nsparkrig-parts-end\n",
        f"sparkrig-parts {_N}\n"
        + "".join(_PART.format(i=i) for i in range(_N))
        + "data aWQK\nsparkrig-parts-end\n",  # short
        f"sparkrig-parts {_N}\n" + "".join(_PART.format(i=i) for i in range(_N)) + _DATA + "more\nsparkrig-parts-end\n",
    ],
)
def test_a_prefetch_that_does_not_parse_answers_nothing(output):
    """Output that is not whole is never half-used: the controls then ask for themselves."""
    assert reads.parse_prefetch(output, reads.EVERY_HOST) == {}


def test_a_read_that_prints_the_prefetchs_structure_or_writes_to_inherited_descriptors_forges_nothing(tmp_path):
    """A read whose program prints lines of the answer's structure, writes to every
    descriptor it has, and leaves a child holding its output open: its own answer holds
    those bytes, the others are what the host answers, and the prefetch ends."""
    hostile = (
        "echo 'part 0 0 3 0'; echo 'data aWQK'; echo sparkrig-parts-end;"
        " for fd in 3 4 5 6 7 8 9; do (echo 'part 1 0 3 0' >&$fd) 2>/dev/null; done;"
        " setsid sh -c 'while :; do echo still; sleep 0.1; done' & echo $! >" + str(tmp_path / "child")
    )
    commands = ["echo one", hostile, "echo two"]
    script = reads.prefetch_script(commands)
    started = time.monotonic()
    output = subprocess.run(["bash", "-c", "exec 5>&1; " + script], capture_output=True, text=True, timeout=60).stdout
    found = reads.parse_prefetch(output, commands)
    assert time.monotonic() - started < 20
    assert found["echo one"] == (0, b"one\n", b"") and found["echo two"] == (0, b"two\n", b"")
    assert found[hostile][1].startswith(b"part 0 0 3 0\ndata aWQK\nsparkrig-parts-end\n")
    time.sleep(0.2)
    stat = Path(f"/proc/{(tmp_path / 'child').read_text().strip()}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _prefetched(commands: list[str], whole: bool = True) -> dict:
    """What the controller would hand a worker for these commands, read by a real shell here
    (with ``whole``, every one of them answered)."""
    script = reads.prefetch_script(commands)
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    found = reads.parse_prefetch(output, commands)
    assert list(found) == commands or not whole
    return found


def _reader(answers=None) -> reads.Reader:
    return reads.Reader("@local", {}, answers or {})


@reads.need
def listing_and_path(r):
    """A test need: a directory's listing and one path's reading (``r.settings["dir"]``)."""
    return r.run("ls -a %s", r.settings["dir"]), r.path(r.settings["dir"] + "/later")


@reads.need
def two_rounds(r):
    """A test need whose second read is built from its first's answer."""
    first = r.check_output("echo %s", r.settings["dir"])
    return r.run("ls -A %s", first)


def _answer(host, function, settings):
    return reads.answer(host.backend, reads.backend_name(host.backend), function, settings)


def test_a_need_is_answered_from_the_prefetch_with_the_state_at_the_start_and_sends_nothing(tmp_path):
    """The rule: a read-only control sees the host as the prefetch read it; a control that
    acts reads the host again (and sees what it changed)."""
    settings = {"dir": str(tmp_path)}
    planned = _reader()
    planned.settings = settings
    reads.plan(planned)
    with seeded_host(_prefetched(list(planned.wanted))) as (host, ran):
        (tmp_path / "later").write_text("made after the prefetch")
        listing, later = _answer(host, listing_and_path, settings)
        assert listing.stdout == ".\n..\n" and not later.exists
        assert ran == []
        reads.acting = True
        try:
            listing, later = _answer(host, listing_and_path, settings)
        finally:
            reads.acting = False
        assert "later" in listing.stdout and later.exists and later.is_file
        assert len(ran) == 1  # both reads in one command


@reads.need(prefetch=False)
def asked_live(r):
    """A test need only action controls ask (as the venv interpreter's answers)."""
    return r.run("ls -a %s", r.settings["dir"] + "/live")


def test_a_need_left_out_of_the_prefetch_is_planned_by_no_reading_and_answered_when_asked(tmp_path):
    """What runs the venv's interpreter (seconds for torch) is no part of the one reading a
    read-only run waits for: the plan leaves it out, the control that asks reads it then."""
    planned = _reader()
    planned.settings = {"dir": str(tmp_path)}
    reads.plan(planned)
    assert f"cd / && ls -a {tmp_path}" in planned.wanted
    assert not [command for command in planned.wanted if "/live" in command]
    (tmp_path / "live").mkdir()
    ran = []
    host, backend_class = counting_host(ran)
    reads.install(backend_class)
    reads.acting = True
    try:
        assert _answer(host, asked_live, {"dir": str(tmp_path)}).stdout == ".\n..\n"
    finally:
        reads.acting = False
    assert len(ran) == 1
    with pytest.raises(reads.OutsideTheLayer, match="asked by action controls only"):
        _answer(host, asked_live, {"dir": str(tmp_path)})  # a read-only control: refused
    assert len(ran) == 1


def test_whatever_the_prefetch_lacks_is_read_in_one_command_per_round(tmp_path):
    ran = []
    host, backend_class = counting_host(ran)
    reads.install(backend_class)
    (tmp_path / "x").write_text("")
    assert "x" in _answer(host, two_rounds, {"dir": str(tmp_path)}).stdout.split()
    assert len(ran) == 2


def test_the_prefetch_of_local_reads_every_need_in_two_rounds(tmp_path):
    """@local (testinfra's local backend) gets the same one reading as an SSH host."""
    (tmp_path / "x").write_text("")
    calls = []
    read = reads._read

    def counted(ssh_config, name, commands):
        calls.append(name)
        return read(ssh_config, name, commands)

    reads._read = counted
    try:
        found = reads.prefetch(
            "",
            ["@local"],
            ["id -nu"],
            {"@local": lambda answers: reads.Reader("@local", {"dir": str(tmp_path)}, answers)},
        )
    finally:
        reads._read = read
    assert calls == ["@local", "@local"]
    reads.seed(found)
    try:
        ran = []
        host, backend_class = counting_host(ran)
        reads.install(backend_class)
        assert "x" in _answer(host, two_rounds, {"dir": str(tmp_path)}).stdout.split()
        assert ran == []
    finally:
        reads._SEEDS.pop("@local", None)


def test_a_read_only_control_cannot_read_the_host_outside_its_needs(tmp_path):
    host, backend_class = fresh_host(PLAIN_RUN)
    reads.install(backend_class)
    reads.guarded = True
    try:
        with pytest.raises(reads.OutsideTheLayer, match="through testinfra's host"):
            host.run("true")
        assert _answer(host, two_rounds, {"dir": str(tmp_path)}).rc == 0  # the layer itself reads
    finally:
        reads.guarded = False
    assert host.run("true").rc == 0


def test_only_a_registered_need_is_answered():
    def unregistered(r):
        return r.run("true")

    with pytest.raises(reads.OutsideTheLayer, match="is not a need"):
        _answer(fresh_host(PLAIN_RUN)[0], unregistered, {})


def test_each_read_is_killed_after_its_time_limit(monkeypatch):
    monkeypatch.setattr(reads, "READ_TIMEOUT_S", 1)
    started = time.monotonic()
    found = _prefetched(["sleep 30; echo never"])
    assert found["sleep 30; echo never"][0] == 124 and time.monotonic() - started < 10


def test_an_answer_reads_as_testinfra_reads_and_says_what_failed():
    answer = reads.Answer({"t": (1, b"out\n", b"bad \xff\n")}, "t", "false")
    assert (answer.rc, answer.stdout, answer.succeeded) == (1, "out\n", False)
    with pytest.raises(AssertionError, match=r"false failed \(exit 1\): bad \ufffd"):
        answer.check()
    with pytest.raises(reads.Pending):
        reads.Answer({}, "t", "false").rc


def test_a_failed_bounded_read_names_the_file_and_why_not_the_readers_script(tmp_path):
    """On a host sparkrig never converged (the lent GPU machine) a missing file's control
    said `timeout -k 1 10 sh -c 'case $1 in /*) ...` and twenty lines of the reader's shell,
    then nothing: the reader is silent about a file that is not there."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "file").write_text("xy")
    os.symlink(tmp_path / "real", tmp_path / "via")
    cases = {
        tmp_path / "absent": (1, "no such file, or its directory cannot be entered"),
        tmp_path / "no-dir" / "file": (1, "no such file, or its directory cannot be entered"),
        tmp_path / "via" / "file": (1, f"sparkrig: {tmp_path}/via/file has a link on its way: read as missing"),
        tmp_path / "real" / "file": (2, f"sparkrig: {tmp_path}/real/file is over 1 bytes: not read"),
    }
    found: dict = {}
    reader = reads.Reader("@local", {}, found)
    asked = {path: reader.user_file(shlex.quote(str(path)), 1) for path in cases}
    found.update(_prefetched(list(reader.wanted)))
    for path, (status, said) in cases.items():
        with pytest.raises(AssertionError) as failed:
            asked[path].check()
        message = str(failed.value)
        assert message == f"reading {path} (sparkrig's bounded reader) failed (exit {status}): {said}", message
    shown = reader.user_file(shlex.quote(str(tmp_path / "absent")), 1, as_user="nobody").shown
    assert shown == f"reading {tmp_path}/absent as nobody (sparkrig's bounded reader)"


@reads.need
def where_and_who(r):
    """A test need: the working directory of a read, as the user and as root."""
    return r.run("pwd"), r.run("pwd; id -u", sudo=True)


def test_every_read_runs_from_the_root_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain, as_root = _answer(fresh_host(PLAIN_RUN)[0], where_and_who, {})
    assert plain.check() == "/" and as_root.check() == "/\n0"


# A STAND-IN for ssh and the host behind it (no sshd runs here; the lab's hosts are real):
# it runs the command it is given in a real shell here, after printing what the host's
# login shell prints first. Host "latin1" has a Latin-1 banner in its .bashrc.
STANDIN_SSH = r"""#!/bin/sh
n=$#; i=0
for a; do i=$((i+1)); [ "$i" -eq $((n-1)) ] && host=$a; [ "$i" -eq "$n" ] && cmd=$a; done
[ "$host" = latin1 ] && printf 'Gr\374\337 Gott auf %s\n' "$host"
exec sh -c "$cmd"
"""


def test_a_host_printing_bytes_that_are_not_utf8_is_read_and_stops_no_other_host(tmp_path, monkeypatch):
    """One host's Latin-1 banner raised UnicodeDecodeError out of the
    prefetch, and no control ran on any host. The real prefetch, through a stand-in ssh."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(STANDIN_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    found = reads.prefetch(str(tmp_path / "ssh_config"), ["latin1", "plain"], reads.EVERY_HOST)
    assert sorted(found) == ["latin1", "plain"]
    expected = subprocess.run(["sh", "-c", "id -nu"], capture_output=True, check=True).stdout
    for name in found:
        rc, out, _err = found[name]["id -nu"]
        assert (rc, base64.b64decode(out)) == (0, expected), name


def test_a_failed_reads_message_escapes_what_the_host_printed():
    """A host's program prints terminal escapes on stderr: the control's failure names them
    escaped, never raw (pytest shows the message on the operator's terminal)."""
    command = "venv-python"
    answers = {command: (1, b"", b"forged\n\x1b]0;pwned\x07\x1b[31mred\x1b[0m\n\xff")}
    with pytest.raises(AssertionError) as failed:
        reads.Answer(answers, command, command).check()
    message = str(failed.value)
    assert "\x1b" not in message and "\x07" not in message
    assert "\\x1b]0;pwned\\x07" in message and message.startswith("venv-python failed (exit 1): forged\n")


def test_a_login_shell_of_the_suite_reads_the_systems_profile_and_nothing_of_the_users(tmp_path):
    """A user's start-up files can run anything and take any time (a pyenv hook): the
    suite's login shells read /etc/profile alone, run here by the real bash."""
    for name in (".profile", ".bash_profile", ".bash_login", ".bashrc"):
        (tmp_path / name).write_text(f"touch {tmp_path}/ran{name}\nexport FROM_USER=1\n")
    result = subprocess.run(
        ["/bin/sh", "-c", "PATH=/usr/bin:/bin " + reads.system_login('echo "PATH=$PATH FROM_USER=$FROM_USER"')],
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/nowhere"},
        check=True,
    )
    assert result.stdout.endswith(" FROM_USER=\n") and "/usr/local/bin" in result.stdout  # /etc/profile's PATH
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ran")) == []


# STAND-INS for a login user who is not root: `id -u` says 1000 (everything else is the real
# id's), and sudo logs each call and runs its command here (this test runs as root or not).
STANDIN_ID = """#!/bin/sh
[ "$1" = -u ] && [ "$#" -eq 1 ] && { echo 1000; exit 0; }
exec /usr/bin/id "$@"
"""
STANDIN_SUDO = """#!/bin/sh
echo "sudo $1 $2 $3" >>"$SUDO_LOG"
[ -e "$SUDO_LOG.refuse" ] && { echo 'sudo: a password is required' >&2; exit 1; }
[ "$1" = -n ] && [ "$2" = -- ] || exit 99
shift 2
exec "$@"
"""


def _not_root(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("id", STANDIN_ID), ("sudo", STANDIN_SUDO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "sudo.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SUDO_LOG", str(log))
    return log


def test_roots_reads_of_a_round_run_behind_one_sudo_each_answered_as_alone(tmp_path, monkeypatch):
    """Three reads as root and one as the login user: one sudo, and each answer what the
    read alone answers (its status, output and error), in any order of the commands."""
    log = _not_root(tmp_path, monkeypatch)
    root = [
        reads.command_text("echo one; echo err >&2; exit 3", sudo=True),
        reads.command_text("pwd", sudo=True),
        reads.command_text("echo %s", "it's 'quoted'", sudo=True),
    ]
    commands = [root[0], "echo mine", *root[1:]]
    found = _prefetched(commands)
    assert log.read_text().count("\n") == 1
    assert found[root[0]] == (3, b"one\n", b"err\n")
    assert found["echo mine"] == (0, b"mine\n", b"")
    assert found[root[1]] == (0, b"/\n", b"") and found[root[2]] == (0, b"it's 'quoted'\n", b"")


def test_a_sudo_refused_answers_each_of_roots_reads_with_its_refusal(tmp_path, monkeypatch):
    log = _not_root(tmp_path, monkeypatch)
    (tmp_path / "sudo.log.refuse").touch()
    root = [reads.command_text("echo one", sudo=True), reads.command_text("echo two", sudo=True)]
    found = _prefetched(["echo mine", *root])
    assert found["echo mine"] == (0, b"mine\n", b"")
    assert [found[c] for c in root] == [(1, b"", b"sudo: a password is required\n")] * 2
    assert log.read_text().count("\n") == 1


def test_roots_reads_are_each_killed_after_their_limit_and_the_others_answered(monkeypatch):
    monkeypatch.setattr(reads, "ROOT_READ_TIMEOUT_S", 1)
    monkeypatch.setattr(reads, "UNIT_READS", 1)
    slow, quick = reads.command_text("sleep 30; echo never", sudo=True), reads.command_text("echo quick", sudo=True)
    started = time.monotonic()
    found = _prefetched([slow, quick])
    assert found[slow][0] == 124 and found[quick] == (0, b"quick\n", b"")
    assert time.monotonic() - started < 10


def test_reads_share_units_only_where_the_lanes_are_full():
    """A round's first reading (about 160 reads) runs UNIT_READS to a unit; a small round
    (the second: a few reads) keeps every lane busy with one read each."""
    first = reads.units(159)
    assert [len(u) for u in first] == [reads.UNIT_READS] * (159 // reads.UNIT_READS) + [159 % reads.UNIT_READS]
    assert reads.units(reads.PREFETCH_LANES) == [[i] for i in range(reads.PREFETCH_LANES)]
    assert [len(u) for u in reads.units(3 * reads.PREFETCH_LANES)] == [3] * reads.PREFETCH_LANES
    assert sorted(i for u in reads.units(37) for i in u) == list(range(37))


@pytest.mark.parametrize("sudo", [False, True], ids=["mine", "roots"])
def test_a_read_killed_in_its_unit_leaves_the_reads_after_it_to_their_controls(monkeypatch, sudo):
    """Reads share a unit (one shell, one limit): the one past the limit is answered as
    killed, those its unit never reached are not answered (their controls read them alone),
    and the other units' are."""
    monkeypatch.setattr(reads, "READ_TIMEOUT_S", 1)
    monkeypatch.setattr(reads, "ROOT_READ_TIMEOUT_S", 1)
    monkeypatch.setattr(reads, "UNIT_READS", 3)
    monkeypatch.setattr(reads, "PREFETCH_LANES", 1)
    first, slow, cut, other = (
        reads.command_text(text, sudo=sudo) for text in ("echo first", "sleep 30", "echo cut", "echo other")
    )
    started = time.monotonic()
    found = _prefetched([first, slow, cut, other], whole=False)
    assert time.monotonic() - started < 10
    assert found[first] == (0, b"first\n", b"") and found[slow][0] == 124 and found[other] == (0, b"other\n", b"")
    assert cut not in found


def test_a_root_group_whose_output_is_not_whole_answers_none_of_roots_reads():
    """A group's stdout that is not the executor's structure (what a sudo lecture would
    print, or a cut output) answers none of root's reads: their controls read them again."""
    root = [reads.command_text("echo one", sudo=True), reads.command_text("echo two", sudo=True)]
    commands = ["echo mine", *root]
    cut = parts.printed([parts.Answer(0, b"one\n", b"")])
    output = parts.printed([parts.Answer(0, "\n".join(cut).encode() + b"\n", b""), parts.Answer(0, b"mine\n", b"")])
    assert reads.parse_prefetch("\n".join(output), commands) == {"echo mine": (0, b"mine\n", b"")}


def test_only_what_command_text_made_joins_roots_group():
    """A command that merely begins as root's does (its quoting the login shell's to expand)
    runs alone, as written."""
    assert reads._as_root(reads.command_text("echo $HOME", sudo=True)) == "cd / && echo $HOME"
    assert reads._as_root(reads.AS_ROOT + '"$HOME"') is None
    assert reads._as_root(reads.AS_ROOT + "'a' 'b'") is None


@reads.need(peers=True)
def peer_question(r):
    """A test need a control asks of a cluster's peers too."""
    return r.run("echo peer-%s", r.name)


def test_a_peer_a_limit_leaves_out_is_read_for_what_controls_ask_of_peers_alone():
    """read_node's questions of a cluster peer outside --limit come from the prefetch, which
    plans of that peer only the needs marked peers=True."""
    from sparkrig.settings import all_settings, defaults  # noqa: PLC0415 - every concern's settings
    from tests.compliance import conftest  # noqa: PLC0415 - the suite's conftest, as a module

    base = defaults(all_settings())
    node = {**base, "cluster_name": "pair", "cluster_interfaces": {"cx7": "192.168.100.11/24"}}
    everyone = {
        "a": node,
        "b": {**node, "cluster_interfaces": {"cx7": "192.168.100.12/24"}},
        "c": {**node, "cluster_name": "other", "cluster_interfaces": {"cx7": "192.168.101.12/24"}},
        "d": base,
    }
    peers = conftest.peer_readers({"a": everyone["a"]}, everyone)
    assert list(peers) == ["b"]
    reader = peers["b"]({})
    reads.plan(reader)
    assert reads.command_text("echo peer-%s", "b") in reader.wanted
    assert reads.command_text("pwd") not in reader.wanted  # where_and_who: no peer's need
    assert conftest.peer_readers({"d": base}, everyone) == {}  # in no cluster: no peer
    found = reads.prefetch("", ["@local"], ["true"], {"@local": lambda answers: peers["b"](answers)})
    assert reads.command_text("echo peer-%s", "b") in found["@local"]


def test_the_prometheus_host_s_reading_asks_for_every_host_it_scrapes_outside_a_cluster_too():
    """The fleet's Prometheus is asked to list every host the inventory serves (it waits,
    bounded, for one not listed yet): the prefetch plans that read with the whole inventory,
    a --limit and no cluster notwithstanding, or the control would read it again itself."""
    from sparkrig.settings import all_settings, defaults  # noqa: PLC0415 - every concern's settings
    from tests.compliance import conftest  # noqa: PLC0415 - the suite's conftest, as a module

    base = {**defaults(all_settings()), "prometheus_server": "p"}
    everyone = {"p": base, "q": base, "r": {**base, "metrics_enabled": False}}
    reader = conftest.readers(None, {"p": base}, lambda: everyone)["p"]({})
    reads.plan(reader)
    asked = [text for text in reader.wanted if "/api/v1/targets" in text]
    assert len(asked) == 1 and asked[0].endswith(" 2"), asked  # p and q serve metrics, r does not
