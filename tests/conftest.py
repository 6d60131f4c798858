"""
Session fixtures for the lab: boot the fleet once, converge it once, tear it down.

Tests marked ``lab`` skip, naming the reason, where the lab cannot run (not root,
a tool missing). ``--keep-lab`` leaves the fleet up after the run for a look. The
fixtures say on the terminal what the lab is doing as they go (:func:`lab_says`).
"""

from __future__ import annotations

import sys

from tests.compliance import early

# A compliance run's reads of each host go out now, before the heavy imports below
# (pyinfra, every concern's settings): tests/compliance/early.py.
early.start(sys.argv[1:])
early.collect_later(sys.argv[1:])

# isort: split
import contextlib
import json
import re
import shlex
import subprocess
import tempfile
import time
from types import SimpleNamespace

import pytest

import lab
from lab import hostile
from sparkrig.operations import declaring
from tests.support import PYINFRA, REPO, DeployResult, RunningDeploy, run_deploy

declaring()  # every concern imported: the tests know every setting, as deploy.py's run does

LAB_INVENTORY = "inventory/lab.py"
HOSTILE_INVENTORY = "inventory/lab_hostile.py"

# The lab hosts start like a stock Spark: swap in /etc/fstab (Sparks ship with swap),
# beside a line that merely names "swap" and must stay byte for byte. lab-deb12's file
# has a CRLF line and no final newline, as hand-edited files do. `noauto`: the disk is
# absent in the lab, and systemd would wait for it at boot.
STOCK_FSTAB = {
    "lab-deb12": (
        b"# /etc/fstab: static file system information.\n"
        b"/swap.img\tnone\tswap\tsw\t0\t0\n"
        b"LABEL=SWAP   none  swap  defaults,pri=5  0 0\r\n"
        b"/dev/sdb1 /mnt/swapdata ext4 noauto,nofail 0 2"
    ),
    "lab-deb13": (
        b"UUID=5f3c9d3e-2a41-4b8e-9d0c-3f1e2a7b6c5d none swap sw,nofail 0 0\n"
        b"# /dev/sdc2 none swap sw 0 0\n"
        b"/dev/sdb1\t/mnt/swap\\040data\text4\tnoauto\t0\t2\n"
    ),
}

# ... and with a daemon.json of the user's own, which the deploy must merge into, not
# replace (Debian 12's docker.io is 20.10: no dockerd --validate there).
STOCK_DAEMON_JSON = {
    "lab-deb12": {"log-driver": "json-file", "log-opts": {"max-size": "10m", "max-file": "3"}, "live-restore": True},
    "lab-deb13": {
        "data-root": "/var/lib/docker-data",
        "log-driver": "local",
        "default-address-pools": [{"base": "10.240.0.0/16", "size": 24}],
    },
}


def stock_daemon_json(name: str) -> dict:
    """The daemon.json a lab host starts with. lab-deb13 also trusts the lab's registry
    (plain HTTP on the repository server), as a fleet trusts its own private registry:
    its NGC stand-in image is pulled from there by digest."""
    import lab  # noqa: PLC0415 - the lab's modules only where a test uses the lab

    config = dict(STOCK_DAEMON_JSON[name])
    if name == "lab-deb13":
        hosts = {h["name"]: h for h in json.loads(lab.inventory_path().read_text())["hosts"]}
        config["insecure-registries"] = [hosts[name]["apt_repo_url"].split("://", 1)[1]]
    return config


def lab_says(config, message: str) -> None:
    """One line on the terminal now: the lab's phases take minutes, and pytest holds back
    what fixtures print (stdout, stderr, logging) unless a test fails."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:  # an xdist worker: its controller does the talking
        return
    capture = config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line(f"lab: {message}")


@pytest.fixture
def say(request):
    """:func:`lab_says` for a test: ``say("converge 2/2 ...")``."""
    return lambda message: lab_says(request.config, message)


def deploy_summary(result: DeployResult) -> str:
    """The deploy's own last line ("4 hosts, no changes"; sparkrig/summary.py), or its exit status."""
    found = re.findall(r"^--> (\d+ hosts?, .*)$", result.log, re.MULTILINE)
    return found[-1] if found else f"exit status {result.returncode}"


