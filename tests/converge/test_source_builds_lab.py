"""
Source builds in the lab, with a small real C extension (lab/sourcebuild.py) that the
lab serves from a git repository: the fleet builds it once and every host installs the wheel;
a build survives its deploy's SSH connection being cut and is never started twice; a changed
ref rebuilds and reinstalls; a failed build leaves the venv as it was and reports the
journal's tail.

The lab's two hosts (Debian 12 with Python 3.11, Debian 13 with Python 3.13) share one
profile and the project builds for the stable ABI, so they form one group: a fleet of 2
hosts, one build. Each test restores what it changed, so the fleet stays converged for the
compliance suite.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest

import lab
from lab.model import FLAVOURS
from tests.conftest import LAB_INVENTORY
from tests.support import PYINFRA, REPO, run_deploy

pytestmark = pytest.mark.lab
VENV = "/opt/sparkrig/venv"
BUILD = "lab-ext"
BUILDS = f"/var/lib/sparkrig/source-builds/{BUILD}"
WHEELHOUSE = f"/var/lib/sparkrig/wheelhouse/{BUILD}"
BUILDER = "lab-deb12"  # first in inventory order


def _sh(host: str, command: str, check: bool = True) -> str:
    return lab.run_ssh(host, f"sudo sh -c {shlex.quote(command)}", check=check).stdout


def _answer(host: str) -> str:
    code = "import sparkrig_lab_ext as m; print(m.answer())"
    # -B: no __pycache__ owned by root in a venv its owner must be able to sync.
    return _sh(host, f"{VENV}/bin/python -B -c {shlex.quote(code)}").strip()


def _installed(host: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
    )
    return json.loads(_sh(host, f"{VENV}/bin/python -c {shlex.quote(code)}"))


def _launches(host: str) -> int:
    """How many times a build unit started on ``host`` (each start appends a line)."""
    out = _sh(host, f"cat {BUILDS}/*/work/launches 2>/dev/null; true")
    return len(out.split())


def _active_units(host: str) -> list[str]:
    out = _sh(host, "systemctl list-units --state=active --no-legend --plain 'sparkrig-build-*'")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _variant(tmp_path, **changes) -> str:
    """The lab inventory with the lab build's entry changed."""
    path = tmp_path / "variant.py"
    path.write_text(
        "import copy\n"
        "from inventory.lab import lab as _lab\n"
        "lab = [(name, copy.deepcopy(data)) for name, data in _lab]\n"
        "for _name, _data in lab:\n"
        f"    _data['source_builds'][{BUILD!r}].update({changes!r})\n"
    )
    return str(path)


def _refs() -> dict:
    return json.loads(lab.inventory_path().read_text())["sources"]["refs"]


def _restore(host: str) -> None:
    """Back to the lab inventory's build (its wheel comes from the controller's cache)."""
    back = run_deploy(LAB_INVENTORY, "--limit", host)
    assert back.returncode == 0, back.log
    assert _answer(host) == "1"
    again = run_deploy(LAB_INVENTORY, "--limit", host)
    assert again.changed() == {}, again.log


def test_the_fleet_builds_once_and_every_host_installs_the_wheel(lab_hosts, first_converge):
    assert first_converge.returncode == 0, first_converge.log
    names = [host.name for host in lab_hosts]
    assert len(names) >= 2
    # One build per architecture (a wheel with a C extension is per platform): the first
    # host of each in fleet order builds; the others of its architecture receive it.
    arch = {host.name: FLAVOURS[host.flavour].arch for host in lab_hosts}
    builder = {name: next(n for n in names if arch[n] == arch[name]) for name in names}
    assert builder[BUILDER] == BUILDER
    builds = {name: _launches(name) for name in names}
    assert builds == {name: int(builder[name] == name) for name in names}, builds
    for name in names:
        assert _answer(name) == "1"
        stamps = _sh(name, f"cat {WHEELHOUSE}/*/stamp.json").splitlines()
        assert len(stamps) == 1
        stamp = json.loads(stamps[0])
        assert stamp["built_on"] == builder[name] and stamp["commit"] == _refs()["v1.0"]["commit"]
    # Only the builders ran the build's operation; the others received the wheel.
    ops = first_converge.changed()
    for name in set(builder.values()):
        assert [op for op in ops[name] if "Source build lab-ext, on its builder" in op]
    for name in names:
        if builder[name] != name:
            assert not [op for op in ops[name] if "Source build lab-ext, on its builder" in op], ops[name]
            assert [op for op in ops[name] if "from the controller's cache" in op], ops[name]


