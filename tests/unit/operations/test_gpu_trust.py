"""Root runs nvidia-smi only when root owns it and no other user may change it: the GPU's state
read (sparkrig/gpu.py's script), the GPU policy unit's script and the metrics collector are run
here as root against a STAND-IN nvidia-smi (a script written here; this machine has no GPU)
that is group-writable, or another user's, or root's alone. And the GPU policy's checks of a
value against what the GPU allows, with a power minimum apart from the clock floor.

tests/mutants.py changes each of these checks by one line; a test here fails for each."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkrig import gpu
from sparkrig.operations import gpu_policy as gp
from sparkrig.operations.gpu_policy import deploy as gp_deploy
from sparkrig.resources import TEMPLATES
from tests.unit.operations.test_gpu_policy import POLICY, QUERY, _host, fact_output
from tests.unit.operations.test_metrics import Collector, _standin, samples, scratch  # noqa: F401 (scratch: a fixture)
from tests.unit.pyinfra_fake import execute

NOBODY = 65534
# The stand-in's GPU: its power minimum (300 W) is above sparkrig's clock floor (gpu.CLOCK_MIN_MHZ, 200).
LINE = "0, NVIDIA STAND-IN, Enabled, 345, 1980, 72.62, 700.00, 300.00, 700.00, 700.00, 40, 0x0000000000000001"
# (owner uid, group gid, mode) of the stand-in nvidia-smi, and whether root may run it.
OWNERS = {
    "group may write": (0, NOBODY, 0o775, False),
    "group may write, group root": (0, 0, 0o775, False),
    "another user's, mode 755": (NOBODY, 0, 0o755, False),
    "another user's, mode 700": (NOBODY, NOBODY, 0o700, False),
    "root's alone": (0, 0, 0o755, True),
}


def _as_root():
    if os.geteuid() != 0:
        pytest.skip("the check is on who owns nvidia-smi and who may write it: run as root (CI does)")


def _smi(bindir: Path, marker: Path, owner: str, answer: str = "") -> Path:
    """A STAND-IN nvidia-smi that records that it ran, owned and moded as ``owner`` says."""
    uid, gid, mode, _ = OWNERS[owner]
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(
        f"#!/bin/sh\n# STAND-IN nvidia-smi (tests/unit/operations/test_gpu_trust.py)\ntouch {marker}\n{answer}"
    )
    os.chown(smi, uid, gid)
    smi.chmod(mode)
    return smi


@pytest.mark.parametrize("owner", OWNERS)
def test_the_gpu_state_read_runs_only_roots_nvidia_smi(tmp_path, owner):
    _as_root()
    tmp_path.chmod(0o755)
    ran = tmp_path / "ran"
    smi = _smi(
        tmp_path / "bin",
        ran,
        owner,
        f'echo "{LINE}"\n',
    )
    read = subprocess.run(
        ["sh", "-c", gpu.script()],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        env={"PATH": f"{smi.parent}:/usr/bin:/bin"},
    )
    state = gpu.parse(read.stdout.splitlines())
    if OWNERS[owner][3]:
        assert ran.exists() and state["problem"] is None and state["gpus"][0]["name"] == "NVIDIA STAND-IN", read
    else:
        assert not ran.exists(), f"root ran an nvidia-smi that is {owner}"
        assert state["gpus"] == [] and "is not root's alone" in state["problem"]


@pytest.mark.parametrize("owner", OWNERS)
def test_the_gpu_policy_unit_runs_only_roots_nvidia_smi(tmp_path, owner):
    """The unit's script as root, in a private mount namespace whose /run is fresh (it writes
    its record there): an nvidia-smi not root's alone is never run and nothing is applied."""
    _as_root()
    if shutil.which("unshare") is None:
        pytest.skip("running the unit's script needs unshare (a private /run)")
    tmp_path.chmod(0o755)
    ran = tmp_path / "ran"
    smi = _smi(tmp_path / "bin", ran, owner)
    script = TEMPLATES / "gpu_policy" / "sparkrig-gpu-policy.sh"
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs tmpfs /run && sh {script}; echo "script-exit $?"'],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{smi.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "GPU_PERSISTENCE": "1"},
    )
    if OWNERS[owner][3]:
        assert ran.exists() and "script-exit 0" in result.stdout, result.stdout + result.stderr
    else:
        assert not ran.exists(), f"root ran an nvidia-smi that is {owner}"
        assert "script-exit 1" in result.stdout
        assert "no root-owned nvidia-smi that only root may change" in result.stdout