def pytest_addoption(parser):
    parser.addoption("--keep-lab", action="store_true", help="leave the lab hosts running after the tests")
    parser.addoption(
        "--reuse-lab",
        action="store_true",
        help="use the lab left up by --keep-lab (or a `lab up --hosts` of default hosts) as it is "
        "(no fresh boot); implies --keep-lab",
    )


def pytest_collection_modifyitems(config, items):
    """The real_stack tests (GBs of wheels, tens of minutes) run only when ``-m`` names them
    (``uv run pytest -m real_stack``): the default run, CI's and ``-m "not lab"`` leave them out."""
    if "real_stack" in (config.getoption("markexpr") or ""):
        return
    chosen = [item for item in items if item.get_closest_marker("real_stack") is None]
    if len(chosen) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
        items[:] = chosen


def write_stock_files(name: str) -> None:
    """The files a host's owner had before sparkrig (``STOCK_FSTAB``, ``STOCK_DAEMON_JSON``):
    on every host the lab boots, and on one a test installs afresh (``lab.recreate``)."""
    import lab  # noqa: PLC0415

    if name in STOCK_FSTAB:
        lab.run_ssh(name, "sudo tee /etc/fstab >/dev/null", input=STOCK_FSTAB[name].decode())
    if name in STOCK_DAEMON_JSON:
        lab.run_ssh(
            name,
            "sudo mkdir -p /etc/docker && sudo tee /etc/docker/daemon.json >/dev/null",
            input=json.dumps(stock_daemon_json(name), indent=4) + "\n",
        )


