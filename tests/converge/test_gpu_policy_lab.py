"""
The GPU policy's unit holds a clock cap, a power limit and persistence mode across a reboot,
on a lab host that has no GPU: a STAND-IN nvidia-smi (lab/nvidia-smi-standin.sh, named as such,
removed after) takes the settings as root, records every call with the boot it came in, answers
queries from what it was set to, and forgets it all at a reboot, as a GPU does. The deploy runs
the concern alone (tests/converge/gpu_policy_deploy.py); ``lab.restart`` is the reboot (a clean
shutdown, a boot from the same root file system).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lab
from lab import dgxos
from tests.conftest import LAB_INVENTORY
from tests.support import REPO, run_check, run_deploy

pytestmark = pytest.mark.lab

HOST = "lab-deb12"
GPU = "12.0, NVIDIA GeForce RTX 5070 Ti"  # the lab inventory's profile for x86_64 hosts: rtx50
DEPLOY = "tests/converge/gpu_policy_deploy.py"
UNIT = "sparkrig-gpu-policy.service"
SETTINGS = (
    "--data",
    "gpu_persistence=true",
    "--data",
    'gpu_clock_max_mhz={"rtx50": 2100}',
    "--data",
    "gpu_power_limit_w=280",
)
QUERY = "nvidia-smi --query-gpu=persistence_mode,clocks.sm,power.limit --format=csv,noheader,nounits"


@pytest.fixture(scope="module")
def standin(lab_hosts):
    """The stand-in nvidia-smi on HOST; afterwards the stand-in, its records and the policy's
    unit and files are removed, so that the host is as before."""
    lab.run_ssh(
        HOST,
        f"sudo tee {dgxos.NVIDIA_SMI} >/dev/null && sudo chmod 755 {dgxos.NVIDIA_SMI} "
        f"&& sudo rm -f {dgxos.STANDIN_CALLS}",
        input=dgxos.nvidia_smi_standin(GPU),
    )
    yield HOST
    lab.run_ssh(
        HOST,
        f"sudo systemctl disable {UNIT}; sudo rm -f /etc/systemd/system/{UNIT} "
        "/etc/sparkrig/gpu-policy.env /usr/local/sbin/sparkrig-gpu-policy /run/sparkrig/gpu-policy.applied "
        f"{dgxos.NVIDIA_SMI} && sudo rm -rf /var/lib/sparkrig-lab-nvidia-smi /run/sparkrig-lab-nvidia-smi "
        "&& sudo systemctl daemon-reload",
        check=False,
    )


def _boot() -> str:
    return lab.run_ssh(HOST, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def _calls(boot: str) -> list[str]:
    """The setting calls the stand-in recorded in this boot: "uid=0 -pm 1", ..."""
    found = lab.run_ssh(HOST, f"sudo cat {dgxos.STANDIN_CALLS}", check=False).stdout
    return [line.split(" ", 1)[1] for line in found.splitlines() if line.startswith(boot + " ")]


def _assert_applied(boot: str) -> None:
    assert _calls(boot) == ["uid=0 -pm 1", "uid=0 -lgc 0,2100", "uid=0 -pl 280"]
    assert lab.run_ssh(HOST, QUERY).stdout.strip() == "Enabled, 2100, 280.00"
    shown = lab.run_ssh(HOST, f"systemctl show --property=ActiveState,Result,UnitFileState {UNIT}").stdout
    assert sorted(shown.split()) == ["ActiveState=active", "Result=success", "UnitFileState=enabled"], shown


def test_the_unit_applies_the_policy_and_a_second_run_changes_nothing(standin):
    boot = _boot()
    first = run_deploy(LAB_INVENTORY, "--limit", HOST, *SETTINGS, deploy=DEPLOY)
    assert first.returncode == 0, first.log
    assert HOST in first.changed(), first.log
    _assert_applied(boot)
    second = run_deploy(LAB_INVENTORY, "--limit", HOST, *SETTINGS, deploy=DEPLOY)
    assert second.returncode == 0 and second.changed() == {}, second.log
    assert len(_calls(boot)) == 3  # nothing applied again


def test_the_cap_is_back_after_a_reboot(standin):
    before = _boot()
    lab.restart(HOST)
    after = _boot()
    assert after != before
    # The GPU (the stand-in) forgot its settings at the reboot; the unit applied them again.
    _assert_applied(after)
    again = run_deploy(LAB_INVENTORY, "--limit", HOST, *SETTINGS, deploy=DEPLOY)
    assert again.returncode == 0 and again.changed() == {}, again.log


def test_a_cap_above_the_gpus_maximum_fails_the_host_and_changes_nothing(standin):
    env = lab.run_ssh(HOST, "cat /etc/sparkrig/gpu-policy.env").stdout
    boot = _boot()
    calls = _calls(boot)
    wrong = run_deploy(LAB_INVENTORY, "--limit", HOST, "--data", "gpu_clock_max_mhz=4000", deploy=DEPLOY)
    assert wrong.returncode != 0
    assert (
        "gpu_clock_max_mhz = 4000: allowed on GPU 0 (NVIDIA GeForce RTX 5070 Ti) is 200 to 3090 MHz; "
        "nothing was changed"
    ) in wrong.log, wrong.log
    assert lab.run_ssh(HOST, "cat /etc/sparkrig/gpu-policy.env").stdout == env
    assert _calls(boot) == calls


def test_the_gpu_state_is_read_as_the_report_shows_it(standin):
    """tools.report reads the GPU with the versions: the stand-in's temperature, power, SM clock,
    the cap the unit applied this boot, and its (no) clock event reasons."""
    result = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools.report", LAB_INVENTORY, "--limit", HOST, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cells = json.loads(result.stdout)["hosts"][HOST]["versions"]
    assert {k: v for k, v in cells.items() if k.startswith("gpu_")} == {
        "gpu_temp": "45 °C",
        "gpu_power": "32/280 W",
        "gpu_clock": "2100/3090 MHz",
        "gpu_cap": "2100 MHz",
        "gpu_reasons": "none",
    }


def _inventory_with_policy(tmp_path) -> str:
    """The lab's inventory with the policy's settings on HOST (as SETTINGS gives them)."""
    path = tmp_path / "inventory_gpu_policy.py"
    path.write_text(
        "import runpy\n"
        f"_lab = runpy.run_path({str(REPO / LAB_INVENTORY)!r})\n"
        "lab = [(name, {**data, **({'gpu_persistence': True, 'gpu_clock_max_mhz': {'rtx50': 2100}, "
        f"'gpu_power_limit_w': 280}} if name == {HOST!r} else {{}})}}) for name, data in _lab['lab']]\n"
    )
    return str(path)


def _controls(inventory: str) -> subprocess.CompletedProcess:
    return run_check(inventory, [HOST], "-rA", "-n", "0", "-k", "test_gpu_policy")


def test_the_controls_read_the_applied_state_and_name_what_they_find(standin, tmp_path):
    """The compliance controls pass on the converged host; a power limit changed behind the
    policy's back (as root, through the stand-in) fails its control naming expected and actual,
    and the next deploy applies the policy again."""
    inventory = _inventory_with_policy(tmp_path)
    passed = _controls(inventory)
    assert passed.returncode == 0, passed.stdout[-4000:]
    assert "8 passed" in passed.stdout and "skipped" not in passed.stdout.split("per host")[0], passed.stdout[-4000:]
    lab.run_ssh(HOST, "sudo nvidia-smi -pl 300")
    failed = _controls(inventory)
    assert failed.returncode == 1
    assert "GPU 0 (NVIDIA GeForce RTX 5070 Ti): power limit expected 280 W, is 300 W" in failed.stdout, failed.stdout[
        -4000:
    ]
    again = run_deploy(LAB_INVENTORY, "--limit", HOST, *SETTINGS, deploy=DEPLOY)
    assert again.returncode == 0 and list(again.changed()) == [HOST], again.log
    assert "Apply the GPU policy now (GPU 0 power limit 300.0 W)" in again.changed()[HOST][0], again.changed()
    assert _controls(inventory).returncode == 0
