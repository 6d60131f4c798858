"""
Targets of the compliance suite: every host of a pyinfra inventory, over SSH.

    pytest tests/compliance --inventory inventory/spark.py [--limit GROUP_OR_HOST] [--junitxml report.xml]

reaches each host with the inventory's own SSH settings (ssh_hostname, ssh_user,
ssh_port, ssh_key, known hosts) through testinfra's ``ssh://`` backend, and checks
it against the settings pyinfra would deploy to it (group_data included).
``--limit`` picks hosts as pyinfra's does (a group, or a host name glob). The
controls run in parallel, spread over pytest-xdist workers (one per host, at least
6, at most 8; ``-n N`` chooses another number, ``-n 0`` none), and the run ends with
a table of passed/failed/skipped controls per host.
testinfra's own ``--hosts`` also works; the hosts are then checked against
group_data/all.py alone. With neither, the suite targets the local lab: it boots
and converges the lab fleet first.
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from testinfra.backend.local import LocalBackend
from testinfra.backend.ssh import SshBackend

from sparkrig.profile import AUTO, HardwareIdentity, choose_profile
from sparkrig.settings import all_settings, resolve
import lab
from tests.conftest import LAB_INVENTORY, lab_says
from tests.compliance import reads
from tests.support import REPO, inventory_host_data, ssh_config_for

# A question about a path is read once with everything else about that path, and
# host-wide constants once per host (tests/compliance/reads.py says when it forgets).
reads.install(SshBackend)
reads.install(LocalBackend)
# What every host is asked, the hardware identity included (the `identity` fixture's command).
CONSTANTS = (*reads.EVERY_HOST, HardwareIdentity().command().get_raw_value())


def pytest_addoption(parser):
    parser.addoption(
        "--inventory",
        help="pyinfra inventory whose hosts the compliance suite checks (default: the local lab)",
    )
    parser.addoption(
        "--limit", action="append", default=[],
        help="with --inventory: only these hosts, as pyinfra's --limit (group or host glob; "
             "comma-separated or repeated)",
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


def pytest_sessionstart(session):
    """Without workers, the controls run here: the constants before the first of them."""
    constants(session.config)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With --inventory, the controls spread over xdist workers (one per host, at least
    MIN_WORKERS, at most MAX_WORKERS; all share each host's one SSH connection), unless -n
    was given; TOGETHER's controls of one host stay in one worker."""
    inventory = config.getoption("--inventory")
    if not inventory or not config.pluginmanager.hasplugin("xdist"):
        return
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # an xdist worker: it runs this hook too, and must not start workers of its own
    if config.option.numprocesses is not None:  # -n given: keep it, group by host
        if config.option.numprocesses and config.option.dist in ("no", "load"):
            config.option.dist = "loadgroup"
        return
    hosts = inventory_hosts(config)
    config.option.numprocesses = min(max(len(hosts), MIN_WORKERS), MAX_WORKERS)
    config.option.dist = "loadgroup"


# One SSH connection per host for the whole suite. testinfra asks ssh for
# ControlMaster=auto but names no ControlPath (and its --ssh-extra-args never reaches
# the hosts it makes), so without this every command pays a whole SSH handshake:
# about 0.25 s here, and 5 round trips more over a slow link. The sockets live in a
# directory of the user's alone: in /tmp anyone could plant a master that answers
# every control.
def control_dir() -> Path:
    """The private directory of the suite's SSH control sockets (made 0700 if missing):
    ``$XDG_RUNTIME_DIR/sparkrig-ssh``, else ``~/.cache/sparkrig/ssh``. One that is a link,
    not the user's, or open to others is refused."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(runtime) / "sparkrig-ssh" if runtime else Path.home() / ".cache" / "sparkrig" / "ssh"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise pytest.UsageError(
            f"{path} (SSH control sockets) must be a directory of yours with mode 0700, not a link "
            f"(found uid {found.st_uid}, mode {stat.filemode(found.st_mode)}): remove it or fix it"
        )
    return path


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
        return
    if inventory:
        config.sparkrig_targets = "inventory"
        hosts = inventory_hosts(config)
        ssh_config = Path(config.rootpath) / ".pytest_cache" / "sparkrig-ssh-config"
        write_multiplexed(ssh_config_for(hosts), ssh_config)
        names = list(hosts)
        if hasattr(config, "workerinput"):
            reads.seed(config.workerinput.get("sparkrig_constants", {}))
        else:
            # Read once here, for every worker, while the workers start (this also opens each
            # host's shared connection); constants(config) waits for it.
            config.sparkrig_prefetch = ThreadPoolExecutor(max_workers=1).submit(
                reads.prefetch, str(ssh_config), names, CONSTANTS)
    else:
        config.sparkrig_targets = "lab"
        # Written once the lab is up (_lab_ssh_config): the lab's own, multiplexed.
        ssh_config = Path(config.rootpath) / ".pytest_cache" / "sparkrig-lab-ssh-config"
        names = [name for name, _flavour in lab.DEFAULT_FLEET]
    config.option.hosts = ",".join(testinfra_spec(name) for name in names)
    _TABLE.names = list(names)
    config.option.ssh_config = str(ssh_config)


def as_venv_owner(host, owner: str, command: str) -> str:
    """``command`` as the venv's owner when the suite runs as root (the owner can replace
    every file of the venv: root never runs them), else as the suite's own user."""
    return f"runuser -u {shlex.quote(owner)} -- {command}" if host.user().uid == 0 else command


def testinfra_spec(name: str) -> str:
    """pyinfra's ``@local`` is testinfra's local backend; every other host is reached over SSH."""
    return "local://" if name == "@local" else f"ssh://{name}"