@pytest.mark.parametrize("owner", OWNERS)
def test_the_metrics_collector_runs_only_roots_nvidia_smi(scratch, owner):  # noqa: F811
    _as_root()
    collector = Collector(scratch)
    ran = scratch / "ran"
    smi = _standin(collector.bin, f"touch {ran}\n")
    uid, gid, mode, trusted = OWNERS[owner]
    os.chown(smi, uid, gid)
    smi.chmod(mode)
    assert collector.run().returncode == 0
    gpu_lines = [s for s in samples(collector.prom()) if s.startswith("sparkrig_gpu")]
    if trusted:
        assert ran.exists() and "sparkrig_gpu_query_ok" in gpu_lines
    else:
        assert not ran.exists(), f"root ran an nvidia-smi that is {owner}"
        assert gpu_lines == []


def test_a_gpu_name_becomes_a_label_of_safe_characters(scratch):  # noqa: F811
    """The name on a line the collector reports (index and UUID well formed) holds a quote, a
    backslash and a brace: the sample line stays one well-formed sample."""
    _as_root()
    collector = Collector(scratch)
    _standin(
        collector.bin,
        "case \"$1\" in --query-gpu=*) printf '%s\\n' "
        "'0, GPU-1, Evil\"} 1 # \\\\ GPU, 580.1, 40, 50, 2100, 50, 0x0000000000000000' ;; *) exit 9 ;; esac\n",
    )
    assert collector.run().returncode == 0
    text = collector.prom()
    info = [line for line in text.splitlines() if line.startswith("sparkrig_gpu_info")]
    assert info == ['sparkrig_gpu_info{gpu="0",uuid="GPU-1",name="Evil 1   GPU"} 1'], text
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r'[a-z_]+(\{([a-z_]+="[^"\\\n]*",?)*\})? [0-9.e+-]+', line), line


# The policy's values against what the GPU allows ---------------------------------------


def test_a_power_limit_below_the_gpus_minimum_is_refused():
    assert gpu.CLOCK_MIN_MHZ < 250 < 300
    gpus = gpu.parse(fact_output(LINE))["gpus"]
    assert gpu.out_of_range("gpu_power_limit_w", 250, gpus) == (
        "gpu_power_limit_w = 250: allowed on GPU 0 (NVIDIA STAND-IN) is 300 to 700 W"
    )
    assert gpu.out_of_range("gpu_power_limit_w", 300, gpus) is None
    responses = _host(files=False, enabled=False)
    responses[QUERY] = fact_output(LINE)
    ops = execute(gp.gpu_policy, data={**POLICY, "gpu_power_limit_w": 250}, responses=responses)
    assert [op.name for op in ops] == ["GPU policy | The GPU policy fits what the GPU allows"]
    assert "is 300 to 700 W" in ops[0].commands[0]


def test_a_host_whose_nvidia_smi_lists_no_gpu_is_refused():
    """nvidia-smi answers (exit 0) but lists no GPU: the policy fails the host, nothing is written."""
    empty = {"problem": None, "gpus": [], "reasons_field": gpu.REASON_FIELDS[0], "applied": None}
    assert gp_deploy.problem({"persistence": True, "clock_max_mhz": None, "power_limit_w": None}, empty) == (
        "the GPU policy is set (persistence on, clock cap none MHz, power limit none W) but the host shows no GPU "
        "to apply it to: nvidia-smi lists none; nothing was changed"
    )
    responses = _host(files=False, enabled=False)
    responses[QUERY] = fact_output("")
    assert gpu.parse(responses[QUERY])["gpus"] == []
    ops = execute(gp.gpu_policy, data=POLICY, responses=responses)
    assert len(ops) == 1 and "nvidia-smi lists none" in ops[0].commands[0], [op.name for op in ops]
