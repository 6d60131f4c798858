"""
The controller's locks in the lab: hosts of one architecture hold byte-identical locks and the
same packages; a bumped pin changes one lock file (by the real refresh command) and, on the next
converge, only the venv; a stale lock stops the run before any host is touched; a host with no
route to the registries converges from the controller's wheels.

The lab's manifests are STAND-IN manifests (inventory/lab.py: the lab's CPU torch and vLLM
stand-in from the lab index), locked into the lab's state by sparkrig lock as the
real manifest is locked into group_data/python_stack.locks. Each test restores what it changed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

import lab
from lab.model import netns_name
from tests.conftest import LAB_INVENTORY
from tests.support import REPO, run_deploy

pytestmark = pytest.mark.lab
VENV = "/opt/sparkrig/venv"
LOCK = f"{VENV}/sparkrig/requirements.lock"
UV_AS_ROOT = "sudo env UV_CACHE_DIR=/var/cache/sparkrig/uv /opt/sparkrig/uv/bin/uv"


def _lab_inventory():
    """The lab's inventory module: it loads only once the lab is up (collection comes before)."""
    from inventory import lab  # noqa: PLC0415

    return lab


def _venv_op(result, host: str) -> list[str]:
    return [name for name in result.changed().get(host, []) if " | Virtualenv " in name]


def _freeze(host: str) -> str:
    return lab.run_ssh(host, f"{UV_AS_ROOT} pip freeze --python {VENV}/bin/python").stdout


def _lock(host: str) -> str:
    return lab.run_ssh(host, f"sudo cat {LOCK}").stdout


def _lock_cli(manifest, locks) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "lock", "--manifest", str(manifest), "--locks", str(locks)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_hosts_of_one_architecture_hold_identical_locks_and_packages(first_converge):
    assert first_converge.returncode == 0, first_converge.log

    controller = (_lab_inventory().LAB_LOCKS / "x86_64-py3.11.txt").read_text()
    first, second = _lock("lab-deb12"), _lock("lab-deb12-b")
    assert first == second
    # The controller's lock as it is (the lab's built wheel replacing nothing of it but its own entry).
    assert first.splitlines()[:4] == controller.splitlines()[:4]
    assert _freeze("lab-deb12") == _freeze("lab-deb12-b") != ""


def test_a_bumped_pin_changes_one_lock_file_and_then_only_the_venv(first_converge, tmp_path):
    assert first_converge.returncode == 0, first_converge.log

    host = "lab-deb13"
    manifest = yaml.safe_load((_lab_inventory().LAB_STACK / "trixie-amd64.yml").read_text())
    manifest["profiles"]["lab"]["six"] = "1.16.0"
    bumped_manifest = tmp_path / "trixie-amd64.yml"
    bumped_manifest.write_text(yaml.safe_dump(manifest))
    locks = tmp_path / "locks"
    locks.mkdir()
    for path in _lab_inventory().LAB_LOCKS.glob("*.txt"):
        (locks / path.name).write_bytes(path.read_bytes())
    before = {p.name: p.read_text() for p in locks.glob("*.txt")}

    inventory = tmp_path / "bumped.py"
    inventory.write_text(
        "import copy\n"
        "from inventory.lab import lab as _lab\n"
        "lab = [(name, copy.deepcopy(data)) for name, data in _lab]\n"
        "for _name, _data in lab:\n"
        "    _data['python_stack']['profiles']['lab']['six'] = '1.16.0'\n"
        f"    _data['python_stack_locks'] = {str(locks)!r}\n"
    )
    stale = run_deploy(str(inventory), "--limit", host)
    assert stale.returncode != 0
    assert "x86_64-py3.13-lab.txt is stale for its manifest: run `uv run sparkrig lock" in stale.log
    assert stale.changed() == {} and "nothing was changed on any host" in stale.log

    refreshed = _lock_cli(bumped_manifest, locks)
    assert refreshed.returncode == 0, refreshed.stderr
    after = {p.name: p.read_text() for p in locks.glob("*.txt")}
    assert [n for n in after if after[n] != before[n]] == ["x86_64-py3.13-lab.txt"]
    assert "six==1.16.0 \\" in after["x86_64-py3.13-lab.txt"].splitlines()

    result = run_deploy(str(inventory), "--limit", host)
    assert result.returncode == 0, result.log
    assert result.changed() == {host: _venv_op(result, host)} and _venv_op(result, host), result.changed()
    assert "six==1.16.0" in _freeze(host).splitlines()

    back = run_deploy(LAB_INVENTORY, "--limit", host)
    assert back.returncode == 0, back.log
    assert back.changed() == {host: _venv_op(back, host)}, back.changed()
    again = run_deploy(LAB_INVENTORY, "--limit", host)
    assert again.changed() == {}, again.log


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def test_a_host_without_a_route_to_the_registries_converges_from_the_controllers_wheels(first_converge, tmp_path):
    """LAB INFRASTRUCTURE: the host's default route is removed from its network namespace for
    the test (its gateway, the lab's repository server and SSH stay on the link); restored after."""
    assert first_converge.returncode == 0, first_converge.log
    host, twin = "lab-deb12-b", "lab-deb12"
    ns = netns_name(host)
    route = _ip("-n", ns, "route", "show", "default").stdout.split()
    assert route[:2] == ["default", "via"], route
    cache = tmp_path / "wheels"
    _ip("-n", ns, "route", "del", "default")
    try:
        probe = lab.run_ssh(host, "curl -sS -m 10 -o /dev/null https://pypi.org/simple/ && echo reached || true")
        assert "reached" not in probe.stdout, "the host still reaches PyPI"
        lab.run_ssh(host, f"sudo rm -rf {VENV}")  # everything must come from the controller's wheels
        offline = ["--data", "python_offline=True", "--data", f"python_offline_cache={cache}"]
        result = run_deploy(LAB_INVENTORY, "--limit", host, *offline)
        assert result.returncode == 0, result.log[-4000:]
        assert _freeze(host) == _freeze(twin)
        assert lab.run_ssh(host, "ls /var/lib/sparkrig/python-wheels").stdout.split()
        again = run_deploy(LAB_INVENTORY, "--limit", host, *offline)
        assert again.changed() == {}, again.log
    finally:
        _ip("-n", ns, "route", "add", "default", "via", route[2])
    back = run_deploy(LAB_INVENTORY, "--limit", host)
    assert back.returncode == 0, back.log
    # python_offline off again: the controller's wheels leave the host, and the venv stays.
    assert lab.run_ssh(host, "test -e /var/lib/sparkrig/python-wheels || echo gone").stdout.strip() == "gone"
    assert _freeze(host) == _freeze(twin)
    assert run_deploy(LAB_INVENTORY, "--limit", host).changed() == {}
