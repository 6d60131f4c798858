"""GPU policy: the GPU's state as nvidia-smi reports it, and what the unit applied this boot,
in one command (read-only: it only queries; sparkrig/gpu.py reads it)."""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase, StringCommand

from sparkrig import gpu, host_output

APPLIED = gpu.APPLIED


class GpuState(FactBase):
    """
    Returns each GPU's state as ``nvidia-smi --query-gpu`` reports it (run from ``/``, bounded
    in time; read-only), and the record the GPU policy's unit wrote this boot (None if none).
    Numbers nvidia-smi cannot give (``[N/A]``, as GB10 answers for memory) are None.

    .. code:: python

        {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "persistence": True,
                   "clocks_sm_mhz": 345.0, "clocks_max_sm_mhz": 1980.0, "power_draw_w": 72.62,
                   "power_limit_w": 700.0, "power_min_limit_w": 200.0, "power_max_limit_w": 700.0,
                   "power_default_limit_w": 700.0, "temperature_c": 40.0, "reasons": ["gpu_idle"], ...}],
         "problem": None, "reasons_field": "clocks_event_reasons.active",
         "applied": {"boot": "…", "settings": {"clock_max_mhz": {"value": 2100, "ok": True, "exit": 0}}}}
    """

    def command(self) -> StringCommand:
        return StringCommand(gpu.script())

    @host_output.parses
    def process(self, output: list[str]) -> dict[str, Any]:
        return gpu.parse(output)

    @staticmethod
    def default() -> dict[str, Any]:
        return {"gpus": [], "problem": "nvidia-smi printed nothing", "reasons_field": None, "applied": None}
