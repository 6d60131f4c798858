"""
A FAULT for the gated rollout's lab test (tests/converge/test_fleet_lab.py), as a pytest plugin
of the compliance suite that sparkrig rollout runs after each batch converged:
``PYTEST_ADDOPTS="-p tests.converge.rollout_fault"`` with ``SPARKRIG_TEST_FAULT_HOST=HOST``.
When the suite is about to check HOST, the plugin puts swap back in its /etc/fstab, as a
hand edit would: the host converged, then drifted, and its swap control fails. Without the
plugin (the --resume run) the next converge removes the line, and the host is proven.

The fault needs ``SPARKRIG_COMPLIANCE_EARLY=0`` too, and refuses to run without it: sparkrig
check sends each host's reads before pytest loads this plugin (the suite's early.py), so an
early answer could read the fstab before the fault is in it and prove the host.
"""

from __future__ import annotations

import os

import pytest

import lab

FAULT_LINE = "/swap.img none swap sw 0 0"


# First: the suite's own pytest_configure starts reading every host (its prefetch, fstab
# included) in a thread; the fault must be in place before that read.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it once
        return
    host = os.environ.get("SPARKRIG_TEST_FAULT_HOST", "")
    if host and os.environ.get("SPARKRIG_COMPLIANCE_EARLY") != "0":
        raise pytest.UsageError(
            "tests.converge.rollout_fault needs SPARKRIG_COMPLIANCE_EARLY=0: an early read would see no fault"
        )
    limit = {name for item in config.getoption("--limit", default=[]) or [] for name in item.split(",")}
    if host and host in limit:
        lab.run_ssh(host, f"echo '{FAULT_LINE}' | sudo tee -a /etc/fstab >/dev/null")
