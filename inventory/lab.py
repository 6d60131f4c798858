"""
The local lab fleet: Debian hosts booted with systemd-nspawn by `python -m lab up`.

Reads the lab's inventory.json (addresses, lab SSH key, known_hosts) so the
deploy talks to the lab exactly as it talks to a Spark: over SSH, as an
ordinary user with sudo, with strict host key checking.
"""

import json as _json
from pathlib import Path as _Path

import yaml as _yaml

from lab import FLAVOURS as _FLAVOURS
from lab import inventory_path as _inventory_path
from lab import realstack as _realstack
from lab.config import CLUSTER_KEYS as _CLUSTER_KEYS
from lab.config import METRICS_PORT as _METRICS_PORT
from lab.config import WHEEL_CACHE as _WHEEL_CACHE
from sparkrig.operations.source_builds.settings import load_catalogue as _load_catalogue
from sparkrig.stack_locks import load_manifest as _load_manifest

if not _inventory_path().exists():
    raise SystemExit(f"sparkrig: the lab is not up ({_inventory_path()} is missing): run `python -m lab up` first")

_inventory = _json.loads(_inventory_path().read_text())
_repo = _inventory["apt_repo"]


def _containers(host: dict) -> dict:
    """Docker and the toolkit in the lab, which cannot reach Docker's or NVIDIA's
    repositories: the lab serves signed repositories laid out like theirs, holding
    STAND-IN packages named as such (sparkrig-lab-standin-*). The DGX OS hosts (flavours
    dgxos and gb10) keep the default sources ("auto"): they start with Docker and the
    toolkit installed from the lab's DGX OS stand-in source (lab/dgxos.py), which
    the deploy must keep. Debian 12 takes Docker from the distribution (docker.io, for
    real); Debian 13 from the lab's docker-ce-like repository, whose stand-in package
    installs Debian's docker.io."""
    url = host["apt_repo_url"]
    data = {
        "containers_toolkit_repo_url": url + "/nvidia/libnvidia-container/stable/deb/{arch}",
        "containers_toolkit_key_url": url + "/nvidia/libnvidia-container/gpgkey",
        "containers_toolkit_key_fingerprint": _repo["nvidia_key_fingerprint"],
        "containers_toolkit_packages": [_repo["toolkit_package"]],
        "containers_docker_repo_url": url + "/docker/linux/{os}",
        "containers_docker_key_url": url + "/docker/linux/{os}/gpg",
        "containers_docker_key_fingerprint": _repo["docker_key_fingerprint"],
        "containers_docker_ce_packages": [_repo["docker_package"]],
        # No Docker Hub from the lab: the compliance suite imports this image from busybox.
        "containers_check_image": "sparkrig-lab/busybox:stand-in",
    }
    if _FLAVOURS[host["flavour"]].dgx_os:
        return data
    if host["flavour"] == "debian12":
        return {**data, "containers_docker_source": "distro"}
    return {
        **data,
        "containers_docker_source": "docker-ce",
        "containers_toolkit_source": "nvidia",
        "containers_nvidia_default_runtime": True,
        "containers_docker_users": ["spark"],
    }


def _ngc(host: dict) -> dict:
    """The NGC container workflow in the lab, on lab-deb13 (docker-ce stand-in, user spark
    in the docker group; other hosts and fleets, such as the benchmarks', leave it off).
    nvcr.io is out of reach, so the base image is the lab registry's STAND-IN (a busybox
    image, lab/registry.py), pulled by digest from the repository server (that
    address is an insecure registry in the host's own daemon.json, see tests/conftest.py),
    and Jupyter is the STAND-IN busybox HTTP server in the same unit."""
    registry = _inventory.get("registry") or {}
    if host["name"] != "lab-deb13" or not registry:
        return {}
    server = host["apt_repo_url"].split("://", 1)[1]
    return {
        "ngc_enabled": True,
        "ngc_base_image": f"{server}/{registry['name']}:{registry['tag']}@{registry['digest']}",
        # Built on the host (FROM the stand-in, labelled): the stand-in has no pip, so no packages.
        "ngc_build": "packages",
        "ngc_users": ["spark"],
        # An nspawn container cannot grant unlimited locked memory to its containers.
        "ngc_memlock_unlimited": False,
        "ngc_jupyter": True,
        "ngc_jupyter_user": "spark",
        "ngc_jupyter_port": 8888,
        # STAND-IN for JupyterLab: the lab's image has none; busybox's httpd in the same unit.
        "ngc_jupyter_command": "busybox httpd -f -p 127.0.0.1:{port} -h {project}",
        # spark-container mounts it read-only at the container's HOME (the controls make it).
        "ngc_home_mounts": ["~/.aws"],
    }


