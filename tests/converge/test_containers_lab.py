"""
Containers in the lab: the user's daemon.json is merged, not replaced; Docker really
runs with it; a key with the wrong fingerprint is refused on a real host.

Each test restores what it changed, so the fleet stays converged for the compliance suite.
"""

import json
import shlex

import pytest

import lab
from tests.conftest import LAB_INVENTORY, STOCK_DAEMON_JSON, stock_daemon_json
from tests.support import inventory_host_data, run_deploy

pytestmark = pytest.mark.lab
RUNTIME = {"nvidia": {"path": "nvidia-container-runtime", "args": []}}


@pytest.mark.parametrize("name", sorted(STOCK_DAEMON_JSON))
def test_user_daemon_json_is_merged_and_docker_runs_with_it(native_converge, name):
    assert native_converge.returncode == 0, native_converge.log
    config = json.loads(lab.run_ssh(name, "sudo cat /etc/docker/daemon.json").stdout)
    expected = {**stock_daemon_json(name), "runtimes": RUNTIME}
    if inventory_host_data(LAB_INVENTORY)[name].get("containers_nvidia_default_runtime"):
        expected["default-runtime"] = "nvidia"
    assert config == expected
    # The old file, byte for byte, beside it.
    backup = lab.run_ssh(name, "sudo cat /etc/docker/daemon.json.sparkrig-old").stdout
    assert json.loads(backup) == stock_daemon_json(name)
    # The running dockerd has read the merged file (it was restarted after the merge):
    # its data root and log driver are the user's, and it knows the nvidia runtime.
    info = json.loads(lab.run_ssh(name, "sudo docker info --format '{{json .}}'").stdout)
    assert info["DockerRootDir"] == STOCK_DAEMON_JSON[name].get("data-root", "/var/lib/docker")
    assert info["LoggingDriver"] == STOCK_DAEMON_JSON[name]["log-driver"]
    assert "nvidia" in info["Runtimes"]


def test_a_key_with_another_fingerprint_is_refused_and_nothing_changes(native_converge):
    assert native_converge.returncode == 0, native_converge.log
    host = "lab-deb13"
    keyring = "/etc/apt/keyrings/sparkrig-nvidia-container-toolkit.gpg"
    before = lab.run_ssh(host, f"sha256sum {keyring}").stdout
    data = inventory_host_data(LAB_INVENTORY)[host]
    # The docker repository's key, where the toolkit's is expected: a swapped key.
    result = run_deploy(
        LAB_INVENTORY,
        "--limit",
        host,
        "--data",
        f"containers_toolkit_key_fingerprint={data['containers_docker_key_fingerprint']}",
    )
    assert result.returncode != 0
    assert f"not {data['containers_docker_key_fingerprint']}: refusing it" in result.log
    assert lab.run_ssh(host, f"sha256sum {keyring}").stdout == before
    again = run_deploy(LAB_INVENTORY, "--limit", host)
    assert again.returncode == 0, again.log
    assert again.changed() == {}, again.log


def _update_with(host: str, sources_sed: str) -> str:
    """apt-get update of the toolkit's repository alone, its sources file passed through sed."""
    script = (
        "d=$(mktemp -d); "
        f"sed {shlex.quote(sources_sed)} /etc/apt/sources.list.d/sparkrig-nvidia-container-toolkit.sources "
        "> $d/x.sources; apt-get update -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$d "
        "-o Dir::State::Lists=$d 2>&1; echo rc=$?; rm -rf $d"
    )
    return lab.run_ssh(host, f"sudo sh -c {shlex.quote(script)}", check=False).stdout


def test_a_repository_is_trusted_with_its_own_key_only(native_converge):
    """The per-repository keyring is real: the toolkit's repository verifies with its own
    keyring, and apt refuses its index when given the docker repository's key instead."""
    assert native_converge.returncode == 0, native_converge.log
    own = _update_with("lab-deb13", "s#^##")
    assert "rc=0" in own and "NO_PUBKEY" not in own and "Err:" not in own, own
    swapped = _update_with("lab-deb13", "s#sparkrig-nvidia-container-toolkit.gpg#sparkrig-docker.gpg#")
    # gpgv says NO_PUBKEY, Debian 13's sqv "Missing key"; both end the same way.
    assert "is not signed" in swapped and "rc=0" not in swapped, swapped
