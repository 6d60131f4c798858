"""
Reboots, drained: what a gated rollout (:mod:`sparkrig.tools.rollout`) does, after a batch converged, to
the hosts of it that need a reboot (a newer kernel installed than the one running,
/run/reboot-required, a firmware update staged for the next boot), as ``updates_reboot`` allows.

Each host is drained (``spark-jobs drain``: spark-run starts no new job), its running detached
jobs (containers started with ``spark-container --detach`` among them) are waited for up to
``updates_drain_timeout`` seconds of wall-clock time; a host whose jobs are still running then
is left out, undrained and reported (with ``--force`` its jobs are stopped instead). Then it is
rebooted, waited for until it answers with a new boot id, and its kernel and driver are checked
(``updates_expected_kernel``/``_driver``, and no reason for a reboot left); then undrained, and
the rollout runs the compliance suite on the batch (whose job controls start jobs: a drained
host could not pass them). A host whose checks fail stays drained. Nodes of one
cluster (one ``cluster_name``) are drained together and rebooted one at a time; a node that
does not come back keeps the others of its cluster from going down.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sparkrig import host_output
from sparkrig.host_output import printable
from sparkrig.operations.jobs.operations import PATHS as JOB_COMMANDS
from sparkrig.operations.updates.boots import ROLLOUT_MARK
from sparkrig.operations.updates.cmdline import cmdline_reasons
from sparkrig.operations.updates.facts import reboot_reasons, unexpected

# A host's reboot outcome, as the state file and the table keep it.
REBOOTED, DRAINED_OUT, REBOOT_FAILED = "rebooted", "drained-out", "reboot failed"
# Under way (a rollout stopped there undrains the host once it proves it on --resume).
DRAINING, REBOOTING = "draining", "rebooting"

# How long a rebooted host may take to answer again; how often a drain is polled.
BOOT_TIMEOUT_S = 900
POLL_S = 5.0


def firmware_reasons(firmware: Mapping[str, Any]) -> list[str]:
    """fwupd's reading (:class:`sparkrig.operations.updates.facts.Firmware`) as reboot reasons:
    an update staged for the next boot (its ``reboot``), e.g. one the DGX Dashboard installed.
    ``updates_firmware = "apply"`` also leaves /run/reboot-required, which the versions read."""
    return reboot_reasons(
        {"boot_kernels": [], "kernel": "", "reboot_required": False},
        [firmware["reboot"]] if firmware.get("reboot") else [],
    )


# What says a host needs a reboot: facts pyinfra reads, each with what turns its value into
# reasons (one line each).
REBOOT_READINGS: list[tuple[str, Callable[[Any], list[str]]]] = [
    ("sparkrig.operations.updates.facts.Versions", reboot_reasons),
    ("sparkrig.operations.updates.facts.Firmware", firmware_reasons),
    ("sparkrig.operations.updates.cmdline.KernelCmdline", cmdline_reasons),
]
BOOT_ID_FACT = "sparkrig.operations.updates.facts.BootId"
VERSIONS_FACT = "sparkrig.operations.updates.facts.Versions"


class HostError(RuntimeError):
    """A command or a reading failed on one host; the message says what and why."""


@dataclass
class Reading:
    boot_id: str
    reasons: list[str]
    versions: dict = field(default_factory=dict)


class Hosts(Protocol):
    """What the reboot needs of the hosts (the real one runs pyinfra; unit tests give theirs)."""

    def read(self, host: str) -> Reading: ...
    def drain(self, host: str, why: str) -> None: ...
    def running(self, host: str) -> list[str]: ...
    def stop(self, host: str, jobs: Sequence[str], wait: int) -> None: ...
    def reboot(self, host: str) -> None: ...
    def undrain(self, host: str) -> None: ...


def groups(hosts: Sequence[str], settings: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """``hosts`` by cluster (one ``cluster_name``), each host without one alone, in order."""
    found: dict[str, list[str]] = {}
    for host in hosts:
        found.setdefault(settings[host].get("cluster_name") or f"\0{host}", []).append(host)
    return list(found.values())


def reboot_batch(
    hosts: Sequence[str],
    settings: Mapping[str, Mapping[str, Any]],
    remote: Hosts,
    force: bool,
    note: Callable[[str, str, str], None],
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, tuple[str, str]]:
    """Reboot the ``hosts`` (a converged batch) that need it and may (``updates_reboot`` is
    "when-required": the others are not even read, the deploy reports their pending reboot);
    each host touched, with its outcome and why. ``note(host, outcome, why)`` is told of every
    step (the rollout saves its state there)."""
    outcome: dict[str, tuple[str, str]] = {}
    readings: dict[str, Reading] = {}
    needed = []
    for host in [h for h in hosts if settings[h]["updates_reboot"] == "when-required"]:
        try:
            reading = remote.read(host)
        except HostError as error:
            outcome[host] = (REBOOT_FAILED, f"reboot: could not read whether it needs one: {error}")
            continue
        if not reading.reasons:
            continue
        readings[host] = reading
        needed.append(host)
    for group in groups(needed, settings):
        outcome.update(_reboot_group(group, settings, readings, remote, force, note, say, clock, sleep))
    for host, (kind, why) in outcome.items():
        note(host, kind, why)
    return outcome


def _reboot_group(group, settings, readings, remote, force, note, say, clock, sleep) -> dict[str, tuple[str, str]]:
    """Drain a cluster's nodes (or one host) together, wait for their jobs, reboot them one at a time."""
    outcome: dict[str, tuple[str, str]] = {}
    deadline = {}
    for host in group:
        note(host, DRAINING, "")
        why = f"rollout: reboot ({'; '.join(readings[host].reasons)})"
        try:
            remote.drain(host, why)
        except HostError as error:
            outcome[host] = (REBOOT_FAILED, f"reboot: could not drain it: {error}")
            continue
        deadline[host] = clock() + settings[host]["updates_drain_timeout"]
        say(f"{host}: draining ({why[len('rollout: ') :]})")
    ready = _wait_drained(deadline, settings, remote, force, outcome, say, clock, sleep)
    for index, host in enumerate(ready):
        note(host, REBOOTING, "")
        kind, why = _reboot_one(host, settings[host], readings[host], remote, say, clock, sleep)
        outcome[host] = (kind, why)
        if kind != REBOOTED:
            for rest in ready[index + 1 :]:  # a cluster down one node keeps the others up
                _undrain(remote, rest, say)
                outcome[rest] = (
                    DRAINED_OUT,
                    f"reboot: left out, {host} of its cluster did not come back well; undrained",
                )
            break
    return outcome


