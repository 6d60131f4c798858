"""
Targets of the compliance suite: every host of a pyinfra inventory, over SSH.

    pytest tests/compliance --inventory inventory/spark.py [--limit GROUP_OR_HOST]
           [--junitxml report.xml] [--fleet-page fleet.html]

reaches each host with the inventory's own SSH settings (ssh_hostname, ssh_user,
ssh_port, ssh_key, known hosts) through testinfra's ``ssh://`` backend, and checks
it against the settings pyinfra would deploy to it (group_data included).
``--limit`` picks hosts as pyinfra's does (a group, or a host name glob). The
controls that act run in parallel, spread over pytest-xdist workers (one per host, at
least 6, at most 8; ``-n N`` chooses another number, ``-n 0`` none); a selection without
them (``-m read``, or files and controls that only read) runs without workers, answered
from one reading of each host. The run ends with
a table of passed/failed/skipped controls per host.
testinfra's own ``--hosts`` also works; the hosts are then checked against
group_data/all.py alone. With neither, the suite targets the local lab: it boots
and converges the lab fleet first.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import importlib
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest
import testinfra
from testinfra.backend.local import LocalBackend
from testinfra.backend.ssh import SshBackend

from sparkrig.host_output import printable
from sparkrig.profile import AUTO, HardwareIdentity, choose_profile
from sparkrig.settings import all_settings, resolve
from sparkrig.tools import fleet_page, private

from . import early, forks, reads, results
from .selection import read_only_selection
from .targets import LAB_INVENTORY, REPO, inventory_host_data, lab_says, ssh_config_for

# Action controls' testinfra hosts answer host-wide constants once and each path from one
# reading; read-only controls may not use them at all (reads.py).
reads.install(SshBackend)
reads.install(LocalBackend)
# Every control is stopped after this long (a hung host or program fails its control, not the
# run); a read-only one reads prefetched answers, each read itself capped at READ_TIMEOUT_S.
READ_ONLY_TIMEOUT_S = 3 * reads.READ_TIMEOUT_S
ACTION_TIMEOUT_S = 900


def readers(config, hosts: dict[str, dict], every_host=None) -> dict:
    """For each host, how to make its :class:`reads.Reader` (the settings the ``settings``
    fixture gives it) for the prefetch: every need of every compliance module is planned
    with it. A host whose settings do not resolve gets none: its controls ask for themselves.
    ``every_host``: every host of the inventory (default: the --inventory's, --limit aside)."""
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        importlib.import_module(f"{__package__}.{path.stem}")  # registers its needs
    found, everyone = {}, None
    for name, data in hosts.items():
        try:
            settings = resolve(all_settings(), data)
        except Exception:  # noqa: BLE001 - reported by the controls' own settings fixture
            continue
        if (settings["cluster_name"] is not None or settings["prometheus_server"] == name) and everyone is None:
            # A --limit may leave peers out (and the hosts the fleet's Prometheus scrapes).
            everyone = every_host() if every_host else inventory_hosts(config, limit=[])
        found[name] = lambda answers, name=name, settings=settings: reads.Reader(
            name, settings, answers, lambda: everyone
        )
    return found


def peer_readers(hosts: dict[str, dict], everyone: dict[str, dict]) -> dict:
    """How to read, of each host of ``everyone`` that ``hosts`` leaves out but that shares a
    cluster with one of them, what controls ask of a peer (``reads.PEERS``)."""
    clusters = set()
    for data in hosts.values():
        try:
            clusters.add(resolve(all_settings(), data)["cluster_name"])
        except Exception:  # noqa: BLE001 - reported by the controls' own settings fixture
            continue
    clusters.discard(None)
    found = {}
    for name, data in everyone.items():
        if name in hosts or not clusters:
            continue
        try:
            settings = resolve(all_settings(), data)
        except Exception:  # noqa: BLE001 - the control reading it says so
            continue
        if settings["cluster_name"] in clusters:
            found[name] = lambda answers, name=name, settings=settings: reads.Reader(
                name, settings, answers, lambda: everyone, only=reads.PEERS
            )
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A control marked ``action`` is never answered from the prefetch (reads.py's rule)."""
    reads.acting = item.get_closest_marker("action") is not None
    try:
        return (yield)
    finally:
        reads.acting = False


class ControlTimeout(Exception):  # noqa: N818 - pytest shows it as the control's failure
    """A control ran past its time limit."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """While a read-only control runs, testinfra's host refuses every command (it reads
    through its needs); every control is stopped after its time limit (SIGALRM: in the main
    thread, where pytest and its xdist workers run the controls)."""
    action = item.get_closest_marker("action") is not None
    limit = ACTION_TIMEOUT_S if action else READ_ONLY_TIMEOUT_S
    timed = threading.current_thread() is threading.main_thread()
    if timed:

        def expired(_signum, _frame):
            raise ControlTimeout(f"{item.name} ran past its {limit} s limit: stopped")

        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, limit)
    reads.guarded = not action
    try:
        return (yield)
    finally:
        reads.guarded = False
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def pytest_addoption(parser, pluginmanager):
    pluginmanager.register(results, "sparkrig-results")  # --results and --waivers: results.py
    parser.addoption(
        "--inventory",
        help="pyinfra inventory whose hosts the compliance suite checks (default: the local lab)",
    )
    parser.addoption(
        "--fleet-page",
        metavar="PATH",
        help="also write the fleet page, one HTML file: each host's versions and every control's "
        "outcome, why, and what it protects against (with --inventory, or against the lab)",
    )
    parser.addoption(
        "--limit",
        action="append",
        default=[],
        help="with --inventory: only these hosts, as pyinfra's --limit (group or host glob; "
        "comma-separated or repeated)",
    )
    parser.addoption(
        "--forks",
        type=int,
        default=None,
        metavar="N",
        help="a run of controls that only read, against several --inventory hosts, runs them in "
        "N processes, this one and forks of it, a host's controls in one (default: one per core, "
        "at most one per host; 0 or 1: this one alone): tests/compliance/forks.py",
    )


# Controls mostly wait on the network, so workers beyond the controller's cores still pay:
# on the lab's 2-core controller one host's suite at +50 ms took 9.5 s with 5 workers,
# 9.3 s with 6 and 10.3 s with 8 (benchmarks/noop_run.py; serial: 26 s).
MIN_WORKERS = 6
MAX_WORKERS = 8


def inventory_hosts(config, limit=None) -> dict[str, dict]:
    """The --inventory's hosts with their data (under ``limit``, by default --limit's), read
    once per run: pyinfra loads an inventory in about a second, and every xdist worker
    would load it again; the controller hands its readings to the workers instead."""
    limit = list(config.getoption("--limit") if limit is None else limit)
    readings = config.__dict__.setdefault("_sparkrig_inventories", {})
    key = ",".join(limit)
    if key not in readings:
        given = getattr(config, "workerinput", {}).get("sparkrig_inventories", {})
        readings[key] = given[key] if key in given else inventory_host_data(config.getoption("--inventory"), limit)
    return readings[key]


def constants(config) -> dict:
    """The host-wide constants the controller read of every --inventory host (empty for
    other targets), seeded in this process too."""
    prefetch = getattr(config, "sparkrig_prefetch", None)
    if prefetch is None:
        return {}
    found = prefetch.result()
    reads.seed(found)
    return found


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's controller starting a worker: the inventory and the constants as the controller read them."""
    node.workerinput["sparkrig_inventories"] = dict(getattr(node.config, "_sparkrig_inventories", {}))
    node.workerinput["sparkrig_constants"] = constants(node.config)


