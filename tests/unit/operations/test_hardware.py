"""Hardware profiles: the box read by a fact, contradictions refused, "auto" chosen."""

from __future__ import annotations

import os
import subprocess

import pytest

from sparkrig import profile
from sparkrig.operations import hardware as hw
from sparkrig.settings import problems
from tests.unit.pyinfra_fake import plan

PROFILES = profile.DEFAULT_PROFILES
SPARK = {"arch": "aarch64", "gpus": [{"compute_capability": "12.1", "name": "NVIDIA GB10"}]}
RTX = {"arch": "x86_64", "gpus": [{"compute_capability": "12.0", "name": "NVIDIA GeForce RTX 5070 Ti"}]}
LAB = {"arch": "x86_64", "gpus": []}
FACT = "uname -m"


def _process(lines):
    return profile.HardwareIdentity().process(lines)


def test_fact_reads_arch_and_every_gpu():
    assert _process(["aarch64", "12.1, NVIDIA GB10"]) == SPARK
    two = _process(["x86_64", "9.0, NVIDIA H100 80GB HBM3", "9.0, NVIDIA H100 80GB HBM3"])
    assert [g["compute_capability"] for g in two["gpus"]] == ["9.0", "9.0"]


def test_fact_without_nvidia_smi_or_with_a_failing_driver_sees_no_gpu():
    assert _process(["x86_64"]) == LAB
    # nvidia-smi's own error text on a box whose driver is not loaded.
    assert _process(["x86_64", "NVIDIA-SMI has failed because it couldn't communicate"]) == LAB


def test_fact_command_runs_in_sh_and_parses(tmp_path):
    """The real command, in dash, with a stand-in nvidia-smi on PATH (named as such)."""
    standin = tmp_path / "nvidia-smi"
    standin.write_text("#!/bin/sh\necho '12.1, NVIDIA GB10'\n")
    standin.chmod(0o755)
    command = profile.HardwareIdentity().command().get_raw_value()
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(["dash", "-c", command], capture_output=True, text=True, env=env, check=True)
    assert _process(out.stdout.splitlines()) == {"arch": os.uname().machine, "gpus": SPARK["gpus"]}
    standin.unlink()
    out = subprocess.run(["dash", "-c", command], capture_output=True, text=True, env=env, check=True)
    assert _process(out.stdout.splitlines()) == {"arch": os.uname().machine, "gpus": []}


def test_a_spark_matches_gb10_and_an_rtx_box_rtx50():
    assert profile.contradiction("gb10", PROFILES["gb10"], SPARK) is None
    assert profile.contradiction("rtx50", PROFILES["rtx50"], RTX) is None


def test_a_contradiction_names_the_profile_what_it_says_and_what_the_box_is():
    problem = profile.contradiction("gb10", PROFILES["gb10"], RTX)
    assert problem.startswith(
        "hardware_profile 'gb10' says architecture aarch64 and compute capability 12.1, "
        "but the box is x86_64, GPU NVIDIA GeForce RTX 5070 Ti (12.0)"
    )
    assert problem.endswith("nothing was changed on it")
    assert "compute capability 9.0" in profile.contradiction("hopper", PROFILES["hopper"], RTX)


def test_without_a_gpu_only_the_architecture_is_checked():
    assert profile.contradiction("rtx50", PROFILES["rtx50"], LAB) is None
    assert "no GPU visible" in profile.contradiction("gb10", PROFILES["gb10"], LAB)


@pytest.mark.parametrize(("box", "chosen"), [(SPARK, "gb10"), (RTX, "rtx50")])
def test_auto_chooses_the_one_matching_profile(box, chosen):
    assert profile.choose_profile(PROFILES, box) == (chosen, None)


def test_auto_refuses_to_guess_between_profiles_or_without_one():
    name, problem = profile.choose_profile(PROFILES, LAB)
    assert name is None and "cannot choose between hopper, rtx50" in problem
    name, problem = profile.choose_profile(PROFILES, {"arch": "riscv64", "gpus": []})
    assert name is None and "no profile in hardware_profiles matches the box (riscv64" in problem


def test_a_matching_box_costs_one_fact_and_no_operation():
    assert plan(hw.hardware, data={"hardware_profile": "rtx50"}, responses={FACT: ["x86_64"]}) == []


def test_a_contradicting_box_gets_one_operation_that_fails_it():
    (op,) = plan(hw.hardware, data={"hardware_profile": "gb10"}, responses={FACT: ["x86_64", "12.0, RTX"]})
    assert op.name == "Hardware profile | The box is the hardware its profile says"
    assert op.commands[0].startswith("echo 'sparkrig: hardware_profile '\"'\"'gb10'\"'\"' says architecture")
    assert op.commands[0].endswith(">&2; exit 1")


def test_auto_on_an_undecidable_box_fails_it():
    (op,) = plan(hw.hardware, data={"hardware_profile": "auto"}, responses={FACT: ["x86_64"]})
    assert "cannot choose between hopper, rtx50" in op.commands[0]


def test_auto_is_a_valid_setting_and_a_typo_is_not():
    assert problems(hw.SETTINGS, {"hardware_profile": "auto"}) == []
    assert problems(hw.SETTINGS, {"hardware_profile": "Auto"}) == [
        "hardware_profile = 'Auto': allowed is 'auto' or one of the profiles in hardware_profiles: gb10, hopper, rtx50"
    ]


# HardwareIdentity's output as read on the lent H100 (Ubuntu 24.04, driver 580.159.04, 2026-11-23).
H100 = ["x86_64", "9.0, NVIDIA H100 80GB HBM3"]


def test_a_real_h100_is_hopper_and_contradicts_gb10_and_rtx50():
    box = _process(H100)
    assert box == {"arch": "x86_64", "gpus": [{"compute_capability": "9.0", "name": "NVIDIA H100 80GB HBM3"}]}
    assert profile.choose_profile(PROFILES, box) == ("hopper", None)
    assert "architecture aarch64 and compute capability 12.1" in profile.contradiction("gb10", PROFILES["gb10"], box)
    assert (
        "says compute capability 12.0, but the box is x86_64, GPU NVIDIA H100 80GB HBM3 (9.0)"
        in profile.contradiction("rtx50", PROFILES["rtx50"], box)
    )


def test_a_box_that_prints_nothing_fails_its_profile_check_instead_of_the_run():
    """pyinfra hands a fact's default, not its parser, an empty output: the host must then
    fail with a message (no profile matches a box of no architecture), never raise."""
    identity = profile.HardwareIdentity.default()
    problem = profile.contradiction("gb10", profile.DEFAULT_PROFILES["gb10"], identity)
    assert problem and "uname -m printed nothing" in problem


def test_the_compliance_control_fails_with_the_contradiction_alone():
    """Not `assert '...' is None` around it, as it read on the lent GPU machine."""
    from tests.compliance import test_hardware  # noqa: PLC0415 - testinfra, only here

    with pytest.raises(AssertionError) as failed:
        test_hardware.test_the_box_is_the_hardware_its_profile_says({"hardware_profile": "gb10"}, RTX, PROFILES["gb10"])
    assert str(failed.value).splitlines()[0] == profile.contradiction("gb10", PROFILES["gb10"], RTX)
