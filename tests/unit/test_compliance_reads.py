"""tests/compliance/reads.py: the suite's answers read once are the answers the host gives."""

from __future__ import annotations

import os

import pytest
import testinfra
from testinfra.backend.local import LocalBackend

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


def test_answers_are_the_hosts_and_each_path_costs_one_command(paths, monkeypatch):
    plain = testinfra.get_host("local://")
    expected = {path: answers(plain, path) for path in paths}
    ran = []
    original = LocalBackend.run

    def counting(self, command, *args, **kwargs):
        ran.append(command)
        return original(self, command, *args, **kwargs)

    monkeypatch.setattr(LocalBackend, "run", counting)
    reads.install(LocalBackend)
    host = testinfra.get_host("local://")
    assert {path: answers(host, path) for path in paths} == expected
    assert len(ran) == len(paths)


def test_a_command_that_may_change_the_host_forgets_what_was_read(tmp_path, monkeypatch):
    monkeypatch.setattr(LocalBackend, "run", LocalBackend.run)
    reads.install(LocalBackend)
    host = testinfra.get_host("local://")
    path = tmp_path / "later"
    assert not host.file(str(path)).exists
    host.run("touch %s", str(path))
    assert host.file(str(path)).exists
    assert host.check_output("id -nu") == host.check_output("id -nu")
