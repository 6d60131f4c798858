"""
Targets of the compliance suite: every host of a pyinfra inventory, over SSH.

    pytest tests/compliance --inventory inventory/spark.py

reaches each host with the inventory's own SSH settings (ssh_hostname, ssh_user,
ssh_port, ssh_key, known hosts) through testinfra's ``ssh://`` backend, and checks
it against the settings pyinfra would deploy to it (group_data included).
testinfra's own ``--hosts`` also works; the hosts are then checked against
group_data/all.py alone. With neither, the suite targets the local lab: it boots
and converges the lab fleet first.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from operations.settings import all_settings, resolve
from tests import lab
from tests.conftest import LAB_INVENTORY
from tests.support import REPO, inventory_host_data, ssh_config_for


def pytest_addoption(parser):
    parser.addoption(
        "--inventory",
        help="pyinfra inventory whose hosts the compliance suite checks (default: the local lab)",
    )


# One SSH connection per host for the whole suite. testinfra asks ssh for
# ControlMaster=auto but names no ControlPath, so without one every command pays a
# whole SSH handshake (about 0.2 s here, 10 round trips over a slow link).
CONTROL_PATH = "-o ControlPath=/tmp/sparkrig-ssh-%C"


def pytest_configure(config):
    if not config.option.ssh_extra_args:
        config.option.ssh_extra_args = CONTROL_PATH
    inventory = config.getoption("--inventory")
    if config.option.hosts:
        config.sparkrig_targets = "hosts"
        return
    if inventory:
        config.sparkrig_targets = "inventory"
        hosts = inventory_host_data(inventory)
        ssh_config = Path(config.rootpath) / ".pytest_cache" / "sparkrig-ssh-config"
        ssh_config.parent.mkdir(exist_ok=True)
        ssh_config.write_text(ssh_config_for(hosts))
        names = list(hosts)
    else:
        config.sparkrig_targets = "lab"
        ssh_config = lab.ssh_config_path()
        names = [name for name, _flavour in lab.DEFAULT_FLEET]
    config.option.hosts = ",".join(testinfra_spec(name) for name in names)
    config.option.ssh_config = str(ssh_config)


def testinfra_spec(name: str) -> str:
    """pyinfra's ``@local`` is testinfra's local backend; every other host is reached over SSH."""
    return "local://" if name == "@local" else f"ssh://{name}"


def inventory_name(host) -> str:
    """The inventory name of a testinfra host (the reverse of :func:`testinfra_spec`)."""
    return "@local" if host.backend.NAME == "local" else host.backend.get_hostname()


@pytest.fixture(scope="session")
def host_data(request) -> dict[str, dict]:
    """Each target's pyinfra data (empty for --hosts targets); in lab mode, after converging."""
    targets = request.config.sparkrig_targets
    if targets == "hosts":
        return {}
    if targets == "lab":
        result = request.getfixturevalue("first_converge")
        if result.returncode != 0:
            pytest.fail("the lab converge failed, so no control can be checked:\n" + result.log[-3000:])
        return inventory_host_data(str(REPO / LAB_INVENTORY))
    return inventory_host_data(request.config.getoption("--inventory"))


@pytest.fixture
def settings(host, host_data) -> dict:
    """The effective sparkrig settings of the host under test: its data over the defaults."""
    data = host_data.get(inventory_name(host))
    if data is None:  # a --hosts target: what group_data/all.py says for every host
        data = {k: v for k, v in runpy.run_path(str(REPO / "group_data" / "all.py")).items()
                if not k.startswith("_")}
    return resolve(all_settings(), data)


def pytest_collection_modifyitems(config, items):
    """In lab mode the controls need the lab: mark them so `-m "not lab"` leaves them out."""
    if config.sparkrig_targets == "lab":
        here = Path(__file__).parent
        for item in items:
            if here in Path(item.fspath).parents:
                item.add_marker(pytest.mark.lab)
