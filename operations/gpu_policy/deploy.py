"""The GPU policy's deploy: its settings checked against what the GPU allows, the unit that
applies them at every boot written and enabled, and run when they changed or the GPU no
longer holds them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra.api import deploy
from pyinfra.operations import server, systemd

from sparkrig import atomic, host_settings, reading, rendering
from sparkrig.gpu import out_of_range
from sparkrig.messages import refused

from .facts import GpuState
from .settings import DEFAULTS, for_profile, needs_profile

UNIT = "sparkrig-gpu-policy.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
ENV_FILE = "/etc/sparkrig/gpu-policy.env"
SCRIPT = "/usr/local/sbin/sparkrig-gpu-policy"
UNIT_VALIDATOR = atomic.unit_file_validator(
    ["Unit", "Service", "Install"],
    {
        "Description": ".+",
        "After": "[A-Za-z0-9@._ -]+",
        "Type": "oneshot",
        "RemainAfterExit": "yes",
        "EnvironmentFile": ENV_FILE,
        "ExecStart": SCRIPT,
        "TimeoutStartSec": "[0-9]+",
        "WantedBy": "multi-user.target",
    },
)
# The env file: comments and the three settings, each empty or a whole number.
ENV_VALIDATOR = (
    "sh",
    "-c",
    'grep -Ev "$@"; [ $? -eq 1 ]',
    "sh",
    "-e",
    "^#",
    "-e",
    "^GPU_PERSISTENCE=[01]$",
    "-e",
    "^GPU_CLOCK_MAX_MHZ=[0-9]*$",
    "-e",
    "^GPU_POWER_LIMIT_W=[0-9]*$",
)

STATE = reading.part(atomic.HostState, paths=(UNIT_FILE, ENV_FILE, SCRIPT), units=(UNIT,))
GPU = reading.part(GpuState)


def wanted(settings: Mapping[str, Any], profile: str | None) -> dict[str, Any]:
    """What the policy asks of a host of hardware profile ``profile``."""
    return {
        "persistence": bool(settings["gpu_persistence"]),
        "clock_max_mhz": for_profile(settings["gpu_clock_max_mhz"], profile),
        "power_limit_w": for_profile(settings["gpu_power_limit_w"], profile),
    }


def is_set(policy: Mapping[str, Any]) -> bool:
    return policy["persistence"] or policy["clock_max_mhz"] is not None or policy["power_limit_w"] is not None


def set_anywhere(settings: Mapping[str, Any]) -> bool:
    """Whether the policy may be on for a host with these settings (before "auto" is resolved)."""
    values = (settings["gpu_clock_max_mhz"], settings["gpu_power_limit_w"])
    return bool(settings["gpu_persistence"]) or any(
        (any(v is not None for v in value.values()) if isinstance(value, Mapping) else value is not None)
        for value in values
    )


@reading.planner
def reads(settings):
    return [STATE, GPU] if set_anywhere(settings) else [STATE]


def problem(policy: Mapping[str, Any], gpu: Mapping[str, Any]) -> str | None:
    """Why the policy cannot be applied to this GPU (naming key, value and allowed range)."""
    if gpu["problem"] or not gpu["gpus"]:
        return (
            f"the GPU policy is set ({describe(policy)}) but the host shows no GPU to apply it to: "
            f"{gpu['problem'] or 'nvidia-smi lists none'}; nothing was changed"
        )
    for key, name in (("gpu_clock_max_mhz", "clock_max_mhz"), ("gpu_power_limit_w", "power_limit_w")):
        if policy[name] is not None:
            found = out_of_range(key, policy[name], gpu["gpus"])
            if found:
                return f"{found}; nothing was changed"
    return None


def describe(policy: Mapping[str, Any]) -> str:
    return (
        f"persistence {'on' if policy['persistence'] else 'left alone'}, clock cap "
        f"{policy['clock_max_mhz'] or 'none'} MHz, power limit {policy['power_limit_w'] or 'none'} W"
    )


def render_env(policy: Mapping[str, Any]) -> str:
    return rendering.render(
        "gpu_policy/gpu-policy.env.j2",
        unit=UNIT,
        persistence=int(policy["persistence"]),
        clock_max_mhz="" if policy["clock_max_mhz"] is None else policy["clock_max_mhz"],
        power_limit_w="" if policy["power_limit_w"] is None else policy["power_limit_w"],
    )


def render_unit() -> str:
    return rendering.render("gpu_policy/sparkrig-gpu-policy.service.j2", env_file=ENV_FILE, script=SCRIPT)


def render_script() -> str:
    return rendering.render("gpu_policy/sparkrig-gpu-policy.sh")


def drifted(policy: Mapping[str, Any], gpu: Mapping[str, Any]) -> list[str]:
    """What the GPU no longer holds of the policy this boot (empty: nothing to re-apply). The
    clock lock cannot be queried: the unit's record of this boot stands for it."""
    record = (gpu["applied"] or {}).get("settings", {})
    found = []
    for name in ("clock_max_mhz", "power_limit_w"):
        value = policy[name]
        if value is not None and record.get(name) != {"value": value, "ok": True, "exit": 0}:
            found.append(f"{name} {value} not applied this boot")
    for each in gpu["gpus"]:
        if policy["persistence"] and each["persistence"] is not True:
            found.append(f"GPU {each['index']} persistence mode off")
        limit = policy["power_limit_w"]
        if limit is not None and (each["power_limit_w"] is None or abs(each["power_limit_w"] - limit) > 0.5):
            found.append(f"GPU {each['index']} power limit {each['power_limit_w']} W")
    return found