def pytest_collection_finish(session):
    """Without workers, the controls run here: the constants before the first of them, waited
    for once the controls are collected (the host's reading runs beside the collection)."""
    if session.config.getoption("--inventory") or session.config.option.hosts:
        # What the imports and the collection made lives as long as the run: frozen, pytest's
        # own full collections at its end (two, 40 ms each) walk only what the controls made;
        # collected again from here (early.collect_later held collections while the run started).
        gc.freeze()
        gc.enable()
        # And as the process exits (Python's last collections walked every object of the run:
        # 0.18 s of a one-host read-only run of 2 s): what the controls made is left to the OS.
        atexit.register(gc.freeze)
    constants(session.config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """A run of controls that only read, against several hosts: their controls shared between
    this process and forks of it, on the controller's other cores (forks.py); else pytest's
    own loop."""
    count = forks.wanted(session, item_host)
    return forks.run(session, count, item_host) if count > 1 else None


def item_host(item) -> str | None:
    """The inventory name of the host a control checks (None for a test of no host)."""
    callspec = getattr(item, "callspec", None)
    host = callspec.params.get("_testinfra_host") if callspec else None
    return inventory_name(host) if host is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With --inventory, the controls spread over xdist workers (one per host, at least
    MIN_WORKERS, at most MAX_WORKERS; all share each host's one SSH connection), unless -n
    was given or only read-only controls are selected; TOGETHER's controls of one host stay
    in one worker."""
    inventory = config.getoption("--inventory")
    if not inventory or not config.pluginmanager.hasplugin("xdist"):
        return
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # an xdist worker: it runs this hook too, and must not start workers of its own
    if config.option.numprocesses is not None:  # -n given: keep it, group by host
        if config.option.numprocesses and config.option.dist in ("no", "load"):
            config.option.dist = "loadgroup"
        return
    if read_only_selection(getattr(config.option, "markexpr", "")) or not selection_acts(getattr(config, "args", [])):
        config.option.numprocesses = 0  # answered from the one reading: nothing waits on the network
        return
    hosts = inventory_hosts(config)
    config.option.numprocesses = min(max(len(hosts), MIN_WORKERS), MAX_WORKERS)
    config.option.dist = "loadgroup"


def selection_acts(args) -> bool:
    """Whether the files or controls named on the command line (``args``; none: the whole
    suite) include a control marked action: a module of the suite, or one control of it
    (``test_swap.py::test_x``), that acts nowhere needs no workers either. Anything else
    named (a directory, another file, a parametrized id) counts as acting."""
    here = Path(__file__).parent
    for arg in args or [str(here)]:
        path, _, control = str(arg).partition("::")
        module = Path(path).resolve()
        if module.parent != here or not module.name.startswith("test_") or module.suffix != ".py" or "[" in control:
            return True
        found = importlib.import_module(f"{__package__}.{module.stem}")
        tests = (
            [getattr(found, control, None)] if control else [v for k, v in vars(found).items() if k.startswith("test_")]
        )
        if any(test is None or any(m.name == "action" for m in getattr(test, "pytestmark", [])) for test in tests):
            return True
    return False


# One SSH connection per host for the whole suite. testinfra asks ssh for
# ControlMaster=auto but names no ControlPath (and its --ssh-extra-args never reaches
# the hosts it makes), so without this every command pays a whole SSH handshake:
# about 0.25 s here, and 5 round trips more over a slow link. The sockets live in a
# directory of the user's alone: in /tmp anyone could plant a master that answers
# every control.
def control_dir() -> Path:
    """The private directory of the suite's SSH control sockets and early reads
    (:func:`early.directory`), made 0700 if missing. One that is a link, not the user's, or
    open to others is refused."""
    try:
        return private.private_directory(early.directory(), "SSH control sockets", closed=True)
    except ValueError as error:
        raise pytest.UsageError(f"{error}: remove it or fix it") from None


def multiplexed(ssh_config: str) -> str:
    """``ssh_config`` with connection sharing for every host, its sockets in :func:`control_dir`."""
    return f"Host *\n  ControlMaster auto\n  ControlPath {control_dir()}/%C\n  ControlPersist 60s\n\n{ssh_config}"


def write_multiplexed(ssh_config: str, out: Path) -> None:
    """The text of an SSH config, with connection sharing for every host, written to ``out``
    atomically (each xdist worker writes it too, while others may be reading it)."""
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_text(multiplexed(ssh_config))
    os.replace(tmp, out)


def inventory_ssh_config(root: Path, text: str) -> Path:
    """The multiplexed SSH config of these hosts, written under ``root``'s .pytest_cache and
    named by its contents: two runs of one checkout on other inventories (or a unit test
    beside a run) each keep their own, where one shared file let a run reach another's hosts."""
    out = root / ".pytest_cache" / f"sparkrig-ssh-config-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    write_multiplexed(text, out)
    return out


def _given(config, option: str) -> bool:
    """Whether the command line itself (not pyproject's addopts) gives ``option``
    (``--tb`` as ``--tb X`` or ``--tb=X``; ``-r`` as ``-r X`` or ``-rX``)."""
    args = [str(arg) for arg in config.invocation_params.args]
    if option.startswith("--"):
        return any(arg == option or arg.startswith(f"{option}=") for arg in args)
    return any(arg.startswith(option) and not arg.startswith("--") for arg in args)


def pytest_configure(config):
    inventory = config.getoption("--inventory")
    if (inventory or config.option.hosts) and not _given(config, "--tb"):
        # Against a fleet, a failed control is one line under the per-host table (what it
        # found); its traceback only with --tb=short or --tb=long.
        config.option.tbstyle = "no"
    if config.option.hosts:
        config.sparkrig_targets = "hosts"
        if config.getoption("--fleet-page"):
            raise pytest.UsageError(
                "--fleet-page needs --inventory (or the lab): testinfra's --hosts "
                "name no inventory to read the versions from"
            )
        return
    if inventory:
        config.sparkrig_targets = "inventory"
        hosts = inventory_hosts(config)
        # A control may read a host --limit leaves out (read_node: a cluster's peer), over
        # this same config: it reaches every host of the inventory.
        everyone = inventory_hosts(config, limit=[]) if config.getoption("--limit") else hosts
        ssh_config = inventory_ssh_config(Path(config.rootpath), ssh_config_for(everyone))
        names = list(hosts)
        if hasattr(config, "workerinput"):
            reads.seed(config.workerinput.get("sparkrig_constants", {}))
        else:
            # Read once here, for every worker, while the workers start (this also opens each
            # host's shared connection); constants(config) waits for it.
            # And what controls ask of the cluster peers the --limit leaves out (read_node).
            planned = {**readers(config, hosts), **peer_readers(hosts, everyone)}
            config.sparkrig_prefetch = ThreadPoolExecutor(max_workers=1).submit(
                _prefetch, config, str(ssh_config), [*names, *(n for n in planned if n not in hosts)], planned
            )
            if config.getoption("--fleet-page"):
                read_versions(config)  # beside the controls
    else:
        config.sparkrig_targets = "lab"
        # Written once the lab is up (_lab_ssh_config): the lab's own, multiplexed.
        ssh_config = Path(config.rootpath) / ".pytest_cache" / "sparkrig-lab-ssh-config"
        from .targets import lab  # noqa: PLC0415 - the checkout's lab, imported when first used

        names = [name for name, _flavour in lab.DEFAULT_FLEET]
    config.option.hosts = ",".join(testinfra_spec(name) for name in names)
    _TABLE.names = list(names)
    config.option.ssh_config = str(ssh_config)


def _prefetch(config, ssh_config: str, names: list[str], readers_: dict) -> dict:
    """The hosts' reading (:func:`reads.prefetch`); each host's reads, every round's, kept
    for the next run of this inventory and --limit, which sends them as it starts (early.py)."""
    found = reads.prefetch(ssh_config, names, reads.EVERY_HOST, readers_)
    control_dir()  # early.py's directory, made and checked
    planned = {name: reads.PLANNED[(ssh_config, name)] for name in names if (ssh_config, name) in reads.PLANNED}
    rounds = {name: (reads.prefetch_script(planned[name]), planned[name]) for name in planned}
    early.remember(config.getoption("--inventory"), config.getoption("--limit"), ssh_config, rounds)
    return found


def testinfra_spec(name: str) -> str:
    """pyinfra's ``@local`` is testinfra's local backend; every other host is reached over SSH."""
    return "local://" if name == "@local" else f"ssh://{name}"


def inventory_name(host) -> str:
    """The inventory name of a testinfra host (the reverse of :func:`testinfra_spec`)."""
    return reads.backend_name(host.backend)


@pytest.fixture(scope="session")
def host_data(request) -> dict[str, dict]:
    """Each target's pyinfra data (empty for --hosts targets); in lab mode, after converging."""
    targets = request.config.sparkrig_targets
    if targets == "hosts":
        return {}
    if targets == "lab":
        result = request.getfixturevalue("first_converge")
        if result.returncode != 0:
            pytest.fail("the lab converge failed, so no control can be checked:\n" + result.log[-3000:])
        return inventory_host_data(str(REPO / LAB_INVENTORY))
    return inventory_hosts(request.config)


@pytest.fixture(scope="session", autouse=True)
def _lab_ssh_config(request):
    """In lab mode: the lab up and converged, and its SSH config copied, multiplexed, to
    where the suite's hosts read it, before the first control runs."""
    if request.config.sparkrig_targets == "lab":
        hosts = request.getfixturevalue("host_data")
        from .targets import lab  # noqa: PLC0415 - the checkout's lab, imported when first used

        ssh_config = request.config.option.ssh_config
        write_multiplexed(lab.ssh_config_path().read_text(), Path(ssh_config))
        lab_says(request.config, f"compliance suite against the {len(_TABLE.names)} lab hosts")
        # Each host read once, the hosts at once, before the controls, as with --inventory: a
        # read-only control checks the host's state at the suite's start. A host that cannot be
        # read is left out, and its controls ask for themselves.
        started = time.monotonic()
        names = [name for name in _TABLE.names if name in hosts]
        reads.seed(reads.prefetch(ssh_config, names, reads.EVERY_HOST, readers(request.config, hosts, lambda: hosts)))
        lab_says(request.config, f"compliance suite: the hosts' reading in {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="session")
def resolved_settings() -> dict:
    """Each host's effective settings, resolved once a run (by inventory name)."""
    return {}


@pytest.fixture
def settings(host, host_data, resolved_settings) -> dict:
    """The effective sparkrig settings of the host under test: its data over the defaults
    (a copy: a control that changes it changes no other control's)."""
    name = inventory_name(host)
    if name not in resolved_settings:
        data = host_data.get(name)
        if data is None:  # a --hosts target: what group_data/all.py says for every host
            found = runpy.run_path(str(REPO / "group_data" / "all.py"))
            data = {k: v for k, v in found.items() if not k.startswith("_")}
        resolved_settings[name] = resolve(all_settings(), data)
    return dict(resolved_settings[name])


@pytest.fixture
def read(request, host, settings):
    """``read(NEED)``: what the need returns on the host under test (reads.py)."""

    def answered(function):
        return reads.answer(host.backend, inventory_name(host), function, settings, lambda: _every_host(request))

    return answered


@pytest.fixture
def read_node(request):
    """``read_node(NAME, NEED)``: what the need returns on another host of the inventory (a
    cluster's peer), answered from the prefetch where the controller read that host, else
    read on it now, through its own connection (the suite's SSH config). A control that uses
    it depends on that host: it says which where the host cannot be read."""

    def answered(name: str, function):
        everyone = _every_host(request) or {}
        if name not in everyone:
            raise AssertionError(f"depends on {name}, which the suite's inventory does not hold")
        settings = resolve(all_settings(), everyone[name])
        peer = testinfra.get_host(testinfra_spec(name), ssh_config=request.config.option.ssh_config)
        try:
            return reads.answer(peer.backend, name, function, settings, lambda: everyone)
        except Exception as error:  # noqa: BLE001 - whatever the peer did, this control names it
            raise AssertionError(f"depends on {name}, which could not be read: {printable(str(error))[:300]}") from None

    return answered


def _every_host(request) -> dict[str, dict] | None:
    """Every host of the inventory (a --limit may leave a cluster's peers out of host_data)."""
    targets = request.config.sparkrig_targets
    if targets == "inventory":
        return inventory_hosts(request.config, limit=[])
    return inventory_host_data(str(REPO / LAB_INVENTORY)) if targets == "lab" else None


@reads.need
def identity_of(r) -> dict:
    """What the host says it is (sparkrig.profile.HardwareIdentity's shape)."""
    return HardwareIdentity().process(r.check_output(HardwareIdentity().command().get_raw_value()).splitlines())


@pytest.fixture
def identity(read) -> dict:
    """What the host under test says it is."""
    return read(identity_of)


@pytest.fixture
def profile_name(settings, identity) -> str:
    """The host's hardware profile's name; for "auto", the one the box matches (as the deploy chose)."""
    name = settings["hardware_profile"]
    if name == AUTO:
        name, problem = choose_profile(settings["hardware_profiles"], identity)
        if name is None:
            pytest.fail(problem)
    return name


@pytest.fixture
def profile(settings, profile_name) -> dict:
    """The host's hardware profile."""
    return settings["hardware_profiles"][profile_name]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In lab mode the controls need the lab: mark them so `-m "not lab"` leaves them out.
    The controls of TOGETHER's modules are grouped by host, so xdist's loadgroup runs them
    in one worker, one after the other (first: xdist's worker reads the groups in this
    same hook); every other control goes to whichever worker is free."""
    here = Path(__file__).parent
    if config.sparkrig_targets == "inventory" and os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist's worker derives loadgroup from its own command line, which lacks the
        # --dist the controller was given in pytest_cmdline_main: read the groups here too.
        config.option.loadgroup = True
    ours: dict[Path, bool] = {}  # each module's answer, asked once (items are per control and host)
    for item in items:
        if item.path not in ours:
            ours[item.path] = here in item.path.parents
        if not ours[item.path]:
            continue
        if item.get_closest_marker("action") is None:
            item.add_marker(pytest.mark.read)
        if config.sparkrig_targets == "lab":
            item.add_marker(pytest.mark.lab)
        callspec = getattr(item, "callspec", None)
        if callspec and "_testinfra_host" in callspec.params:
            together = TOGETHER.get(item.path.stem)
            if together:
                item.add_marker(
                    pytest.mark.xdist_group(f"{inventory_name(callspec.params['_testinfra_host'])}/{together}")
                )


# Controls that share something they set up on a host run one after the other, in one
# worker: the container controls import the lab's stand-in image into the same place.
# Every other control reads or makes what it alone uses, and may run beside any other.
TOGETHER = {"test_containers": "containers", "test_ngc": "containers"}


# --- the per-host table ----------------------------------------------------------


def host_of(nodeid: str, names) -> str | None:
    """The inventory name in a control's test id, or None. testinfra's id comes first in the
    brackets (``[ssh://NAME]``, ``[local]``), joined by "-" to other parameters, so the
    longest of the known ``names`` that fits wins (host names contain "-" too). Each "]" or
    "-" after ``[ssh://`` ends a candidate, looked up in ``names`` (a set where the caller
    has one): the cost grows with the id, not with the fleet."""
    local = fleet_page.LOCAL_ID
    if "@local" in names and (f"[{local}]" in nodeid or f"[{local}-" in nodeid):
        return "@local"
    best = None
    start = nodeid.find("[ssh://")
    while start >= 0:
        rest = nodeid[start + len("[ssh://") :]
        for end, char in enumerate(rest):
            if char in "]-" and (best is None or end > len(best)) and rest[:end] in names:
                best = rest[:end]
        start = nodeid.find("[ssh://", start + 1)
    return best


# testinfra's repr of a command's result, in its errors (a failed check_output, an
# unreached host): its exit status, command and stderr, as bytes literals.
_COMMAND_RESULT = re.compile(
    r"CommandResult\(.*?exit_status=(?P<rc>\d+), command=b(?P<q>['\"])(?P<command>.*?)(?P=q), "
    r"_stdout=b.*?, _stderr=b(?P<q2>['\"])(?P<stderr>.*?)(?P=q2)\)"
)
FINDING_MAX = 300
# What sudo says on its own account before it runs the command, which then goes on and fails
# for its own reason: never why a control failed.
_SUDO_WARNING = re.compile(
    r"sudo: (?:unable to resolve host |setrlimit\(|unable to send audit message|"
    r"unable to change to root gid|unable to set runas group)"
)
# Lines a command adds after its error that say nothing of the failure.
_NOISE = re.compile(r"(?:See|Run) '[^']*--help'(?: for more information)?|Unable to find image '[^']*' locally")
# "X failed: <the command's stderr>", the controls' way of saying a command failed.
_FAILED_COMMAND = re.compile(r"(?P<head>.*?\bfailed(?: \([^)]*\))?:)(?P<rest>.*)")


def _meaningful(lines) -> list[str]:
    """Lines that say something about a failure: sudo's own warnings, a command's pointers to
    its help and blank lines left out."""
    kept = []
    for line in lines:
        line = line.strip()
        if line and not _SUDO_WARNING.match(line) and not _NOISE.fullmatch(line.rstrip(".")):
            kept.append(line)
    return kept


def _reason(message: str) -> str:
    """The one line that says why, from a failed control's message (an assertion's message,
    its continuation lines indented, then pytest's own explanation from an "assert" line on).
    Where a command's stderr follows "failed:", or a line ends in ":" with the output under it,
    the command's last meaningful line is the reason: sudo's warnings ("sudo: unable to
    resolve host ...") come first, and the error last."""
    lines = message.strip().splitlines()
    if not lines:
        return "(no message)"
    first, body = lines[0], []
    for line in lines[1:]:
        if line.startswith("assert ") or line == "assert":
            break  # pytest's explanation of the comparison
        body.append(line)
    command = _FAILED_COMMAND.match(first)
    if command and _meaningful([command["rest"], *body]):
        return f"{command['head']} {_meaningful([command['rest'], *body])[-1]}"
    if first.rstrip().endswith(":") and _meaningful(body):
        return f"{first.rstrip()} {_meaningful(body)[-1]}"
    return first


def found(report) -> str:
    """What a failed control found, in one line: the reason in its error (see :func:`_reason`),
    without the exception's type where that is an assertion's or pytest.fail's."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr or "")
    for prefix in ("AssertionError: ", "Failed: "):
        message = message.strip().removeprefix(prefix)
    line = _reason(message)
    result = _COMMAND_RESULT.search(line)
    if result:
        said = result["stderr"].replace("\\r", "").split("\\n")
        stderr = (_meaningful(said) or [""])[-1]
        if result["rc"] == "255":  # ssh's own failure: the host unreached
            line = f"{stderr} (running: {result['command']})"
        else:
            line = f"a command exited {result['rc']}: {stderr or result['command']}"
    line = printable(line)  # it quotes the host: the table, results.json and the page get it escaped
    if len(line) > FINDING_MAX:
        line = line[: FINDING_MAX - 1] + "…"
    return f"{line} (at setup)" if report.when == "setup" else line


def skipped(report) -> str:
    """Why a control was skipped (pytest's "Skipped: " taken off)."""
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        return printable(str(longrepr[2]).removeprefix("Skipped: "))
    return printable(str(longrepr or ""))


class HostTable:
    """Outcome of every control, per host: passed, failed, skipped (a control counts once,
    by its worst phase), and what each failed control found."""

    def __init__(self, names=()):
        self.names = names
        self.outcomes: dict[str, dict[str, str]] = {}
        self.findings: dict[tuple[str, str], str] = {}
        self.skips: dict[tuple[str, str], str] = {}  # why a control was skipped
        self.spans: dict[str, list[float]] = {}  # each host's first start and last stop (epoch)

    @property
    def names(self) -> list[str]:
        return self._names

    @names.setter
    def names(self, names) -> None:
        self._names, self._known, self._keys = list(names), set(names), {}

    def key(self, nodeid: str) -> tuple[str | None, str]:
        """A report's host (:func:`host_of`) and its control's key, ``module::control[params]``
        (a parametrized control counts once per parameter, as pytest counts): read once per
        control, whose three phases each report."""
        found = self._keys.get(nodeid)
        if found is None:
            path, _, test = nodeid.partition("::")
            test = test.rsplit("]@", 1)[0] + "]" if "]@" in test else test  # xdist's group suffix
            found = self._keys[nodeid] = (host_of(nodeid, self._known), f"{path.rsplit('/', 1)[-1]}::{test}")
        return found

    def add(self, report) -> None:
        target, key = self.key(report.nodeid)
        if target is None:
            return
        known = self.outcomes.setdefault(target, {})
        if getattr(report, "start", 0):
            span = self.spans.setdefault(target, [report.start, report.stop])
            span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)
        # What a control found quotes the host (a device's name, a command's stderr): escaped
        # here, so the table, the fleet page and the rollout that reads them carry no control
        # character and no line of another host's.
        if report.failed:
            known[key] = "failed"
            self.findings.setdefault((target, key), printable(found(report) + results.expired(report)))
        elif results.waived(report) and known.get(key) != "failed":
            known[key] = "waived"
            self.findings.setdefault((target, key), printable(f"{found(report)} ({results.waived(report)})"))
        elif report.skipped and known.get(key) not in ("failed", "waived"):
            known[key] = "skipped"
            self.skips.setdefault((target, key), printable(skipped(report)))
        elif report.when == "call" and report.passed and key not in known:
            known[key] = "passed"

    def lines(self) -> list[str]:
        rows = [("host", "passed", "failed", "skipped")]
        failures, waivers = [], []
        for target in sorted(self.outcomes):
            counts = {o: 0 for o in ("passed", "failed", "skipped", "waived")}
            for control, outcome in sorted(self.outcomes[target].items()):
                counts[outcome] += 1
                if outcome in ("failed", "waived"):
                    line = f"  {target}: {control}: {self.findings.get((target, control), '')}"
                    (failures if outcome == "failed" else waivers).append(line)
            rows.append((target, *(str(counts[o]) for o in ("passed", "failed", "skipped"))))
        width = max(len(r[0]) for r in rows)
        out = [f"{r[0]:<{width}}  {r[1]:>6}  {r[2]:>6}  {r[3]:>7}" for r in rows]
        return (
            out
            + (["failed controls:", *failures] if failures else [])
            + (["waived controls (failed, accepted by --waivers):", *waivers] if waivers else [])
        )


_TABLE = HostTable()


def pytest_runtest_logreport(report):
    """Every report, also those xdist's workers send to the controller."""
    _TABLE.add(report)


def read_versions(config) -> subprocess.Popen | None:
    """``sparkrig report --json`` of the suite's hosts, started once (for --fleet-page): the versions
    cost one remote command per host, read beside the controls."""
    reader = getattr(config, "_sparkrig_versions", None)
    if reader is None and config.sparkrig_targets in ("inventory", "lab"):
        inventory = caller_inventory(config) or str(REPO / LAB_INVENTORY)
        limits = [arg for limit in config.getoption("--limit") for arg in ("--limit", limit)]
        reader = subprocess.Popen(
            [sys.executable, "-m", "sparkrig.tools", "report", inventory, *limits, "--json"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        config._sparkrig_versions = reader
    return reader


def caller_inventory(config) -> str | None:
    """--inventory as its caller named it: a relative path is from the directory pytest was
    started in, whatever the directory of the process that reads it (sparkrig report runs in
    the repository's, and read the repository's inventory/spark.py instead)."""
    inventory = config.getoption("--inventory")
    return str(Path(config.invocation_params.dir) / inventory) if inventory else None


def page_hosts(config, table: HostTable) -> dict:
    """The fleet page's hosts: versions from :func:`read_versions`, controls from ``table``."""
    from sparkrig.tools.report import page_hosts as versions_of  # noqa: PLC0415 - with --fleet-page alone

    reader = read_versions(config)
    versions = {}
    if reader is not None:  # --results and --fleet-page both ask: communicate() answers both alike
        out, err = reader.communicate(timeout=600)
        try:
            versions = versions_of(json.loads(out))
        except (ValueError, KeyError):
            why = (err.strip().splitlines() or [f"sparkrig report exited {reader.returncode}"])[-1]
            versions = {name: fleet_page.Host(versions_error=why) for name in table.names}
    known = fleet_page.protections(Path(__file__).parent)
    hosts = {}
    for name in [*table.names, *(n for n in table.outcomes if n not in table.names)]:
        controls = [
            fleet_page.control_of(
                key, name, outcome, table.findings.get((name, key)) or table.skips.get((name, key), ""), known
            )
            for key, outcome in sorted(table.outcomes.get(name, {}).items())
        ]
        span = table.spans.get(name)
        ran = " to ".join(_when(t) for t in span) if span else ""
        hosts[name] = versions.get(name, fleet_page.Host())._replace(controls=controls, controls_read=ran)
    return hosts


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).astimezone().isoformat(timespec="seconds")


def write_fleet_page(config, table: HostTable) -> str:
    from sparkrig.tools.report import COLUMNS, GPU_COLUMNS  # noqa: PLC0415 - with --fleet-page alone

    path = config.getoption("--fleet-page")
    fleet_page.write(
        path,
        fleet_page.render(
            page_hosts(config, table),
            columns=(*COLUMNS, *GPU_COLUMNS),
            title="sparkrig compliance",
            source=f"the compliance suite ({config.getoption('--inventory') or 'the lab'})",
            changed=results.page_changes(config),
        ),
    )
    return path


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The table ends the run (after pytest's short summary), its failures one line each.
    Against a fleet, pytest's own "FAILED"/"ERROR" lines would say the same again: they
    come only when -r asks (with the whole suite they stay, for the other tests' failures)."""
    table = _TABLE
    shown = table.outcomes and not hasattr(config, "workerinput")
    if shown and config.sparkrig_targets != "lab" and not _given(config, "-r"):
        terminalreporter.reportchars = terminalreporter.reportchars.replace("f", "").replace("E", "")
    try:
        return (yield)
    finally:
        if shown:
            terminalreporter.ensure_newline()
            terminalreporter.section("sparkrig compliance, per host")
            for line in table.lines():
                terminalreporter.write_line(line)
        if config.getoption("--fleet-page") and not hasattr(config, "workerinput"):
            terminalreporter.write_line(f"fleet page: {write_fleet_page(config, table)}")
        for line in results.summary_lines(config):
            terminalreporter.write_line(line)
