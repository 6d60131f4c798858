"""The line that ends every deploy (sparkrig/summary.py, registered by config.py)."""

from __future__ import annotations

import subprocess

import pytest

from sparkrig.summary import summary_line
from tests.support import PYINFRA, REPO


@pytest.mark.parametrize(
    ("hosts", "changes", "failed", "line"),
    [
        (4, {"a": 0, "b": 0, "c": 0, "d": 0}, [], "4 hosts, no changes"),
        (4, {"a": 3, "b": 0, "c": 12, "d": 0}, [], "4 hosts, 15 changes on 2 hosts"),
        (1, {"a": 1}, [], "1 host, 1 change on 1 host"),
        (3, {"a": 2, "b": 0}, ["c"], "3 hosts, 2 changes on 1 host; failed on 1 host: c"),
        (2, {}, ["b", "a"], "2 hosts, no changes; failed on 2 hosts: a, b"),
    ],
)
def test_summary_line(hosts, changes, failed, line):
    assert summary_line(hosts, changes, failed) == line


def _pyinfra_local(*operation: str) -> subprocess.CompletedProcess[str]:
    """The real CLI from the repository (so config.py is loaded) against this machine, with an
    operation that changes nothing here, or runs ``true``/``false``."""
    return subprocess.run([PYINFRA, "-y", "@local", *operation], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("operation", "last_line"),
    [
        (("files.directory", "path=/tmp"), "--> 1 host, no changes"),
        (("exec", "--", "true"), "--> 1 host, 1 change on 1 host"),
        (("exec", "--", "false"), "--> 1 host, no changes; failed on 1 host: @local"),
    ],
)
def test_a_deploy_ends_with_its_summary_line(operation, last_line):
    result = _pyinfra_local(*operation)
    lines = [line for line in result.stderr.splitlines() if line.startswith("--> ")]
    summary = [line for line in lines if " host, " in line or " hosts, " in line]
    assert summary == [last_line], result.stderr
    # After the results table and the disconnect; only pyinfra's own error may follow.
    assert lines[lines.index(last_line) - 1] == "--> Disconnecting from hosts...", result.stderr


def test_a_dry_run_has_no_summary_line():
    result = _pyinfra_local("--dry", "exec", "--", "true")
    assert result.returncode == 0, result.stderr
    assert " 1 host, " not in result.stderr, result.stderr