@deploy("GPU policy", data_defaults=DEFAULTS)
def gpu_policy():
    """
    Hold the GPU's persistence mode, SM clock cap and power limit at every boot: a oneshot unit
    applies them, enabled here and run when its files changed or the GPU lost them.

    Settings: ``gpu_persistence``, ``gpu_clock_max_mhz``, ``gpu_power_limit_w``; see docs/settings.md.
    """
    settings = host_settings.current()
    state = reading.value(STATE)
    unit = state["units"].get(UNIT, {})
    profile = settings.get("hardware_profile")
    if needs_profile(settings) and host_settings.profile_or_refuse(settings, "gpu_policy") is None:
        return
    policy = wanted(settings, profile)
    if not is_set(policy):
        if unit.get("enabled") == "enabled":
            # The GPU keeps what was applied until the next boot, which no longer applies it.
            systemd.service(name=f"{UNIT} is disabled (no GPU policy set)", service=UNIT, running=None, enabled=False)
        return
    gpu = reading.value(GPU)
    refusal = problem(policy, gpu)
    if refusal:
        refused(name="The GPU policy fits what the GPU allows", message=refusal)
        return
    changed = [
        atomic.file_if_changed(
            name=f"GPU policy script ({SCRIPT})",
            dest=SCRIPT,
            content=render_script(),
            mode=0o755,
            validate=("sh", "-n"),
            current=state["files"].get(SCRIPT),
        ),
        atomic.file_if_changed(
            name=f"GPU policy settings ({ENV_FILE}: {describe(policy)})",
            dest=ENV_FILE,
            content=render_env(policy),
            validate=ENV_VALIDATOR,
            current=state["files"].get(ENV_FILE),
        ),
    ]
    changed = [op for op in changed if op]
    unit_op = atomic.unit_file(
        name=f"GPU policy unit ({UNIT_FILE})",
        dest=UNIT_FILE,
        content=render_unit(),
        validate=UNIT_VALIDATOR,
        reload_name="Reload systemd: the GPU policy unit changed",
        state=state["files"].get(UNIT_FILE),
    )
    if unit_op:
        changed.append(unit_op)
    if unit.get("enabled") != "enabled":
        systemd.service(name=f"{UNIT} runs at every boot", service=UNIT, running=None, enabled=True)
    lost = drifted(policy, gpu)
    if changed or lost:  # each write above was decided from the reading: it does change the file
        server.shell(
            name=f"Apply the GPU policy now ({', '.join(lost) or 'its settings changed'})",
            # The script's own words (what nvidia-smi refused) reach the deploy's output.
            commands=[f"systemctl restart {UNIT} || {{ journalctl -u {UNIT} -b -n 20 --no-pager -o cat >&2; false; }}"],
        )
