"""
Session fixtures for the lab: boot the fleet once, converge it once, tear it down.

Tests marked ``lab`` skip, naming the reason, where the lab cannot run (not root,
a tool missing). ``--keep-lab`` leaves the fleet up after the run for a look.
"""

from __future__ import annotations

import pytest

from tests import lab
from tests.support import DeployResult, run_deploy

LAB_INVENTORY = "inventory/lab.py"


def pytest_addoption(parser):
    parser.addoption("--keep-lab", action="store_true", help="leave the lab hosts running after the tests")


@pytest.fixture(scope="session")
def lab_hosts(request):
    missing = lab.missing_requirements()
    if missing:
        pytest.skip("the lab cannot run on this machine: " + "; ".join(missing))
    hosts = lab.up()
    yield hosts
    if not request.config.getoption("--keep-lab"):
        lab.down()


@pytest.fixture(scope="session")
def first_converge(lab_hosts) -> DeployResult:
    """The deploy, run once against the fresh lab fleet."""
    return run_deploy(LAB_INVENTORY)