def _wait_drained(deadline, settings, remote, force, outcome, say, clock, sleep) -> list[str]:
    """Wait until each drained host runs no job, or its deadline passes; the hosts ready for
    their reboot, in order. A host past its deadline is left out and undrained (with
    ``force``, its jobs are stopped instead)."""
    waiting, ready, told = list(deadline), [], {}
    while waiting:
        for host in list(waiting):
            try:
                jobs = remote.running(host)
            except HostError as error:
                outcome[host] = (REBOOT_FAILED, f"reboot: could not list its jobs: {error}")
                waiting.remove(host)
                continue
            if not jobs:
                waiting.remove(host)
                ready.append(host)
                continue
            if told.get(host) != jobs:
                say(
                    f"{host}: waiting for {len(jobs)} running job(s) ({', '.join(jobs)}), "
                    f"{max(0, round(deadline[host] - clock()))} s left of updates_drain_timeout"
                )
                told[host] = jobs
            if clock() < deadline[host]:
                continue
            waiting.remove(host)
            timeout = settings[host]["updates_drain_timeout"]
            if force:
                say(f"{host}: --force: stopping {', '.join(jobs)} after {timeout} s")
                try:
                    remote.stop(host, jobs, 120)
                    ready.append(host)
                except HostError as error:
                    outcome[host] = (REBOOT_FAILED, f"reboot: --force could not stop {', '.join(jobs)}: {error}")
                continue
            _undrain(remote, host, say)
            outcome[host] = (
                DRAINED_OUT,
                f"reboot: drain timed out: {len(jobs)} job(s) still running after "
                f"updates_drain_timeout {timeout} s ({', '.join(jobs)}); left out, not "
                "rebooted, undrained (--force stops them; --resume tries again)",
            )
            say(f"{host}: {outcome[host][1]}")
        if waiting:
            sleep(POLL_S)
    return [host for host in deadline if host in ready]


def _reboot_one(host, settings, before: Reading, remote, say, clock, sleep) -> tuple[str, str]:
    """Reboot one drained host, wait for its new boot, check its kernel and driver."""
    say(f"{host}: rebooting (boot id {before.boot_id})")
    try:
        remote.reboot(host)
    except HostError as error:
        return REBOOT_FAILED, f"reboot: could not ask it to reboot: {error}"
    deadline, last = clock() + BOOT_TIMEOUT_S, "no answer yet"
    while clock() < deadline:
        sleep(POLL_S)
        try:
            after = remote.read(host)
        except HostError as error:
            last = str(error)
            continue
        if after.boot_id == before.boot_id:
            last = "still the old boot"
            continue
        wrong = unexpected(settings, after.versions) + [f"still needs a reboot: {r}" for r in after.reasons]
        if wrong:
            return REBOOT_FAILED, f"reboot: back (boot id {after.boot_id}), but {'; '.join(wrong)}; left drained"
        say(
            f"{host}: back after the reboot (boot id {after.boot_id}, kernel {after.versions.get('kernel')}"
            + (f", driver {after.versions['driver']}" if after.versions.get("driver") else "")
            + "): undraining"
        )
        try:
            remote.undrain(host)
        except HostError as error:
            return REBOOT_FAILED, f"reboot: back (boot id {after.boot_id}), but could not undrain it: {error}"
        return REBOOTED, f"boot id {before.boot_id} -> {after.boot_id}"
    return REBOOT_FAILED, f"reboot: not back within {BOOT_TIMEOUT_S} s ({last}); left drained"


