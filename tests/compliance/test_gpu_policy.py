"""
GPU policy controls: the persistence mode, SM clock cap and power limit the settings ask for
are what the GPU holds now, re-applied this boot by sparkrig-gpu-policy.service; and no GPU is
held back by heat.

What the GPU must hold is worked out here from the settings (per hardware profile), apart from
the code that converges (operations/gpu_policy/); the GPU's state is read with the one reading
of nvidia-smi (sparkrig/gpu.py). Where the host has no GPU the controls skip, saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from sparkrig import gpu

from .reads import need

UNIT = "sparkrig-gpu-policy.service"
FILES = ("/etc/sparkrig/gpu-policy.env", "/usr/local/sbin/sparkrig-gpu-policy", f"/etc/systemd/system/{UNIT}")
# Held back by heat or by the board's power delivery: what a cap is meant to prevent. (A power
# cap, sw_power_cap, is what gpu_power_limit_w asks for, and idling is no fault.)
THERMAL = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@need
def state(r) -> dict:
    """What the GPU policy controls read of the host: the GPU's state and the unit's record
    (as root: the record is root's), the unit, the files."""
    return {
        "gpu": r.run(gpu.script(), sudo=True),
        "unit": r.service(UNIT),
        "result": r.run("systemctl show --property=Result --value %s", UNIT),
        "boot": r.run("cat /proc/sys/kernel/random/boot_id"),
        "files": {path: r.path(path) for path in FILES},
    }


def expected(settings: Mapping[str, Any], profile_name: str) -> dict[str, Any]:
    """What the settings ask of a host of this hardware profile."""

    def value(key):
        found = settings[key]
        return found.get(profile_name) if isinstance(found, Mapping) else found

    return {
        "persistence": bool(settings["gpu_persistence"]),
        "clock_max_mhz": value("gpu_clock_max_mhz"),
        "power_limit_w": value("gpu_power_limit_w"),
    }


def gpus_of(found: Mapping[str, Any]) -> dict[str, Any]:
    """The host's GPU state; the control skips, saying why, where there is none."""
    answer = found["gpu"]
    if answer.rc != 0:
        pytest.skip(f"the GPU's state could not be read (exit {answer.rc}): {answer.stderr.strip()[:200]}")
    state = gpu.parse(answer.stdout.splitlines())
    if state["problem"] or not state["gpus"]:
        pytest.skip(f"no NVIDIA GPU to check on this host: {state['problem'] or 'nvidia-smi lists none'}")
    return state


def persistence_problems(state: Mapping[str, Any]) -> list[str]:
    return [
        f"GPU {g['index']} ({g['name']}): persistence mode expected Enabled, is "
        f"{ {True: 'Enabled', False: 'Disabled'}.get(g['persistence'], 'unknown') }"
        for g in state["gpus"]
        if g["persistence"] is not True
    ]


def clock_problems(cap: int, state: Mapping[str, Any], boot: str) -> list[str]:
    """The cap's lock cannot be queried: the unit's record of THIS boot says it was applied,
    and no GPU runs its SM clock above it."""
    found = []
    record = state["applied"] or {}
    applied = record.get("settings", {}).get("clock_max_mhz")
    if record.get("boot") != boot:
        found.append(
            f"SM clock cap expected {cap} MHz applied this boot, but the unit's record is "
            f"{'of another boot' if record else 'missing'} ({gpu.APPLIED})"
        )
    elif applied != {"value": cap, "ok": True, "exit": 0}:
        found.append(f"SM clock cap expected {cap} MHz applied, the unit's record says {applied}")
    found += [
        f"GPU {g['index']} ({g['name']}): SM clock expected at most {cap} MHz, is {g['clocks_sm_mhz']:g} MHz"
        for g in state["gpus"]
        if g["clocks_sm_mhz"] is not None and g["clocks_sm_mhz"] > cap
    ]
    return found


def power_problems(limit: int, state: Mapping[str, Any]) -> list[str]:
    return [
        f"GPU {g['index']} ({g['name']}): power limit expected {limit} W, is "
        f"{'N/A' if g['power_limit_w'] is None else format(g['power_limit_w'], 'g') + ' W'}"
        for g in state["gpus"]
        if g["power_limit_w"] is None or abs(g["power_limit_w"] - limit) > 0.5
    ]


def thermal_problems(state: Mapping[str, Any]) -> list[str]:
    return [
        f"GPU {g['index']} ({g['name']}): expected no heat or power-brake slowdown, active: "
        f"{', '.join(r for r in g['reasons'] if r in THERMAL)} at {g['temperature_c']} °C"
        for g in state["gpus"]
        if set(g["reasons"] or ()) & set(THERMAL)
    ]


def _none(problems: list[str]) -> None:
    """Fail with every problem found, each naming what was expected and what the GPU holds."""
    assert not problems, "; ".join(problems)


@pytest.fixture
def policy(settings, profile_name) -> dict:
    wanted = expected(settings, profile_name)
    if not (wanted["persistence"] or wanted["clock_max_mhz"] is not None or wanted["power_limit_w"] is not None):
        pytest.skip(
            f"no GPU policy set for this host (hardware profile {profile_name}): gpu_persistence is False, "
            "gpu_clock_max_mhz and gpu_power_limit_w are None"
        )
    return wanted


def test_gpu_policy_unit_runs_at_boot_and_succeeded(read, policy):
    """Protects against a policy that a reboot undoes (nvidia-smi's settings are lost at every
    boot, so applying them once is not enough) and against a setting the driver refused
    (the unit then failed, and its journal says what nvidia-smi answered)."""
    found = read(state)
    gpus_of(found)
    assert found["unit"].is_enabled, f"{UNIT} is not enabled: a reboot would drop the GPU policy"
    assert found["result"].check() == "success", (
        f"{UNIT}: expected its last run to succeed, Result={found['result'].check()} "
        f"(journalctl -u {UNIT} -b says what nvidia-smi refused)"
    )


def test_persistence_mode_is_on(read, policy):
    """Protects against a driver that tears down and re-initialises the GPU between clients
    (each job's start pays for it, and settings held only while it is loaded are lost)."""
    if not policy["persistence"]:
        pytest.skip("gpu_persistence is False for this host: persistence is left as it is")
    _none(persistence_problems(gpus_of(read(state))))


def test_sm_clock_is_capped(read, policy):
    """Protects against a GPU boosting to its hottest clock after a reboot or a driver reload:
    the cap (GB10 owners report 91 °C without one, 65 °C with 2100 MHz) must hold now."""
    cap = policy["clock_max_mhz"]
    if cap is None:
        pytest.skip("gpu_clock_max_mhz is None for this host: its clocks are left alone")
    found = read(state)
    _none(clock_problems(cap, gpus_of(found), found["boot"].check()))


def test_power_limit_is_the_configured_one(read, policy):
    """Protects against a power limit lost at reboot, or set by someone else since: the GPU
    draws what its default allows, and the box runs hotter and louder than its owner chose."""
    limit = policy["power_limit_w"]
    if limit is None:
        pytest.skip("gpu_power_limit_w is None for this host: its power limit is left alone")
    _none(power_problems(limit, gpus_of(read(state))))


def test_no_gpu_is_slowed_down_by_heat(read):
    """Protects against a GPU running hot enough that the hardware halves its clocks (thermal
    or power-brake slowdown): jobs crawl, and on GB10 a thermal shutdown is near."""
    _none(thermal_problems(gpus_of(read(state))))


@pytest.mark.parametrize("path", FILES)
def test_gpu_policy_files_are_root_owned_and_not_writable_by_others(read, policy, path):
    """Protects against privilege escalation: the script and its settings run as root at every
    boot, so whoever can change them runs code as root."""
    f = read(state)["files"][path]
    assert f.is_file, f"{path} is missing"
    assert (f.user, f.group) == ("root", "root")
    assert f.mode & 0o022 == 0, f"{path} has mode {f.mode:o}"
