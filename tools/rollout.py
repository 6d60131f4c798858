"""
Gated rollouts: the deploy on a fleet one batch of hosts at a time, each batch proven by the
compliance suite before the next starts, within a failure budget, resumable.

    sparkrig rollout INVENTORY [--deploy FILE] [--batch N|P%] [--canary N|P%] [--max-fail N|P%]
                     [--limit GROUP_OR_HOST] [--resume] [--state FILE] [--force] [--metrics-push]
                     [-- PYINFRA_OPTIONS]

Each batch is an ordinary ``pyinfra -y --limit HOSTS INVENTORY deploy.py`` run of the caller's
deploy file (--deploy, by default ./deploy.py; pyinfra runs in its directory, where it finds its
config.py and group_data/), in inventory order; the hosts that converged are then checked by
``sparkrig check INVENTORY --limit HOSTS`` (a failed control fails its host). Between the two, a
converged host that needs a reboot is drained, waited for, rebooted, checked and undrained where
its ``updates_reboot`` says so (sparkrig.tools.rollout_reboot). A batch whose failed hosts are
over the budget (--max-fail, 0 by default: any failure), or whose every host failed, ends the
rollout. It ends with a table per batch. Its state is kept after every step in a file of the
caller's own (--state; by default under $XDG_STATE_HOME or ~/.local/state/sparkrig/rollouts),
so a rollout stopped by its budget, Ctrl+C or a lost controller goes on with --resume, the
proven hosts left alone. docs/fleets.md says how shares round and the budget counts.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkrig import operations
from sparkrig.host_output import printable
from sparkrig.host_settings import declared
from sparkrig.tools import check, cli
from sparkrig.tools.inventory import PYINFRA, REPO, data_args, in_checkout, limit_hosts, read_inventory
from sparkrig.tools.rollout_plan import (
    CONVERGED,
    FAILED,
    PENDING,
    PROVEN,
    HostState,
    State,
    default_state_path,
    host_digest,
    load,
    over_budget,
    parse_amount,
    plan,
    private_directory,
    save,
    table,
)
from sparkrig.tools.rollout_reboot import (
    DRAINED_OUT,
    DRAINING,
    REBOOT_FAILED,
    REBOOTING,
    PyinfraHosts,
    reboot_batch,
)

WHY_MAX = 240

# --- one batch: converge, then prove ----------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GENERIC = re.compile(r"Error: executed \d+ commands")


def failed_hosts(hosts: Sequence[str], report: dict | None) -> list[str]:
    """The hosts of a batch that did not converge, from pyinfra's ``--json`` report: an
    operation failed on them, or pyinfra lists them as failed (unreachable ones included).
    A host with no operation at all (nothing to do) converged; a report without results
    (pyinfra stopped before running) fails every host."""
    results = (report or {}).get("results")
    if not isinstance(results, dict) or not isinstance(results.get("failed_hosts"), list):
        return list(hosts)
    errors = {h for op in results.get("operations") or [] for h in op.get("error", [])}
    errors |= set(results["failed_hosts"])
    return [h for h in hosts if h in errors]


def deploy_error(host: str, report: dict | None, log: str) -> str:
    """Why the deploy failed on ``host``: the operation that failed and the host's last error
    line in pyinfra's log (a sparkrig script's own message, or pyinfra's "Could not connect").
    A line is the host's only when pyinfra's prefix for it starts the line: another host's
    output may hold ``[HOST]`` anywhere (lines are split at newlines alone, as pyinfra ends
    them; what one host printed never becomes a line of another's)."""
    operations = ((report or {}).get("results") or {}).get("operations") or []
    failed_op = next((op.get("name", "") for op in operations if host in op.get("error", [])), "")
    prefix = re.compile(rf"\s*\[{re.escape(host)}\](?: nested)?\s+(?P<said>.*)")
    ours = [m["said"].strip() for line in log.split("\n") if (m := prefix.fullmatch(_ANSI.sub("", line)))]
    said = [
        line
        for line in ours
        if line
        and not _GENERIC.search(line)
        and ("rror" in line or "sparkrig:" in line or "Could not connect" in line or "failed" in line)
    ]
    parts = [part for part in ("deploy", failed_op, said[-1] if said else "") if part]
    if len(parts) == 1:
        parts.append("pyinfra failed (its log is above)")
    return printable(": ".join(parts))[:WHY_MAX]


def passed_on(line: str) -> str:
    """A line of pyinfra's log as the operator's terminal gets it: pyinfra's colours kept,
    every other control character (a host's own, in its output) escaped."""
    kept = _ANSI.findall(line)
    return "".join(printable(part) + (kept[i] if i < len(kept) else "") for i, part in enumerate(_ANSI.split(line)))


def converge(inventory: str, hosts: Sequence[str], extra: Sequence[str], deploy: Path | None = None) -> dict[str, str]:
    """``pyinfra -y --json --limit HOSTS INVENTORY DEPLOY`` in the deploy file's directory, its
    log passed on to our stderr; the hosts that failed, each with why."""
    deploy = deploy or default_deploy()
    process = subprocess.Popen(
        [PYINFRA, "-y", "--json", *[arg for h in hosts for arg in ("--limit", h)], *extra, inventory, deploy.name],
        cwd=deploy.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None and process.stdout is not None
    # The report is read beside the log: a report larger than a pipe's buffer would otherwise
    # hold pyinfra (and so its log) for good.
    report_bytes: list[bytes] = []
    reader = threading.Thread(target=lambda: report_bytes.append(process.stdout.read()), daemon=True)
    reader.start()
    log = []
    # Bytes, split at b"\n" alone: text mode would also end a line at a host's "\r".
    for raw in process.stderr:
        line = raw.decode("utf-8", "replace").removesuffix("\n")
        sys.stderr.write(passed_on(line) + "\n")
        log.append(line)
    reader.join()
    process.wait()
    try:
        report = json.loads(b"".join(report_bytes))
    except ValueError:
        report = None
    failed = failed_hosts(hosts, report)
    if process.returncode != 0 and not failed:  # pyinfra failed, its report says nothing of whom
        failed = list(hosts)
    return {h: deploy_error(h, report, "\n".join(log)) for h in failed}


def default_deploy() -> Path:
    """The deploy a rollout runs unless --deploy names one: the caller's ./deploy.py, else (in a
    checkout, called from elsewhere) the checkout's."""
    here = Path("deploy.py").resolve()
    return here if here.is_file() or not in_checkout() else REPO / "deploy.py"


def control_host(name: str, hosts: Sequence[str]) -> str | None:
    """The host in a control's JUnit name: testinfra's id comes first in the brackets
    (``[ssh://NAME]``, or joined by "-" to other parameters), so the longest fitting wins."""
    fits = [h for h in hosts if f"[ssh://{h}]" in name or f"[ssh://{h}-" in name]
    return max(fits, key=len) if fits else None


def proof_outcomes(junit: Path, hosts: Sequence[str], output: str) -> dict[str, str]:
    """The hosts the suite's JUnit does not prove, each with why: its first failed control
    (the suite's own one-line finding from its "failed controls:" list, else JUnit's message),
    or that no control of it ran at all."""
    failed: dict[str, str] = {}
    ran: set[str] = set()
    findings = {}
    # The suite's table ends its output: its last "failed controls:" block, one line each
    # ("  HOST: test_x.py::test_y[ssh://HOST]: what it found"); a host's output printed
    # earlier (a control's traceback) may hold lines of that form, and is not read.
    lines = output.split("\n")
    start = max((i + 1 for i, line in enumerate(lines) if line == "failed controls:"), default=len(lines))
    block = lines[start : next((i for i in range(start, len(lines)) if not lines[i].startswith("  ")), len(lines))]
    for line in block:
        match = re.fullmatch(r"  (?P<host>\S+): (?P<control>\S+?\.py::\S+?\])(?:: (?P<found>.*))?", line)
        # A finding is its host's only when the control is that host's: what one host's
        # control found never writes another host's reason.
        if match and control_host(match["control"], [match["host"]]) == match["host"]:
            findings.setdefault(match["control"], printable(match["found"] or ""))
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        host = control_host(name, hosts)
        if host is None:
            continue
        ran.add(host)
        problem = case.find("failure")
        problem = case.find("error") if problem is None else problem
        if problem is None or host in failed:
            continue
        name = name.rsplit("]@", 1)[0] + "]" if "]@" in name else name  # xdist's @host/group suffix
        control = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{name}"
        found = findings.get(control) or printable((problem.get("message") or "").strip().split("\n")[0])
        failed[host] = f"control {control}" + (f": {found}" if found else "")
    for host in hosts:
        if host not in ran:
            failed[host] = "the compliance suite checked nothing on it" + (
                f" (pytest: {printable(output.strip().split(chr(10))[-1].strip('= '))})" if output.strip() else ""
            )
    return {h: why[:WHY_MAX] for h, why in failed.items()}


def prove(
    inventory: str, hosts: Sequence[str], project: Path | None = None, metrics_push: bool = False
) -> dict[str, str]:
    """The compliance suite on ``hosts`` alone (``sparkrig check``, run in the deploy's
    directory; its output passed on to our stderr); the hosts it did not prove, each with why."""
    with tempfile.TemporaryDirectory(prefix="sparkrig-rollout-") as scratch:  # 0700, the caller's
        junit = Path(scratch) / "compliance.xml"
        result = subprocess.run(
            check.command(inventory, hosts, junitxml=str(junit), metrics_push=metrics_push, extra=["-q"]),
            cwd=project or REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output = result.stdout.decode("utf-8", "replace")  # lines end at "\n" alone, not a host's "\r"
        sys.stderr.write("\n".join(passed_on(line) for line in output.split("\n")))
        if not junit.exists():
            return {h: f"the compliance suite did not run (pytest exit {result.returncode})" for h in hosts}
        return proof_outcomes(junit, hosts, output)


@dataclass
class Steps:
    """What a batch runs: converge and prove, each taking hosts and answering the failed ones
    with why; reboot (the converged hosts that need it: each host it touched with its outcome
    and why, telling ``note`` of every step) and undrain (hosts a stopped rollout left drained).
    The real ones run pyinfra and the suite; unit tests of the loop give their own."""

    converge: Callable[[Sequence[str]], Mapping[str, str]]
    prove: Callable[[Sequence[str]], Mapping[str, str]]
    reboot: Callable[[Sequence[str], Callable[[str, str, str], None]], Mapping[str, tuple[str, str]]] | None = None
    undrain: Callable[[Sequence[str]], None] | None = None


# --- the rollout ------------------------------------------------------------------------


def _reboots(state: State, path: Path, steps: Steps, converged: list[str]) -> list[str]:
    """Reboot the converged hosts that need it (steps.reboot), the state saved at each step;
    the hosts that go on to the proof (those drained out or whose reboot failed do not)."""

    def note(host: str, kind: str, why: str) -> None:
        state.hosts[host].reboot = kind
        state.hosts[host].why = f"interrupted while {kind}" if kind in (DRAINING, REBOOTING) else state.hosts[host].why
        save(state, path)

    assert steps.reboot is not None
    for host in converged:  # an outcome of an earlier run (drained out, failed) is this run's to say
        if state.hosts[host].reboot in (DRAINED_OUT, REBOOT_FAILED):
            state.hosts[host].reboot = ""
    for host, (kind, why) in steps.reboot(converged, note).items():
        if kind in (DRAINED_OUT, REBOOT_FAILED):
            state.hosts[host] = HostState(FAILED, True, why, kind)
    # Drained by a rollout stopped mid-way, and needing no reboot now (it took place).
    stale = [h for h in converged if state.hosts[h].reboot in (DRAINING, REBOOTING)]
    if stale and steps.undrain:
        steps.undrain(stale)
        for host in stale:
            state.hosts[host].reboot = ""
    save(state, path)
    return [h for h in converged if state.hosts[h].status != FAILED]


def say(message: str) -> None:
    print(f"rollout: {printable(message)}", file=sys.stderr, flush=True)


def run_batches(state: State, path: Path, steps: Steps) -> int:
    """Run the batches of ``state`` that are not proven yet, saving it after every step; the
    exit status (0: every host proven)."""
    budget = parse_amount(state.options["max_fail"], "--max-fail", budget=True)
    state.stopped = ""
    total = len(state.batches)
    running: list[str] = []
    try:
        for number, batch in enumerate(state.batches, start=1):
            todo = [h for h in batch if state.hosts[h].status != PROVEN]
            label = f"batch {number}/{total}" + (" (canary)" if number == 1 and state.options.get("canary") else "")
            if not todo:
                say(f"{label}: proven before ({', '.join(batch)})")
                continue
            kept = len(batch) - len(todo)
            say(f"{label}: {', '.join(todo)}" + (f" ({kept} proven before, left alone)" if kept else ""))
            running = todo
            for host in todo:
                state.hosts[host] = HostState(why="interrupted while converging", reboot=state.hosts[host].reboot)
            save(state, path)
            for host, why in steps.converge(todo).items():
                state.hosts[host] = HostState(FAILED, False, why, state.hosts[host].reboot)
            converged = [h for h in todo if state.hosts[h].status != FAILED]
            for host in converged:
                state.hosts[host] = HostState(CONVERGED, True, "interrupted while proving", state.hosts[host].reboot)
            save(state, path)
            if converged and steps.reboot:
                converged = _reboots(state, path, steps, converged)
            if converged:
                say(f"{label}: {len(converged)} converged, running the compliance suite on them")
                proof = steps.prove(converged)
                for host in converged:
                    reboot = state.hosts[host].reboot
                    state.hosts[host] = (
                        HostState(FAILED, True, proof[host], reboot)
                        if host in proof
                        else HostState(PROVEN, True, reboot=reboot)
                    )
            running = []
            failed = sum(state.hosts[h].status == FAILED for h in todo)
            if over_budget(failed, len(todo), budget):
                state.stopped = (
                    f"stopped after batch {number}: {failed} of its {len(todo)} hosts failed, "
                    f"over --max-fail {budget}" + (" (every host of the batch failed)" if failed == len(todo) else "")
                )
            save(state, path)
            if state.stopped:
                break
    except KeyboardInterrupt:
        for host in running:
            if state.hosts[host].status == CONVERGED:
                state.hosts[host] = HostState(CONVERGED, True, "interrupted while proving")
        state.stopped = "interrupted (Ctrl+C)"
        save(state, path)
        print("\n" + table(state), file=sys.stderr)
        say(f"{state.stopped}; go on with --resume (state: {path})")
        return 130
    print("\n" + table(state), file=sys.stderr)
    proven = sum(h.status == PROVEN for h in state.hosts.values())
    if state.stopped:
        say(f"{state.stopped}; fix it, then go on with --resume (state: {path})")
    elif proven == len(state.hosts):
        say(f"all {proven} hosts converged and proven")
    else:
        say(
            f"{proven} of {len(state.hosts)} hosts proven, the failed ones within the budget; "
            f"--resume runs them again (state: {path})"
        )
    return 0 if proven == len(state.hosts) else 1


@dataclass
class Options:
    """The command line, validated before any host is contacted."""

    inventory: str
    batch: str | None
    canary: str | None
    max_fail: str | None
    limit: list[str]
    resume: bool
    state: str | None
    extra: list[str]
    force: bool = False
    deploy: str | None = None
    metrics_push: bool = False

    def validate(self) -> None:
        for value, option, budget in (
            (self.batch, "--batch", False),
            (self.canary, "--canary", False),
            (self.max_fail, "--max-fail", True),
        ):
            if value is not None:
                parse_amount(value, option, budget)

    def given(self) -> dict[str, str | None]:
        """The options given, written as the state keeps them (" 2" is "2")."""
        return {
            key: None if value is None else str(parse_amount(value, "", key == "max_fail"))
            for key, value in (("batch", self.batch), ("canary", self.canary), ("max_fail", self.max_fail))
        }


def rollout(options: Options, steps: Steps | None = None) -> int:
    """Plan (or resume) the rollout and run it; the exit status."""
    options.validate()
    deploy = Path(options.deploy).resolve() if options.deploy else default_deploy()
    if not deploy.is_file():
        raise ValueError(f"--deploy {options.deploy or './deploy.py'}: no such file (name your deploy file)")
    project = deploy.parent
    # The caller's path, for the hosts, every batch and the suite alike (they run in the deploy's directory).
    inventory = str(Path(options.inventory).resolve())
    path = Path(options.state).resolve() if options.state else default_state_path(inventory)
    private_directory(path.parent)
    with _locked(path):
        loaded = read_inventory(options.inventory, data=data_args(options.extra), cwd=project)
        hosts = limit_hosts({h["name"]: h["groups"] for h in loaded}, options.limit)
        digests = {h["name"]: host_digest(h["data"]) for h in loaded if h["name"] in hosts}
        operations.load()  # every concern's declared settings: the reboot reads each host's as its deploy does
        settings = {h["name"]: declared(h["data"]) for h in loaded if h["name"] in hosts}
        remote = PyinfraHosts(PYINFRA, str(project), inventory, data_args(options.extra))
        steps = steps or Steps(
            lambda group: converge(inventory, group, options.extra, deploy),
            lambda group: prove(inventory, group, project, options.metrics_push),
            lambda group, note: reboot_batch(group, settings, remote, options.force, note, say),
            lambda group: _undrain(remote, group),
        )
        if options.resume:
            state = load(path)
            state.refuse_mismatch(inventory, hosts, digests, options.given())
            state.digests.update(digests)
            say(
                f"resuming {path}: "
                + ", ".join(
                    f"{sum(h.status == s for h in state.hosts.values())} {s}"
                    for s in (PROVEN, FAILED, CONVERGED, PENDING)
                )
            )
        else:
            given = options.given()
            chosen = {
                "batch": given["batch"] or "1",
                "canary": given["canary"] or "",
                "max_fail": given["max_fail"] or "0",
            }
            batches = plan(
                hosts,
                parse_amount(chosen["batch"], "--batch"),
                parse_amount(chosen["canary"], "--canary") if chosen["canary"] else None,
            )
            state = State.new(inventory, chosen, batches, digests)
            say(
                f"{len(hosts)} hosts in {len(batches)} batches ({', '.join(str(len(b)) for b in batches)} hosts), "
                f"--max-fail {chosen['max_fail']} per batch; state: {path}"
            )
        save(state, path)
        return run_batches(state, path, steps)


def _undrain(remote: PyinfraHosts, hosts: Sequence[str]) -> None:
    for host in hosts:
        try:
            remote.undrain(host)
            say(f"{host}: undrained (a stopped rollout had drained it; its reboot took place)")
        except RuntimeError as error:
            say(f"{host}: could not undrain it ({error}): `sudo spark-jobs undrain` there")


class _locked:
    """One rollout at a time on a state file: an exclusive lock beside it, or a clear refusal."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".lock")

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise ValueError(f"another rollout holds {self.path}: wait for it to end") from None

    def __exit__(self, *_):
        os.close(self.fd)


@cli.command("rollout", "the deploy batch by batch, each batch proven by sparkrig check, resumable")
def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("rollout", __doc__, [(130, "interrupted (Ctrl+C): --resume goes on")])
    parser.add_argument("inventory", help="a pyinfra inventory, e.g. inventory/spark.py")
    parser.add_argument("--deploy", metavar="FILE", help="the deploy file each batch runs (default: ./deploy.py)")
    parser.add_argument(
        "--batch",
        help="hosts per batch: a number, or a share of the hosts such as 25%% (rounded down, at least 1); default 1",
    )
    parser.add_argument("--canary", help="a first batch of this many hosts (a number or a share), alone")
    parser.add_argument(
        "--max-fail",
        dest="max_fail",
        help="failed hosts a batch may have and the rollout go on: a number, or a share of "
        "the batch such as 10%% (more than it stops; default 0)",
    )
    parser.add_argument(
        "--limit", action="append", default=[], help="only these hosts: a group or host glob, as pyinfra's --limit"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with the saved rollout of this inventory, leaving its proven hosts alone",
    )
    parser.add_argument(
        "--state",
        help="the state file (default: one per inventory under $XDG_STATE_HOME or ~/.local/state/sparkrig/rollouts)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="a host to reboot (updates_reboot) whose jobs still run after updates_drain_timeout: "
        "stop them (spark-jobs stop) instead of leaving the host out",
    )
    parser.add_argument(
        "--metrics-push",
        action="store_true",
        help="after each batch's proof, write each host's outcome where its metrics collector serves it",
    )
    parser.epilog = (
        "Options after -- go to every batch's pyinfra run, e.g. -- --data hardware_profile=auto.\n\n" + parser.epilog
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    options = Options(
        args.inventory,
        args.batch,
        args.canary,
        args.max_fail,
        args.limit,
        args.resume,
        args.state,
        extra,
        args.force,
        args.deploy,
        args.metrics_push,
    )
    return cli.answer("rollout", lambda: rollout(options))


if __name__ == "__main__":
    sys.exit(main())