def test_a_build_survives_its_deploy_being_cut_and_a_new_ref_reinstalls(first_converge, tmp_path):
    assert first_converge.returncode == 0, first_converge.log
    host = BUILDER
    before = _launches(host)
    # A new ref whose build waits 40 s before it compiles: time to cut the deploy.
    inventory = _variant(tmp_path, ref="v2.0", env={"SPARKRIG_LAB_BUILD_SLEEP": "40"})
    deploy = subprocess.Popen(
        [PYINFRA, "-y", "--limit", host, inventory, "deploy.py"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not _active_units(host):
            assert deploy.poll() is None, "the deploy ended before the build started"
            assert time.monotonic() < deadline, "the build unit never started"
            time.sleep(1)
    finally:
        # Cut the deploy and its SSH connection while the build runs.
        os.killpg(deploy.pid, signal.SIGKILL)
        deploy.wait()
    time.sleep(2)
    assert _active_units(host), "the build died with the deploy's SSH connection"
    assert _launches(host) == before + 1

    # Detached: the next deploy finds the build running, starts nothing and returns at once.
    detached = run_deploy(inventory, "--limit", host, "--data", "source_builds_wait=False")
    assert detached.returncode == 0, detached.log
    assert "its wheel comes with a later deploy" in detached.log, detached.log[-3000:]
    assert _active_units(host) and _answer(host) == "1"

    # Waiting: the deploy after that waits for the same build and installs its wheel.
    waited = run_deploy(inventory, "--limit", host)
    assert waited.returncode == 0, waited.log
    assert _launches(host) == before + 1, "the build was started twice"
    assert _answer(host) == "2" and _installed(host)["sparkrig-lab-ext"] == "2.0.0"
    assert any("Built wheels into" in op for op in waited.changed()[host]), waited.changed()
    again = run_deploy(inventory, "--limit", host)
    assert again.changed() == {}, again.log

    _restore(host)
    assert _launches(host) == before + 1, "going back to a wheel the controller holds rebuilt it"


def test_a_failed_build_keeps_the_venv_and_reports_the_journal_tail(first_converge, tmp_path):
    assert first_converge.returncode == 0, first_converge.log
    host = BUILDER
    installed = _installed(host)
    before = _launches(host)
    broken = run_deploy(_variant(tmp_path, ref="v3.0-broken"), "--limit", host)
    assert broken.returncode != 0
    assert _launches(host) == before + 1
    assert "source build lab-ext failed (exit status" in broken.log, broken.log[-3000:]
    # The journal's tail holds the compiler's own message, under the build's operation.
    failed_op = broken.log.index("Starting operation: Source builds | Source build lab-ext, on its builder")
    assert "src/native.c:5:32: error:" in broken.log[failed_op:], broken.log[-3000:]
    assert _installed(host) == installed and _answer(host) == "1"

    # The failure is reported once; the next deploy of that ref tries again.
    retried = run_deploy(_variant(tmp_path, ref="v3.0-broken"), "--limit", host)
    assert retried.returncode != 0 and _launches(host) == before + 2, retried.log[-3000:]

    back = run_deploy(LAB_INVENTORY, "--limit", host)
    assert back.returncode == 0 and back.changed() == {}, back.log
    assert _installed(host) == installed
