"""The CMA control (tests/compliance/test_updates.py), run on recorded and CONSTRUCTED
/proc/meminfo files (tests/unit/operations/data/memory/README.md) through a fake reading."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkrig.profile import profiles_check
from tests.compliance import test_updates as control

DATA = Path(__file__).parent / "data" / "memory"
GB10 = {"arch": "aarch64", "compute_capability": "12.1", "torch_cuda_arch_list": "12.1a"}


def _read(name: str):
    text = (DATA / name).read_text()
    return lambda need: SimpleNamespace(check=lambda: text)


def test_the_parser_reads_cma_lines_and_nothing_else():
    assert control._cma((DATA / "meminfo-dev-machine.txt").read_text()) == {}  # recorded: no CMA
    assert control._cma((DATA / "meminfo-gb10-cma-broken-CONSTRUCTED.txt").read_text()) == {
        "CmaTotal": 0,
        "CmaFree": 9437184,
    }
    assert control._cma("CmaTotal: 12\x1b[2J kB\nCmaFree: x kB\n") == {}


def test_cma_free_above_total_fails_naming_both_and_the_fix():
    with pytest.raises(AssertionError, match="CmaFree 9437184 kB is above CmaTotal 0 kB.*kho=off"):
        control.test_cma_free_is_never_above_cma_total(_read("meminfo-gb10-cma-broken-CONSTRUCTED.txt"), GB10)


def test_a_healthy_cma_passes_and_the_profiles_total_is_compared_where_it_says():
    healthy = _read("meminfo-gb10-cma-healthy-CONSTRUCTED.txt")
    control.test_cma_free_is_never_above_cma_total(healthy, GB10)
    control.test_cma_free_is_never_above_cma_total(healthy, {**GB10, "cma_total_kib": 524288})
    with pytest.raises(AssertionError, match="CmaTotal is 524288 kB, the hardware profile expects 1048576 kB"):
        control.test_cma_free_is_never_above_cma_total(healthy, {**GB10, "cma_total_kib": 1048576})


def test_no_cma_lines_skip():
    with pytest.raises(pytest.skip.Exception, match="no CMA lines"):
        control.test_cma_free_is_never_above_cma_total(_read("meminfo-dev-machine.txt"), GB10)


def test_a_profile_may_say_its_cma_total_and_nothing_else_new():
    assert profiles_check({"gb10": {**GB10, "cma_total_kib": 524288}}, {}) is None
    assert profiles_check({"gb10": {**GB10, "cma_total_kib": "512M"}}, {}) is not None
    assert profiles_check({"gb10": {**GB10, "cma": 1}}, {}) is not None
