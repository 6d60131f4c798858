"""tests/compliance/reads.py: the suite's answers read once are the answers the host gives."""

from __future__ import annotations

import base64
import os

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
    import subprocess
    plain, _ = fresh_host(PLAIN_RUN)
    expected = {c: plain.run(c) for c in reads.EVERY_HOST}
    script = reads.prefetch_script(reads.EVERY_HOST, "n0nce")
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    found = reads.parse_prefetch(output, reads.EVERY_HOST, "n0nce")
    assert list(found) == list(reads.EVERY_HOST)
    ran = []
    host, backend_class = counting_host(ran)
    reads.install(backend_class)
    name = host.backend.get_hostname()
    reads.seed({name: {c: [rc, base64.b64encode(out).decode(), base64.b64encode(err).decode()]
                       for c, (rc, out, err) in found.items()}})
    try:
        for command, want in expected.items():
            got = host.run(command)
            assert (got.rc, got.stdout, got.stderr) == (want.rc, want.stdout, want.stderr), command
        assert ran == []
    finally:
        reads._SEEDS.pop(name, None)


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


def test_only_host_wide_constants_can_be_prefetched():
    with pytest.raises(ValueError, match="not a host-wide constant"):
        reads.prefetch_script(["spark-jobs list"], "n0nce")
