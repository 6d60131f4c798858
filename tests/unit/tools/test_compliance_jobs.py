"""The job controls' verdicts do not depend on timing, and their failures name the check:
the detached-job control waits (bounded) for the job it started to be listed; the preflight
control fails with spark-preflight's FAIL line, not its first line."""

from __future__ import annotations

import contextlib
import re
from types import SimpleNamespace

import pytest

from tests.compliance import test_jobs

OUTPUT = (
    "OK memory: MemAvailable 9 KiB >= 1 KiB\nOK swap: no swap is active\n{watchdog}\n"
    "OK strays: none\nSKIP gpu: no nvidia-smi\n"
)


def _preflight(rc, watchdog="OK watchdog: earlyoom.service is active", stderr=""):
    answer = SimpleNamespace(rc=rc, stdout=OUTPUT.format(watchdog=watchdog), stderr=stderr)
    return lambda need: {"preflight": answer}


def test_preflight_passes_when_every_check_is_ok_or_skipped():
    test_jobs.test_spark_preflight_passes_on_a_converged_host(_preflight(0))


def test_a_failed_preflight_says_which_check_failed_first():
    failed = "FAIL watchdog: earlyoom.service is not active: nothing acts before memory runs out"
    with pytest.raises(AssertionError) as error:
        test_jobs.test_spark_preflight_passes_on_a_converged_host(_preflight(16, failed))
    assert str(error.value).splitlines()[0] == f"spark-preflight (exit 16): {failed}"


def test_a_preflight_that_exits_non_zero_with_every_check_ok_says_what_it_said():
    with pytest.raises(AssertionError, match="exited 2 with every check OK or SKIP: spark-preflight: bad option"):
        test_jobs.test_spark_preflight_passes_on_a_converged_host(_preflight(2, stderr="spark-preflight: bad option\n"))


def _short(rc, stdout, stderr=""):
    answer = SimpleNamespace(rc=rc, stdout=stdout, stderr=stderr)
    return lambda need: {"preflight_short": answer}


@pytest.mark.parametrize("rc", [4, 4 + 8 + 64])
def test_a_threshold_above_the_memory_fails_the_memory_check(rc):
    test_jobs.test_spark_preflight_fails_when_memory_is_short(_short(rc, "FAIL memory: MemAvailable 9 KiB < 1 KiB\n"))


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "said"),
    [
        # 127 has the memory bit set: the program missing is no check's verdict (it passed once).
        (
            127,
            "",
            "sh: 1: eval: spark-preflight: not found\n",
            "exited 127, not 4 (memory): sh: 1: eval: spark-preflight",
        ),
        (0, OUTPUT.format(watchdog="OK watchdog: on"), "", "exited 0, not 4 (memory): OK memory: MemAvailable 9 KiB"),
        (8, "OK memory: MemAvailable 9 KiB >= 1 KiB\nFAIL swap: on\n", "", "exited 8, not 4 (memory): OK memory"),
        (4, "", "", "exited 4, not 4 (memory): no memory line, nothing on stderr"),
        (4, "OK memory: MemAvailable 9 KiB >= 1 KiB\n", "", "exited 4, not 4 (memory): OK memory"),
    ],
)
def test_a_preflight_that_is_not_the_memory_failure_says_what_it_was(rc, stdout, stderr, said):
    with pytest.raises(AssertionError, match=re.escape(said)):
        test_jobs.test_spark_preflight_fails_when_memory_is_short(_short(rc, stdout, stderr))


class JobHost:
    """A host whose systemd lists a detached job only some polls after spark-run returned."""

    def __init__(self, listed_after: int, state: str = "active"):
        self.listed_after, self.state, self.polls, self.started = listed_after, state, 0, False

    @contextlib.contextmanager
    def sudo(self):
        yield

    def _listed(self) -> bool:
        return self.started and self.polls > self.listed_after

    def check_output(self, command, *args):
        if command.startswith("spark-run --detach"):
            self.started = True
            return "spark-run: started"
        assert command == "spark-jobs list"
        self.polls += 1
        row = f"\n{args[0] if args else self.name} root {self.state} - - - -" if self._listed() else ""
        return "NAME USER STATE START MEMORY PEAK EXIT" + row

    def run(self, command, *args):
        if command.startswith("spark-run --detach"):
            said = "spark-run: a job named x is active" if self._listed() else ""
            return SimpleNamespace(rc=1 if said else 0, stderr=said)
        said = "spark-jobs: x is root's job: only root may act on it" if self._listed() else "no job named x"
        return SimpleNamespace(rc=1, stderr=said)


@pytest.fixture
def no_sleep(monkeypatch):
    monkeypatch.setattr(test_jobs.time, "sleep", lambda _s: None)


def test_the_running_job_control_waits_for_the_job_it_started(no_sleep):
    host = JobHost(listed_after=3)
    host.name = "sparkrig-check-1"
    test_jobs.test_a_running_job_name_is_refused_and_others_jobs_cannot_be_stopped(host, "alice", host.name)
    assert host.polls > 3


def test_a_job_that_never_runs_fails_saying_what_was_listed(no_sleep, monkeypatch):
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(test_jobs.time, "monotonic", lambda: next(clock))
    host = JobHost(listed_after=0, state="failed")
    host.name = "sparkrig-check-2"
    listed = r"did not become active within 60 s: \['sparkrig-check-2', 'root', 'failed'"
    with pytest.raises(AssertionError, match=listed):
        test_jobs.test_a_running_job_name_is_refused_and_others_jobs_cannot_be_stopped(host, "alice", host.name)
