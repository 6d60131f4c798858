"""tests/compliance/reads.py: the suite's answers read once are the answers the host gives."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess

import pytest
from testinfra.backend.local import LocalBackend
from testinfra.host import Host

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
    name = host.backend.get_hostname()
    reads.seed({name: {c: [rc, base64.b64encode(out).decode(), base64.b64encode(err).decode()]
                       for c, (rc, out, err) in found.items()}})
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


@pytest.mark.parametrize("output", [
    "",  # nothing came back
    "n0nce:0:aWQ=:\n",  # fewer lines than commands
    "other:0::\n" * len(reads.EVERY_HOST),  # another run's nonce (or a host printing look-alikes)
    "n0nce:x::\n" * len(reads.EVERY_HOST),  # no exit status
    "n0nce:0:not base64!:\n" * len(reads.EVERY_HOST),
])
def test_a_prefetch_that_does_not_parse_answers_nothing(output):
    """Output that is not whole is never half-used: the controls then ask for themselves."""
    assert reads.parse_prefetch(output, reads.EVERY_HOST, "n0nce") == {}


def _prefetched(plan: reads.Plan | list[str]) -> dict:
    """What the controller would hand a worker for ``plan`` (or these commands), read by a
    real shell here."""
    commands = list(plan) if isinstance(plan, list) else list(plan.wanted)
    script = reads.prefetch_script(commands, "n0nce")
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    found = reads.parse_prefetch(output, commands, "n0nce")
    assert list(found) == commands
    return found


def test_declared_reads_answer_read_only_controls_with_the_state_at_the_start(tmp_path):
    """A declared command and a declared path are answered from the prefetch, as the host
    answered them then (the rule: the host's state at the suite's start); a control that
    acts asks the host, and sees what it changed."""
    target = tmp_path / "later"
    plan = reads.Plan()
    plan.run("ls -a %s", str(tmp_path))
    plan.path(str(target))
    found = _prefetched(plan)
    try:
        with seeded_host(found) as (host, ran):
            target.write_text("made after the prefetch")
            assert host.run("ls -a %s", str(tmp_path)).stdout == ".\n..\n"
            assert not host.file(str(target)).exists
            asked = [c for c in ran if not c.startswith(("uname", "cat /etc/os-release"))]  # testinfra's own
            assert asked == []
            reads.acting = True
            assert host.file(str(target)).exists
            assert "later" in host.run("ls -a %s", str(tmp_path)).stdout
            assert len([c for c in ran if not c.startswith(("uname", "cat /etc/os-release"))]) == 2
    finally:
        reads.acting = False


def test_a_read_nobody_declared_is_asked_of_the_host(tmp_path):
    plan = reads.Plan()
    plan.run("echo declared")
    found = _prefetched(plan)
    with seeded_host(found) as (host, ran):
        assert host.check_output("echo declared") == "declared"
        assert host.check_output("echo undeclared") == "undeclared"
        assert ran == ["echo undeclared"]


def test_sudo_reads_are_keyed_as_testinfra_sends_them():
    """A read declared with sudo is the command host.sudo() sends, never the user's own."""
    plan = reads.Plan()
    sent = plan.run("cat %s", "/etc/shadow", sudo=True)
    backend = LocalBackend()
    host = Host(backend)
    with host.sudo():
        assert backend.get_command("cat %s", "/etc/shadow") == sent
    with host.sudo("spark"):
        assert backend.get_command("id -u") == reads.Plan().run("id -u", sudo=True, user="spark")
    assert "cat /etc/shadow" not in plan.wanted


def test_a_declaration_can_use_an_earlier_rounds_answer():
    plan = reads.Plan()
    plan.run("echo 42")
    plan.path("/")
    second = reads.Plan(_prefetched(plan))
    assert second.known("echo 42") == "42\n" and second.known("echo 43") is None
    assert second.known_path("/")["test -d"] == "1"


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
    """Issue 35, finding 5: one host's Latin-1 banner raised UnicodeDecodeError out of the
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
