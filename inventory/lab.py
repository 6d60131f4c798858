"""
The local lab fleet: Debian hosts booted with systemd-nspawn by `python -m tests.lab up`.

Reads the lab's inventory.json (addresses, lab SSH key, known_hosts) so the
deploy talks to the lab exactly as it talks to a Spark: over SSH, as an
ordinary user with sudo, with strict host key checking.
"""

import json as _json

from tests.lab import inventory_path as _inventory_path

if not _inventory_path().exists():
    raise SystemExit(
        f"sparkrig: the lab is not up ({_inventory_path()} is missing): "
        "run `python -m tests.lab up` first"
    )

_inventory = _json.loads(_inventory_path().read_text())
_repo = _inventory["apt_repo"]


def _containers(host: dict) -> dict:
    """Docker and the toolkit in the lab, which cannot reach Docker's or NVIDIA's
    repositories: the lab serves signed repositories laid out like theirs, holding
    STAND-IN packages named as such (sparkrig-lab-standin-*). Debian 12 takes Docker
    from the distribution (docker.io, for real); Debian 13 from the lab's docker-ce-like
    repository, whose stand-in package installs Debian's docker.io."""
    url = host["apt_repo_url"]
    data = {
        "containers_toolkit_repo_url": url + "/nvidia/libnvidia-container/stable/deb/{arch}",
        "containers_toolkit_key_url": url + "/nvidia/libnvidia-container/gpgkey",
        "containers_toolkit_key_fingerprint": _repo["nvidia_key_fingerprint"],
        "containers_toolkit_packages": [_repo["toolkit_package"]],
        # No Docker Hub from the lab: the compliance suite imports this image from busybox.
        "containers_check_image": "sparkrig-lab/busybox:stand-in",
    }
    if host["flavour"] == "debian12":
        return {**data, "containers_docker_source": "distro"}
    return {
        **data,
        "containers_docker_source": "docker-ce",
        "containers_docker_repo_url": url + "/docker/linux/{os}",
        "containers_docker_key_url": url + "/docker/linux/{os}/gpg",
        "containers_docker_key_fingerprint": _repo["docker_key_fingerprint"],
        "containers_docker_ce_packages": [_repo["docker_package"]],
        "containers_nvidia_default_runtime": True,
        "containers_docker_users": ["spark"],
    }


lab = [
    (
        _host["name"],
        {
            "ssh_hostname": _host["address"],
            "ssh_user": _host["ssh_user"],
            "ssh_key": _host["ssh_key"],
            "ssh_known_hosts_file": _host["known_hosts"],
            "ssh_strict_host_key_checking": "yes",
            "_sudo": True,
            # The lab hosts are x86_64 without a GPU: they stand in for RTX 50xx boxes.
            "hardware_profile": "rtx50",
            "lab_flavour": _host["flavour"],
            **_containers(_host),
        },
    )
    for _host in _inventory["hosts"]
]