def _updates(host: dict) -> dict:
    """The versions the lab's report shows: its hosts share the controller's kernel and have
    no NVIDIA driver, so the kernel-like and driver-like STAND-INs (sparkrig-lab-standin-kernel,
    sparkrig-lab-standin-nvidia-driver, in two versions in the lab's DGX OS stand-in
    repository, lab/repo.py) count as kernel and driver packages beside the real names, and
    the toolkit's stand-in as the toolkit. The updates tests install, hold and upgrade them."""
    return {
        "updates_packages": {
            "kernel": ["linux-image-*", "sparkrig-lab-standin-kernel"],
            "driver": ["nvidia-driver-*", "libnvidia-compute-*", "sparkrig-lab-standin-nvidia-driver"],
            "docker": ["docker-ce", "docker.io", "moby-engine"],
            "toolkit": ["nvidia-container-toolkit", _repo["toolkit_package"]],
        },
    }


def _jobs(host: dict) -> dict:
    """Job-only variables on every lab host (the controls read them back from a job), and the
    shared model cache on lab-deb13, where spark-container mounts it. The emulated Spark (flavour
    gb10) keeps sparkrig's defaults (tests/converge/test_dgx_os_lab.py holds it to that)."""
    if host["flavour"] == "gb10":
        return {}
    data = {"jobs_env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    if host["name"] == "lab-deb13":
        data.update(jobs_model_cache="/srv/models/huggingface", jobs_model_cache_users=["spark"])
    return data


# The controller reaches the registries through a TLS-intercepting proxy, and so do
# the lab hosts: they trust its CA through the deploy (the images hold none).
_CONTROLLER_CA_DIR = _Path("/usr/local/share/ca-certificates")
_ca_certificates = {_path.stem: _path.read_text() for _path in sorted(_CONTROLLER_CA_DIR.glob("*.crt"))}

# Python of each suite's system interpreter (the venv uses it: no downloads here).
_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}
# Machine names of the flavours' Debian architectures, as the manifest keys wheels.
_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}


# The lab's stand-in manifests and their locks live in the lab's state, not the
# repository: the lab index's address differs per lab (SPARKRIG_LAB_ID).
LAB_STACK = _inventory_path().parent / "python_stack"
LAB_LOCKS = LAB_STACK / "locks"


def _stack(flavour: str) -> str:
    """Which stand-in manifest a flavour takes: one per Debian suite and architecture."""
    return f"{_FLAVOURS[flavour].suite}-{_FLAVOURS[flavour].arch}"


def lab_manifest(flavour_name: str, url: str) -> dict:
    """The lab's STAND-IN manifest for a flavour: the real manifest with what the lab cannot
    have replaced. PyTorch is this machine's CPU wheel from the lab's wheelhouse (on the
    flavour whose Python matches it; none otherwise, and the torch controls skip), vLLM is
    the wheelhouse's STAND-IN (sparkrig-lab-standin-vllm), each from the lab index as an
    index named for it alone, as a Spark would name PyTorch's cu130 index; everything else
    comes from PyPI for real. ``url`` is the lab repository server as the host sees it."""
    house = _inventory.get("wheelhouse") or {}
    flavour = _FLAVOURS[flavour_name]
    python = _PYTHON[flavour.suite]
    manifest = _load_manifest()
    manifest["python"] = python
    tag = "cp" + python.replace(".", "")
    machine = _MACHINE[flavour.arch]
    torch = [w for w in house.get("torch", []) if w["python"] == tag and w["file"].endswith(f"_{machine}.whl")]
    manifest["torch"] = (
        {"index_url": url + house["simple"], "packages": {"torch": torch[-1]["version"]}} if torch else None
    )
    standin = house.get("vllm_standin")
    manifest["vllm"] = (
        {"name": standin["name"], "version": standin["version"], "index_url": url + house["simple"]}
        if standin
        else None
    )
    manifest["profiles"]["lab"] = {"six": "1.17.0"}
    manifest["locks"] = {"architectures": [machine], "profiles": [[], ["lab"]]}
    return manifest