def _undrain(remote, host, say) -> None:
    try:
        remote.undrain(host)
    except HostError as error:
        say(f"{host}: could not undrain it ({error}): `sudo spark-jobs undrain` there")


# --- the real hosts: pyinfra's CLI, the inventory's connections ------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
JOB_MARK = "sparkrig-job "
JOB_MARKED = f'printf "%s\\n" "$jobs" | sed -n "s/^./{JOB_MARK}&/p"'


class PyinfraHosts:
    """Each step one ``pyinfra --limit HOST INVENTORY exec|fact`` run (the inventory's own
    connection, user and sudo), in a subprocess: importing pyinfra's CLI would patch this
    process with gevent."""

    def __init__(self, pyinfra: str, repo: str, inventory: str, data_args: Sequence[str] = (), timeout: float = 300):
        self.pyinfra, self.repo, self.inventory = pyinfra, repo, inventory
        self.data_args, self.timeout = list(data_args), timeout

    def _run(self, host: str, *args: str) -> tuple[int, list[str], str]:
        argv = [self.pyinfra, "-y", "--limit", host, *self.data_args, self.inventory, *args]
        try:
            result = subprocess.run(argv, cwd=self.repo, capture_output=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise HostError(f"pyinfra took more than {self.timeout:.0f} s") from None
        # Lines end at "\n" alone (text mode would also end one at a host's "\r").
        text = _ANSI.sub("", (result.stderr + result.stdout).decode("utf-8", "surrogateescape"))
        return result.returncode, text.split("\n"), text

    def root(self, host: str, command: str) -> list[str]:
        """``command`` run as root on ``host`` (the inventory's sudo): the lines it said, its
        error's lines and sudo's own warnings among them (pyinfra prints both streams), each
        checked as text (a line that is not fails the host: host_output.text); HostError,
        saying why in words escaped, when it failed."""
        code, lines, _ = self._run(host, "--sudo", "exec", "--", command)
        # pyinfra pads "[HOST]" to the inventory's longest host name: the padding is no output.
        said = [line[len(host) + 2 :].lstrip(" ") for line in lines if line.startswith(f"[{host}] ")]
        if code != 0:
            problem = [line.strip() for line in lines if "Could not connect" in line or "rror" in line]
            raise HostError(printable("; ".join((said[-2:] or problem[-1:]) or [f"pyinfra exit {code}"]))[:240])
        try:
            return [host_output.text(line, f"a line of {printable(command[:80])}'s output", 1024) for line in said]
        except ValueError as error:
            raise HostError(str(error)[:240]) from None

    def read(self, host: str) -> Reading:
        facts = [BOOT_ID_FACT, *dict.fromkeys(name for name, _ in REBOOT_READINGS)]
        code, lines, text = self._run(host, "fact", *facts)
        values = {}
        decoder = json.JSONDecoder()
        for match in re.finditer(r"^--> Fact data for: (\S+)\n", text, re.M):
            try:
                values[match[1]] = decoder.raw_decode(text, match.end())[0].get(host)
            except (ValueError, AttributeError):
                pass
        if code != 0 or any(values.get(name) is None for name in facts):
            problem = [line.strip() for line in lines if "Could not connect" in line or "rror" in line]
            raise HostError(printable(problem[-1] if problem else f"pyinfra fact exit {code}")[:240])
        try:  # what pyinfra printed of the facts, checked as their parsers check them
            for name in facts:
                host_output.checked(values[name], name.rsplit(".", 1)[-1])
        except ValueError as error:
            raise HostError(str(error)[:240]) from None
        reasons = [reason for name, reasons_of in REBOOT_READINGS for reason in reasons_of(values[name])]
        return Reading(values[BOOT_ID_FACT], reasons, values.get(VERSIONS_FACT) or {})

    def drain(self, host: str, why: str) -> None:
        self.root(host, f"{JOB_COMMANDS['spark-jobs']} drain --why {shlex.quote(why)}")

    def running(self, host: str) -> list[str]:
        # Each job's line marked by the host's shell: sudo's own warnings ("sudo: unable to
        # resolve host ...") come on the same output and are no job.
        said = self.root(host, f"jobs=$({JOB_COMMANDS['spark-jobs']} running) || exit; {JOB_MARKED}")
        return [line[len(JOB_MARK) :].strip() for line in said if line.startswith(JOB_MARK)]

    def stop(self, host: str, jobs: Sequence[str], wait: int) -> None:
        for job in jobs:
            self.root(host, f"{JOB_COMMANDS['spark-jobs']} stop --wait {int(wait)} {shlex.quote(job)}")

    def reboot(self, host: str) -> None:
        # The mark, logged as root, tells the next boot's report this reboot was the rollout's
        # (operations/updates/boots.py). Then in 2 s, from systemd: the command returns before
        # sshd goes down with the host.
        self.root(
            host,
            f"logger -t {ROLLOUT_MARK} 'reboot by sparkrig rollout' && "
            "systemd-run --quiet --on-active=2 --timer-property=AccuracySec=100ms systemctl reboot",
        )

    def undrain(self, host: str) -> None:
        self.root(host, f"{JOB_COMMANDS['spark-jobs']} undrain")