def inventory_name(host) -> str:
    """The inventory name of a testinfra host (the reverse of :func:`testinfra_spec`)."""
    return "@local" if host.backend.NAME == "local" else host.backend.get_hostname()


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
        request.getfixturevalue("host_data")
        write_multiplexed(lab.ssh_config_path().read_text(), Path(request.config.option.ssh_config))
        lab_says(request.config, f"compliance suite against the {len(_TABLE.names)} lab hosts")


@pytest.fixture
def settings(host, host_data) -> dict:
    """The effective sparkrig settings of the host under test: its data over the defaults."""
    data = host_data.get(inventory_name(host))
    if data is None:  # a --hosts target: what group_data/all.py says for every host
        data = {k: v for k, v in runpy.run_path(str(REPO / "group_data" / "all.py")).items()
                if not k.startswith("_")}
    return resolve(all_settings(), data)


@pytest.fixture
def identity(host) -> dict:
    """What the host under test says it is (sparkrig.profile.HardwareIdentity's shape)."""
    command = HardwareIdentity().command().get_raw_value()
    return HardwareIdentity().process(host.check_output(command).splitlines())


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
    for item in items:
        if here not in Path(item.fspath).parents:
            continue
        if config.sparkrig_targets == "lab":
            item.add_marker(pytest.mark.lab)
        callspec = getattr(item, "callspec", None)
        if callspec and "_testinfra_host" in callspec.params:
            together = TOGETHER.get(Path(item.fspath).stem)
            if together:
                item.add_marker(pytest.mark.xdist_group(f"{inventory_name(callspec.params['_testinfra_host'])}/{together}"))


# Controls that share something they set up on a host run one after the other, in one
# worker: the container controls import the lab's stand-in image into the same place.
# Every other control reads or makes what it alone uses, and may run beside any other.
TOGETHER = {"test_containers": "containers", "test_ngc": "containers"}


# --- the per-host table ----------------------------------------------------------

def host_of(nodeid: str, names) -> str | None:
    """The inventory name in a control's test id, or None. testinfra's id comes first in the
    brackets (``[ssh://NAME]``, ``[local://]``), joined by "-" to other parameters, so the
    longest of the known ``names`` that fits wins (host names contain "-" too)."""
    if "[local://" in nodeid:
        return "@local"
    fits = [name for name in names
            if f"[ssh://{name}]" in nodeid or f"[ssh://{name}-" in nodeid]
    return max(fits, key=len) if fits else None


# testinfra's repr of a command's result, in its errors (a failed check_output, an
# unreached host): its exit status, command and stderr, as bytes literals.
_COMMAND_RESULT = re.compile(
    r"CommandResult\(.*?exit_status=(?P<rc>\d+), command=b(?P<q>['\"])(?P<command>.*?)(?P=q), "
    r"_stdout=b.*?, _stderr=b(?P<q2>['\"])(?P<stderr>.*?)(?P=q2)\)"
)
FINDING_MAX = 300


def found(report) -> str:
    """What a failed control found: the first line of its error, without the exception's
    type where that is an assertion's or pytest.fail's."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr or "")
    lines = message.strip().splitlines()
    line = lines[0] if lines else "(no message)"
    for prefix in ("AssertionError: ", "Failed: "):
        line = line.removeprefix(prefix)
    result = _COMMAND_RESULT.search(line)
    if result:
        stderr = result["stderr"].replace("\\r", "").replace("\\n", " ").strip()
        if result["rc"] == "255":  # ssh's own failure: the host unreached
            line = f"{stderr} (running: {result['command']})"
        else:
            line = f"a command exited {result['rc']}: {stderr or result['command']}"
    if len(line) > FINDING_MAX:
        line = line[:FINDING_MAX - 1] + "…"
    return f"{line} (at setup)" if report.when == "setup" else line


class HostTable:
    """Outcome of every control, per host: passed, failed, skipped (a control counts once,
    by its worst phase), and what each failed control found."""

    def __init__(self, names=()):
        self.names = list(names)
        self.outcomes: dict[str, dict[str, str]] = {}
        self.findings: dict[tuple[str, str], str] = {}

    def add(self, report) -> None:
        target = host_of(report.nodeid, self.names)
        if target is None:
            return
        # module::control[params]: a parametrized control counts once per parameter, as pytest counts.
        path, _, test = report.nodeid.partition("::")
        test = test.rsplit("]@", 1)[0] + "]" if "]@" in test else test  # xdist's group suffix
        key = f"{path.rsplit('/', 1)[-1]}::{test}"
        known = self.outcomes.setdefault(target, {})
        if report.failed:
            known[key] = "failed"
            self.findings.setdefault((target, key), found(report))
        elif report.skipped and known.get(key) != "failed":
            known[key] = "skipped"
        elif report.when == "call" and report.passed and key not in known:
            known[key] = "passed"

    def lines(self) -> list[str]:
        rows = [("host", "passed", "failed", "skipped")]
        failures = []
        for target in sorted(self.outcomes):
            counts = {o: 0 for o in ("passed", "failed", "skipped")}
            for control, outcome in sorted(self.outcomes[target].items()):
                counts[outcome] += 1
                if outcome == "failed":
                    failures.append(f"  {target}: {control}: {self.findings.get((target, control), '')}")
            rows.append((target, *(str(counts[o]) for o in ("passed", "failed", "skipped"))))
        width = max(len(r[0]) for r in rows)
        out = [f"{r[0]:<{width}}  {r[1]:>6}  {r[2]:>6}  {r[3]:>7}" for r in rows]
        return out + (["failed controls:", *failures] if failures else [])


_TABLE = HostTable()


def pytest_runtest_logreport(report):
    """Every report, also those xdist's workers send to the controller."""
    _TABLE.add(report)


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