def write_lab_manifests() -> list[_Path]:
    """The stand-in manifest of each suite and architecture, as files the lock command reads
    (addresses of the first host of each: the controller reaches every gateway)."""
    paths = []
    for stack in sorted({_stack(h["flavour"]) for h in _inventory["hosts"]}):
        first = next(h for h in _inventory["hosts"] if _stack(h["flavour"]) == stack)
        path = LAB_STACK / f"{stack}.yml"
        text = _yaml.safe_dump(lab_manifest(first["flavour"], first["apt_repo_url"]), sort_keys=True)
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        paths.append(path)
    return paths


write_lab_manifests()


def _python_stack(host: dict) -> dict:
    """The Python stack in the lab: the flavour's stand-in manifest (:func:`lab_manifest`) and
    its locks in the lab's state. Debian 13's venv is owned by the ordinary user and takes a
    profile."""
    data = {
        "python_stack": lab_manifest(host["flavour"], host["apt_repo_url"]),
        "python_stack_locks": str(LAB_LOCKS),
        "python_venv_python_preference": "only-system",
    }
    if _FLAVOURS[host["flavour"]].suite == "trixie":
        data.update(python_venv_owner="spark", python_stack_profiles=["lab"])
    return data


# The lab's own source build: a small real C extension (lab/sourcebuild.py) in a
# git repository the lab serves over HTTP, pinned by commit, built for the stable ABI
# (one wheel fits Python 3.11 and 3.13), so the whole fleet shares one build. The real
# builds (Triton, xformers, vLLM) stay in the catalogue, off: no GitHub, no GPU here.
_sources = _inventory.get("sources") or {}
LAB_BUILD = "lab-ext"


# STAND-INS for an owner's NCCL and nccl-tests prefix builds: the lab's C project
# built with make and gcc (lab/sourcebuild.py); off here, turned on by
# tests/converge/test_prefix_builds_lab.py. `bc` stands in for nccl-tests' openmpi-bin.
LAB_PREFIX, LAB_PREFIX_TESTS = "lab-prefix", "lab-prefix-tests"


def _prefix_standins(url: str, commit: str) -> dict:
    common = {
        "kind": "prefix",
        "url": url,
        "ref": commit,
        "env": {"MAX_JOBS": "2"},
        "build_packages": ["git", "gcc", "make", "libc6-dev"],
        "submodules": False,
        "subdirectory": ".",
        "memory_max": "1G",
    }
    return {
        LAB_PREFIX: {
            **common,
            "steps": ['make -j"$MAX_JOBS" -C lib', 'make -C lib install PREFIX="$SPARKRIG_PREFIX"'],
            "needs": [],
            "runtime_packages": [],
        },
        LAB_PREFIX_TESTS: {
            **common,
            "steps": [
                'make -C tests STANDIN_HOME="$SPARKRIG_NEED_LAB_PREFIX"',
                'mkdir -p "$SPARKRIG_PREFIX/bin" && cp tests/standin_perf "$SPARKRIG_PREFIX/bin/"',
            ],
            "needs": [LAB_PREFIX],
            "runtime_packages": ["bc"],
        },
    }


def _source_builds(host: dict) -> dict:
    if not _sources:
        return {}
    catalogue = _load_catalogue()
    catalogue[LAB_BUILD] = {
        "kind": "wheel",
        "url": host["apt_repo_url"] + _sources["path"],
        "ref": _sources["refs"]["v1.0"]["commit"],
        "package": _sources["name"],
        "env": {"MAX_JOBS": "2"},
        "steps": ["python -c 'import setuptools; print(\"setuptools\", setuptools.__version__)'"],
        "build_requirements": ["setuptools>=61"],
        "build_packages": ["git", "gcc", "libc6-dev", "python3-dev"],
        "submodules": False,
        "subdirectory": ".",
        "uses_torch": False,
        "abi3": True,
        "memory_max": "2G",
    }
    prefix = _sources.get("prefix")
    if prefix:
        catalogue.update(_prefix_standins(host["apt_repo_url"] + prefix["path"], prefix["refs"]["p1.0"]["commit"]))
    return {
        "source_builds": catalogue,
        "source_builds_enabled": [LAB_BUILD],
        # The controller keeps the fleet's wheels in the lab's state (emptied by up and down).
        "source_builds_controller_cache": str(_WHEEL_CACHE),
    }


