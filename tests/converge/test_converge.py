"""
Converge and idempotence (Molecule's first two steps) against the lab fleet.

The real deploy runs with the pyinfra CLI over SSH against fresh Debian 12
(ssh.service) and Debian 13 (ssh.socket) hosts, then runs again: the second
run must report zero changes on every host.
"""

import time

import pytest

from sparkrig.summary import summary_line
from tests.conftest import LAB_INVENTORY, deploy_summary
from tests.support import run_deploy

pytestmark = pytest.mark.lab


def test_converge_succeeds_on_every_lab_host(lab_hosts, first_converge):
    assert first_converge.returncode == 0, first_converge.log
    assert first_converge.errors() == {}, first_converge.log
    names = {host.name for host in lab_hosts}
    assert first_converge.hosts() == names
    # Fresh hosts: every one of them had something to change.
    assert set(first_converge.changed()) == names, first_converge.log
    # Each run's own summary line (the emulated hosts converge in a run of their own) counts
    # its hosts' changes.
    for run in first_converge.runs or (first_converge,):
        hosts = f"{len(run.hosts())} host" + "s" * (len(run.hosts()) != 1)
        changes = sum(len(ops) for ops in run.changed().values())
        assert f"--> {hosts}, {changes} changes on {hosts}\n" in run.log


def test_every_operation_has_one_name_on_every_host(first_converge):
    """pyinfra's results table shows one name per operation for all its hosts: a name that
    differs between hosts (a setting's value, a fact, a loop's item) labels the other hosts'
    rows wrongly. The lab's hosts differ in Python, venv owner, Docker source and NGC."""
    several = {op["name"]: op["names"] for op in first_converge.operations() if len(op["names"]) != 1}
    assert not several, several


def test_second_converge_reports_zero_changes_on_every_host(first_converge, say):
    assert first_converge.returncode == 0, "the first converge failed; see its test"
    started = time.monotonic()
    say("converge 2/2: deploy.py again, which must change nothing")
    second = run_deploy(LAB_INVENTORY)
    say(f"converge 2/2: {deploy_summary(second)}, in {time.monotonic() - started:.0f} s")
    assert second.returncode == 0, second.log
    changes = [f"{host}: {op}" for host, ops in sorted(second.changed().items()) for op in ops]
    assert not changes, "the second run changed:\n  " + "\n  ".join(changes)
    # The deploy's own line, as it words it for this many hosts (one host of a small lab: "1 host").
    expected = summary_line(len(second.hosts()), {})
    assert second.log.rstrip().endswith(f"--> {expected}"), second.log[-2000:]
    assert second.hosts() == set(first_converge.hosts())


def test_a_converged_host_costs_one_remote_command(first_converge):
    """One reading per host (sparkrig/reading.py): every concern's facts in one command, and
    nothing else on a host with nothing to change. A concern that reads outside the reading
    (host.get_fact in its deploy, a part it did not plan) shows here as a second command."""
    assert first_converge.returncode == 0, "the first converge failed; see its test"
    run = run_deploy(LAB_INVENTORY, "--debug")
    assert run.returncode == 0, run.log[-3000:]
    counted = {host: run.log.count(f"Running command on {host}:") for host in sorted(first_converge.hosts())}
    assert counted == {host: 1 for host in counted}, counted
