"""
The stock Spark's path in the lab: hosts that start as DGX OS does (lab-deb12-b on
x86_64, lab-gb10 on aarch64 under qemu-user emulation) converge with sparkrig's default
container settings and keep the Docker and toolkit packages they came with: same
versions, same source file, no repository added. lab-gb10 also keeps the default
hardware profile (gb10), checked against its STAND-IN nvidia-smi.
"""

import json

import pytest

import lab
from lab import dgxos
from lab.model import FLAVOURS
from sparkrig.settings import all_settings
from tests.conftest import LAB_INVENTORY
from tests.support import inventory_host_data

pytestmark = pytest.mark.lab

# What the lab replaces on the emulated Spark because it is out of reach here (vendor
# repositories and registries, PyPI's multi-GB CUDA torch, the real vLLM wheel, and so
# the locks of that stand-in stack, kept in the lab's state), or
# because the lab's hosts differ from a Spark (Debian's Python 3.11 instead of DGX OS's
# 3.12, the proxy's CA, the lab's source build, the kernel and driver stand-ins the version
# report shows), and the fleet's monitoring (which host runs the fleet's Prometheus, said on
# every host, at the lab's short intervals; the node exporter on the host's lab address,
# answering that host). Everything else is the default.
LAB_REPLACED = {
    "ca_certificates_extra",
    "containers_check_image",
    "metrics_allow",
    "metrics_listen",
    "prometheus_evaluation_interval_s",
    "prometheus_scrape_interval_s",
    "prometheus_server",
    "containers_docker_ce_packages",
    "containers_docker_key_fingerprint",
    "containers_docker_key_url",
    "containers_docker_repo_url",
    "containers_toolkit_key_fingerprint",
    "containers_toolkit_key_url",
    "containers_toolkit_packages",
    "containers_toolkit_repo_url",
    "python_stack",
    "python_stack_locks",
    "python_venv_python_preference",
    "source_builds",
    "source_builds_controller_cache",
    "source_builds_enabled",
    "updates_packages",
}


def _dgx_hosts() -> list[str]:
    return [name for name, flavour in lab.DEFAULT_FLEET if FLAVOURS[flavour].dgx_os]


def test_the_emulated_spark_runs_sparkrigs_defaults_but_for_what_is_out_of_reach(first_converge):
    assert first_converge.returncode == 0, first_converge.log
    data = inventory_host_data(LAB_INVENTORY)["lab-gb10"]
    overridden = {s.key for s in all_settings() if s.key in data and data[s.key] != s.default}
    assert overridden == LAB_REPLACED
    assert lab.run_ssh("lab-gb10", "uname -m").stdout.strip() == "aarch64"
    assert lab.run_ssh("lab-gb10", f"nvidia-smi {dgxos.HARDWARE_QUERY}").stdout.strip() == "12.1, NVIDIA GB10"


@pytest.mark.parametrize("name", _dgx_hosts())
def test_dgx_os_hosts_keep_their_preinstalled_docker_and_toolkit(first_converge, name):
    assert first_converge.returncode == 0, first_converge.log
    # The source file DGX OS wrote is the only one, as it was; sparkrig added no repository.
    assert lab.run_ssh(name, "ls /etc/apt/sources.list.d").stdout.split() == ["dgx.list"]
    assert "dgx/baseos ./" in lab.run_ssh(name, "cat /etc/apt/sources.list.d/dgx.list").stdout
    assert lab.run_ssh(name, "ls /etc/apt/keyrings 2>/dev/null | grep -c sparkrig", check=False).stdout.strip() in (
        "",
        "0",
    )
    # Each package is still the one installed from there, at that version.
    for package in dgxos.PACKAGES:
        policy = lab.run_ssh(name, f"apt-cache policy {package}").stdout.splitlines()
        installed = next(line.split(":", 1)[1].strip() for line in policy if "Installed:" in line)
        assert installed == "1.0", policy
        at = next(i for i, line in enumerate(policy) if line.strip().startswith("*** " + installed))
        origins = [line.split()[1] for line in policy[at + 1 :] if line.startswith("        ")]
        assert any(origin.endswith("/dgx/baseos") for origin in origins), policy
    # ... and wired up: the nvidia runtime is registered with the running Docker.
    info = json.loads(lab.run_ssh(name, "sudo docker info --format '{{json .Runtimes}}'").stdout)
    assert "nvidia" in info