def _cluster(host: dict) -> dict:
    """The lab's cluster: lab-deb12 and lab-deb13 linked by the ConnectX-7 STAND-IN (a veth
    pair straight between their namespaces, lab/model.py), each with its address on it;
    the user spark (the lab's SSH user) runs jobs across it."""
    for link in _inventory.get("clusters", []):
        if host["name"] in link["addresses"]:
            return {
                "cluster_name": link["name"],
                "cluster_interfaces": {link["interface"]: link["addresses"][host["name"]]},
                "cluster_user": "spark",
                # The controller keeps the key pair in the lab's state (removed by up and down).
                "cluster_key_dir": str(_CLUSTER_KEYS),
            }
    return {}


# The fleet's Prometheus runs on lab-deb12 (a host the fleet tests leave alone), scraping every
# lab host at its node exporter on its lab address (the lab's firewall lets the hosts reach each
# other on that port alone, lab/render.py); short intervals, so a test sees an alert in seconds.
_PROMETHEUS_HOST = "lab-deb12"


def _monitoring(host: dict) -> dict:
    server = next((h for h in _inventory["hosts"] if h["name"] == _PROMETHEUS_HOST), None)
    if server is None:
        return {}
    return {
        "prometheus_server": _PROMETHEUS_HOST,
        "prometheus_scrape_interval_s": 2,
        "prometheus_evaluation_interval_s": 1,
        "metrics_listen": f"{host['address']}:{_METRICS_PORT}",
        "metrics_allow": [server["address"]],
    }


_REAL_STACK = _realstack.choice()


def host_data(_host: dict) -> dict:
    """A lab host's pyinfra data (inventory/lab_hostile.py takes its host's from here too)."""
    return {
        "ssh_hostname": _host["address"],
        "ssh_user": _host["ssh_user"],
        "ssh_key": _host["ssh_key"],
        "ssh_known_hosts_file": _host["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "_sudo": True,
        # The x86_64 lab hosts have no GPU: they stand in for RTX 50xx boxes. The
        # gb10 flavour keeps the default profile (gb10): its STAND-IN nvidia-smi
        # reports a GB10.
        **({} if _FLAVOURS[_host["flavour"]].gpu_standin else {"hardware_profile": "rtx50"}),
        "lab_flavour": _host["flavour"],
        # Runs under qemu-user (lab/binfmt.py): the controls say what it cannot show.
        **({"lab_emulated": "qemu-user"} if _FLAVOURS[_host["flavour"]].emulated else {}),
        "ca_certificates_extra": _ca_certificates,
        **_containers(_host),
        **_jobs(_host),
        **_ngc(_host),
        # The real stack (lab/realstack.py), when a real_stack test asks for it; else the stand-ins.
        **(
            _realstack.host_data(_host, _REAL_STACK)
            if _REAL_STACK is not None
            else {**_python_stack(_host), **_source_builds(_host)}
        ),
        **_cluster(_host),
        **_updates(_host),
        **_monitoring(_host),
    }


# The fleet: every lab host but the hostile one (lab/hostile.py), which inventory/lab_hostile.py
# plays alone, so that its attacks leave the fleet's results untouched.
_FLEET = [_host for _host in _inventory["hosts"] if not _FLAVOURS[_host["flavour"]].hostile]

lab = [(_host["name"], host_data(_host)) for _host in _FLEET]


# Groups, for --limit (pyinfra's and the compliance suite's): e.g. `--limit debian13`
# targets the Debian 13 hosts; debian12 holds the x86_64 Debian 12 hosts (DGX OS-like
# lab-deb12-b too), gb10 the emulated aarch64 Spark.
def _group(suite: str, arch: str) -> list[str]:
    return [
        _host["name"]
        for _host in _FLEET
        if (_FLAVOURS[_host["flavour"]].suite, _FLAVOURS[_host["flavour"]].arch) == (suite, arch)
    ]


debian12 = _group("bookworm", "amd64")
debian13 = _group("trixie", "amd64")
gb10 = _group("bookworm", "arm64")
