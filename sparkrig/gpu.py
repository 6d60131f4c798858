"""
The GPU's state as ``nvidia-smi --query-gpu`` reports it, read one way (run from ``/``, a
root-owned nvidia-smi only, bounded in time, read-only) by the GPU policy's fact
(operations/gpu_policy), its compliance controls and tools.report: the command (:func:`script`)
and its parser (:func:`parse`), checked against a real H100's recorded output
(tests/unit/operations/data/gpu_policy/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import host_output, rendering

APPLIED = "/run/sparkrig/gpu-policy.applied"  # the GPU policy unit's record of this boot (templates/gpu_policy)
QUERY_TIMEOUT_S = 20
CLOCK_MIN_MHZ = 200  # the lowest SM clock cap sparkrig sets (a GPU's own minimum is lower)
# What the policy is checked against and what reports show, in this order.
FIELDS = (
    "index",
    "name",
    "persistence_mode",
    "clocks.sm",
    "clocks.max.sm",
    "power.draw",
    "power.limit",
    "power.min_limit",
    "power.max_limit",
    "power.default_limit",
    "temperature.gpu",
)
# The active clock event reasons' field: drivers from 535 name it clocks_event_reasons, older
# ones clocks_throttle_reasons (580 knows both). An unknown field is nvidia-smi's exit 2.
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# nvml.h's clocksEventReasons bits.
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the GPU is held back by heat or power (what an owner is alerted to).
THROTTLING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def script() -> str:
    """The read's shell (templates/sparkrig/gpu-state.sh.j2): from ``/``; a root-owned
    nvidia-smi only; the query with the first reasons field the driver knows, and its exit
    status; then the unit's record of this boot, if any."""
    return rendering.script(
        "sparkrig/gpu-state.sh.j2",
        reason_fields=" ".join(REASON_FIELDS),
        timeout_s=QUERY_TIMEOUT_S,
        fields=",".join(FIELDS),
        applied=APPLIED,
    )


def number(text: str) -> float | None:
    """A number of nvidia-smi's csv (nounits); None for ``[N/A]``, ``[Not Supported]`` and such."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        if text.startswith("[") or text in ("N/A", "Not Supported", ""):
            return None
        raise ValueError(f"not a number nvidia-smi prints: {text!r}") from None


def reasons(text: str) -> list[str] | None:
    """The names of the bits of an active-reasons bitmask (``0x0000000000000004``)."""
    text = text.strip()
    if not text.startswith("0x"):
        return None
    mask = int(text, 16)
    return [name for bit, name in REASONS.items() if mask & bit] + (
        [f"unknown_0x{mask & ~sum(REASONS):x}"] if mask & ~sum(REASONS) else []
    )


def gpu_line(line: str) -> dict[str, Any]:
    """One GPU's line of the query."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(FIELDS) + 1:
        raise ValueError(f"expected {len(FIELDS) + 1} fields, got {len(values)}: {line!r}")
    raw = dict(zip((*FIELDS, "reasons"), values))
    clock_max = number(raw["clocks.max.sm"])
    return {
        "index": int(raw["index"]),
        "name": raw["name"],
        "persistence": {"Enabled": True, "Disabled": False}.get(raw["persistence_mode"]),
        "clocks_sm_mhz": number(raw["clocks.sm"]),
        "clocks_max_sm_mhz": clock_max,
        "power_draw_w": number(raw["power.draw"]),
        "power_limit_w": number(raw["power.limit"]),
        "power_min_limit_w": number(raw["power.min_limit"]),
        "power_max_limit_w": number(raw["power.max_limit"]),
        "power_default_limit_w": number(raw["power.default_limit"]),
        "temperature_c": number(raw["temperature.gpu"]),
        "reasons": reasons(raw["reasons"]),
        "raw": {"clocks_max_sm_mhz": raw["clocks.max.sm"], "power_max_limit_w": raw["power.max_limit"]},
    }


def applied(lines: Sequence[str]) -> dict[str, Any]:
    """The unit's record: ``boot ID`` then ``WHAT VALUE ok`` or ``WHAT VALUE failed RC``."""
    found: dict[str, Any] = {"boot": None, "settings": {}}
    for line in lines:
        words = line.split()
        if len(words) == 2 and words[0] == "boot":
            found["boot"] = words[1]
        elif len(words) in (3, 4) and words[2] in ("ok", "failed"):
            found["settings"][words[0]] = {
                "value": int(words[1]),
                "ok": words[2] == "ok",
                "exit": int(words[3]) if len(words) == 4 else 0,
            }
        elif line.strip():
            raise ValueError(f"not a line of the unit's record: {line[:80]!r}")
    return found


def parse(output: Sequence[str]) -> dict[str, Any]:
    """The fact's value from the command's lines."""
    found: dict[str, Any] = {"gpus": [], "problem": None, "reasons_field": None, "applied": None}
    section, body = None, {"query": [], "applied": []}
    for line in output:
        if line.startswith("## "):
            words = line[3:].split()
            section = words[0]
            if section == "none":
                found["problem"] = "no nvidia-smi on the host (no NVIDIA driver)"
            elif section == "untrusted":
                where = host_output.printable(" ".join(words[1:])[:200])
                found["problem"] = (
                    f"{where} is not root's alone (another user owns it or may change it): not run as root"
                )
            elif section == "query":
                status, field = int(words[1]), words[2] if len(words) > 2 else None
                found["reasons_field"] = field
                if status != 0:
                    found["problem"] = f"nvidia-smi's query failed (exit {status})"
            continue
        if section in body:
            body[section].append(line)
    if found["problem"]:
        # nvidia-smi's own words, only shown: escaped (host_output.printable), not refused.
        said = host_output.printable(" ".join(line.strip() for line in body["query"] if line.strip())[:300])
        found["problem"] += f": {said}" if said and found["reasons_field"] else ""
    else:
        found["gpus"] = [gpu_line(line) for line in body["query"] if line.strip()]
    if body["applied"]:
        found["applied"] = applied(body["applied"])
    return found


def out_of_range(key: str, value: int, gpus: Sequence[Mapping[str, Any]]) -> str | None:
    """Why ``value`` of ``key`` is outside what each GPU allows, naming key, value and range."""
    field = {
        "gpu_clock_max_mhz": ("clocks_max_sm_mhz", "clocks_max_sm_mhz"),
        "gpu_power_limit_w": ("power_min_limit_w", "power_max_limit_w"),
    }[key]
    for gpu in gpus:
        low = gpu[field[0]] if key == "gpu_power_limit_w" else CLOCK_MIN_MHZ
        high = gpu[field[1]]
        where = f"GPU {gpu['index']} ({gpu['name']})"
        if low is None or high is None:
            what = "clocks.max.sm" if key == "gpu_clock_max_mhz" else "power.min_limit/power.max_limit"
            return (
                f"{key} = {value}: {where} reports no range to set it in ({what} is "
                f"{gpu['raw'].get(field[1], 'N/A')}): the driver does not offer this setting here; "
                f"set {key} to None for this host or its profile"
            )
        if not low <= value <= high:
            unit = "MHz" if key == "gpu_clock_max_mhz" else "W"
            return f"{key} = {value}: allowed on {where} is {low:g} to {high:g} {unit}"
    return None