@pytest.fixture(scope="session")
def lab_hosts(request):
    import lab  # noqa: PLC0415

    missing = lab.missing_requirements()
    if missing:
        pytest.skip("the lab cannot run on this machine: " + "; ".join(missing))
    if request.config.getoption("--reuse-lab"):
        running = {h["name"]: h for h in lab.status()}
        # A lab of some of the default hosts (`lab up --hosts lab-deb12:debian12,...`) serves
        # the tests of those hosts.
        if (
            not running
            or not set(running) <= {name for name, _ in lab.BOOTED_FLEET}
            or not all(h["ssh_ok"] for h in running.values())
        ):
            pytest.fail(f"--reuse-lab: the lab is not up with default hosts, each reachable: {running}")
        yield [SimpleNamespace(**h) for h in running.values() if not lab.FLAVOURS[h["flavour"]].hostile]
        return
    started = time.monotonic()
    images = lab.images_to_build()
    lab_says(
        request.config,
        f"booting {len(lab.BOOTED_FLEET)} hosts ("
        + ", ".join(name for name, _ in lab.BOOTED_FLEET)
        + ")"
        + (f", building the {' and '.join(images)} images first (once; a few minutes)" if images else ""),
    )
    hosts = lab.up()
    lab_says(request.config, f"{len(hosts)} hosts up in {time.monotonic() - started:.0f} s")
    for host in hosts:
        write_stock_files(host.name)
    # The hostile host boots with the fleet but is no member of it: its own tests play it
    # (tests/converge/test_hostile_lab.py, the ``hostile_host`` fixture).
    yield [host for host in hosts if not lab.FLAVOURS[host.flavour].hostile]
    if request.config.getoption("--keep-lab"):
        lab_says(request.config, "--keep-lab: the hosts stay up (python -m lab down removes them)")
        return
    started = time.monotonic()
    lab_says(request.config, "tearing the lab down")
    lab.down()
    lab_says(request.config, f"lab down in {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="session")
def hostile_host(lab_hosts) -> str:
    """The name of the lab's hostile host (lab/hostile.py), up and reachable; the tests that
    play it skip, saying so, when the lab was brought up without it."""
    running = {h["name"]: h for h in lab.status()}
    names = [name for name, _ in lab.HOSTILE_FLEET if running.get(name, {}).get("ssh_ok")]
    if not names:
        pytest.skip(f"the lab is up without its hostile host ({lab.HOSTILE_FLEET[0][0]}): `lab up` boots it by default")
    return names[0]


def start_hostile_converge() -> subprocess.Popen | None:
    """The hostile host's users and canaries made (lab/hostile.py, from a venv no attacker
    touched), then its clean converge started in the background; None without the host."""
    running = {h["name"]: h for h in lab.status()}
    names = [name for name, _ in lab.HOSTILE_FLEET if running.get(name, {}).get("ssh_ok")]
    if not names:
        return None
    prepare = hostile.DISARM + f"\nrm -rf {hostile.VENV} {hostile.RAN_AS}*\n" + hostile.PREPARE
    lab.run_ssh(names[0], f"sudo sh -c {shlex.quote(prepare)}", timeout=300)
    # Its output into a file (read once it ended): a pipe nobody reads would stop it.
    output = tempfile.TemporaryFile()
    process = subprocess.Popen(
        [PYINFRA, "-y", HOSTILE_INVENTORY, "deploy.py"],
        cwd=REPO,
        stdout=output,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    process.output = output  # type: ignore[attr-defined]
    return process


@pytest.fixture(scope="session")
def lab_locks(lab_hosts) -> list[str]:
    """The lab's locks (``up`` made them; --reuse-lab finds them fresh, or makes them)."""
    from lab.stack import make_locks  # noqa: PLC0415

    return make_locks()


def limit(names) -> list[str]:
    """pyinfra's --limit for these hosts (one option each: a comma is no list there)."""
    return [arg for name in names for arg in ("--limit", name)]


@pytest.fixture(scope="session")
def native_converge(request, lab_hosts, lab_locks):
    """Converge 1/2 of the hosts that run natively here, the fleet's first deploy.

    An emulated host (lab-gb10, aarch64 under qemu-user) takes several times as long, and
    pyinfra runs a fleet operation by operation: in one run every host waited for it at each
    operation. So the emulated hosts converge in a run of their own (the same inventory and
    deploy, ``--limit``), started beside this one; it runs on into the tests that touch no
    emulated host (they take this fixture), and :func:`first_converge` waits for it."""
    started = time.monotonic()
    # The hostile host's clean converge runs beside the fleet's (its own inventory): its tests
    # (tests/converge/test_hostile_lab.py) take it from there, having waited for it.
    request.config.sparkrig_hostile_converge = start_hostile_converge()
    emulated = [host.name for host in lab_hosts if lab.FLAVOURS[host.flavour].emulated]
    native = [host.name for host in lab_hosts if host.name not in emulated]
    beside = None
    if emulated and native:
        beside = RunningDeploy(LAB_INVENTORY, *limit(emulated))
        request.config.sparkrig_emulated_converge = (beside, emulated, started)
        lab_says(
            request.config,
            f"converge 1/2: deploy.py on {len(native)} fresh hosts, and in a run of its own beside it "
            f"on the emulated {', '.join(emulated)}",
        )
        result = run_deploy(LAB_INVENTORY, *limit(native))
    else:
        lab_says(request.config, f"converge 1/2: deploy.py on {len(lab_hosts)} fresh hosts")
        result = run_deploy(LAB_INVENTORY)
    lab_says(
        request.config,
        f"converge 1/2: {deploy_summary(result)}, in {time.monotonic() - started:.0f} s"
        + (f" ({', '.join(emulated)} still converging)" if beside and beside.process.poll() is None else ""),
    )
    yield result
    if beside is not None:  # a session of native tests alone ends before it
        beside.stop()


@pytest.fixture(scope="session")
def first_converge(request, native_converge) -> DeployResult:
    """The deploy, run once against the fresh lab fleet (its locks made first): every host's
    converge 1/2 (:func:`native_converge`), the emulated hosts' run waited for, one result."""
    background = getattr(request.config, "sparkrig_emulated_converge", None)
    if background is None:
        return native_converge
    beside, emulated, started = background
    waited = time.monotonic()
    result = beside.result()
    lab_says(
        request.config,
        f"converge 1/2 on {', '.join(emulated)}: {deploy_summary(result)}, in {time.monotonic() - started:.0f} s "
        f"(waited {time.monotonic() - waited:.0f} s for it)",
    )
    return DeployResult.merged([native_converge, result])
