"""
Every sparkrig setting, with its default. Applies to all hosts.

Override a setting for some hosts in group_data/<group>.py or in the inventory's
host data. Settings are validated before any host is contacted: a bad value stops
the run with a message that names the host, the key and what is allowed.
Each concern's module under operations/ declares the same keys and defaults in
its SETTINGS (tests/unit/test_settings.py keeps the two in step).
"""

from pathlib import Path as _Path

from operations.python_stack import load_manifest as _load_manifest
from operations.source_builds import load_catalogue as _load_catalogue

# --- Hardware profile (operations/hardware.py) -------------------------------

# Which entry of hardware_profiles describes the hosts, or "auto": the one profile
# whose architecture and compute capability match what the box reports (uname -m,
# nvidia-smi). Set it per group (group_data/<group>.py) on a mixed fleet. Either way
# the box is checked first: a host that contradicts its profile fails before anything
# changes on it. The lab inventory sets "rtx50" (x86_64 hosts); a Hopper box "hopper".
hardware_profile = "gb10"

# The kinds of box sparkrig knows: CPU architecture, the GPU's compute capability,
# and the TORCH_CUDA_ARCH_LIST that source builds target. Add your own kind here.
hardware_profiles = {
    "gb10": {"arch": "aarch64", "compute_capability": "12.1", "torch_cuda_arch_list": "12.1a"},
    "rtx50": {"arch": "x86_64", "compute_capability": "12.0", "torch_cuda_arch_list": "12.0"},
    "hopper": {"arch": "x86_64", "compute_capability": "9.0", "torch_cuda_arch_list": "9.0"},
}

# --- CUDA environment (operations/cuda_env.py) -------------------------------

# The single KEY=VALUE file holding CUDA_HOME, PATH, LD_LIBRARY_PATH,
# TORCH_CUDA_ARCH_LIST, TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH and
# UV_NO_SYNC=1 and UV_PROJECT_ENVIRONMENT (python_venv_path: `uv run` in a
# project uses the managed venv as it is). Login shells read it through /etc/profile.d/sparkrig-cuda.sh;
# systemd units read it with EnvironmentFile=.
cuda_env_file = "/etc/sparkrig/cuda.env"

# CUDA_HOME when the host has no /usr/local/cuda link and no /usr/local/cuda-X.Y
# directory (the link's target, else the newest X.Y, wins when present).
cuda_env_default_home = "/usr/local/cuda"

# Extra variables for the same file, e.g. {"HF_HOME": "/data/hf"}. Names must be
# valid variable names other than the managed ones above; values are literal
# strings without single quotes or newlines.
cuda_env_extra = {}

# --- Swap (operations/swap.py) -----------------------------------------------

# Turn swap off now and keep it off: every swap entry of /etc/fstab commented out
# (the old file kept as /etc/fstab.sparkrig.bak), swap and zram units masked and
# stopped, swapoff -a while swap is active. On GB10 swap turns memory pressure into
# a freeze of the whole box instead of an OOM kill. False leaves swap as it is.
swap_disable = True

# Also delete, once swap is off, the swap files (regular files with a swap signature,
# e.g. /swap.img) of the fstab entries sparkrig disabled. Off by default: deleting is
# the one step that uncommenting a line cannot undo.
swap_remove_files = False

# --- SSH guard (operations/sshd_guard.py) ------------------------------------

# Memory reserved for the unit that runs sshd (MemoryMin=, base-1024 K/M/G/T).
# It covers the listener and pre-auth processes; sessions live in user slices.
# The unit's OOMScoreAdjust is always set to 0: sshd protects its own listener,
# and -1000 on the unit would make every SSH session unkillable.
sshd_guard_memory_min = "128M"

# Memory reserved for system.slice (MemoryMin=): a unit's reservation is capped
# by its parent slice's, so this must be at least sshd_guard_memory_min.
sshd_guard_system_slice_memory_min = "512M"

# --- Memory watchdog (operations/watchdog.py) --------------------------------

# Run earlyoom, from the distribution's package, as configured below. False stops
# and disables it (e.g. where another OOM daemon is used); its package and files stay.
watchdog_enabled = True

# earlyoom's -M, in KiB: SIGTERM to the worst process once MemAvailable falls to
# this, SIGKILL at half of it. 4 GiB (about 3 % of a 128 GB Spark) is several of
# earlyoom's polls of headroom at the fastest fill rates its author measured, plus
# time for a dying job to let go of its memory, and leaves the jobs the rest.
# Raise it if a job allocates more than this in one step: an allocation bigger
# than what is left fails before earlyoom can act. From earlyoom 1.8 (Debian 13)
# the floor shrinks in proportion as non-process memory (GPU allocations on GB10,
# tmpfs) grows: see README.
watchdog_min_available_kib = 4194304

# earlyoom's --prefer: a POSIX extended regex on the process name
# (/proc/PID/comm, at most 15 characters) of the processes killed first:
# python, python3, python3.12, PyTorch's renamed main thread (pt_main_thread,
# which is also how `vllm serve` shows up), vLLM and its workers (VLLM::...),
# Ray workers (ray::...). One word: no spaces or quotes; '$' only at the end of
# an alternative.
watchdog_prefer = r"^(python[0-9.]*|pt_main_thread|vllm|VLLM::.*|ray::.*)$"

# earlyoom's --avoid: the process names killed only as a last resort: init and
# systemd's daemons, sshd (and OpenSSH 9.8+'s sshd-session/sshd-auth), Docker,
# containerd and its shims, D-Bus. Same form as watchdog_prefer.
watchdog_avoid = r"^(init|systemd|systemd-.*|sshd|sshd-.*|dockerd|containerd.*|dbus-daemon)$"

# earlyoom's -r: seconds between the memory reports it writes to its journal
# (0: none). Kills are logged whatever this is.
watchdog_report_interval_s = 3600

# --- Job wrappers (operations/jobs.py) ---------------------------------------

# MemoryMax of /etc/systemd/system/training.slice (all spark-run jobs together)
# and of each spark-run job (spark-run --memory-max overrides it per job): bytes
# with an optional K, M, G or T suffix (base 1024) such as "100G", a whole
# percentage of physical memory such as "85%", or "infinity". 85% is about
# 101 GiB on a 128 GB Spark, close to the usual 100G, and adapts to other boxes.
# On GB10 it caps CPU-side memory and page cache only, not CUDA allocations.
jobs_memory_max = "85%"

# oom_score_adj of every spark-run job (choom -n, 1 to 1000): the kernel's OOM
# killer and earlyoom pick the job before anything else.
jobs_oom_score_adj = 500

# spark-preflight fails its memory check below this much MemAvailable, in KiB
# (64 GiB: half of a Spark; an idle one has about 115 GiB). spark-preflight
# --min-available-kib overrides it for one run.
jobs_preflight_min_available_kib = 67108864

# --- Containers: Docker and the NVIDIA container toolkit (operations/containers.py)

# Where Docker comes from: "docker-ce" (Docker's apt repository, below),
# "distro" (the distribution's docker.io, and docker-cli where the client is packaged
# apart, as on Debian 13) or "preinstalled" (DGX OS ships Docker:
# sparkrig only checks that dockerd is there and wires it up).
containers_docker_source = "docker-ce"

# Docker's apt repository, or your mirror of it, with its layout (dists/CODENAME/
# stable). {os} is the host's /etc/os-release ID (ubuntu, debian), {codename} its
# VERSION_CODENAME and {arch} its dpkg architecture (arm64 on a Spark, amd64).
containers_docker_repo_url = "https://download.docker.com/linux/{os}"

# Where the host downloads the key that signs that repository (same placeholders).
containers_docker_key_url = "https://download.docker.com/linux/{os}/gpg"

# The primary fingerprint that key must have (Docker's release key). A key with
# another fingerprint is refused; only this key goes into the repository's keyring.
containers_docker_key_fingerprint = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"

# The packages installed from Docker's repository (source "docker-ce").
containers_docker_ce_packages = [
    "docker-ce",
    "docker-ce-cli",
    "containerd.io",
    "docker-buildx-plugin",
    "docker-compose-plugin",
]

# Where the NVIDIA container toolkit comes from: "nvidia" (NVIDIA's apt
# repository, below) or "preinstalled" (checked: nvidia-container-runtime exists).
containers_toolkit_source = "nvidia"

# NVIDIA's flat apt repository of the toolkit (suite "/"), or your mirror of it.
containers_toolkit_repo_url = "https://nvidia.github.io/libnvidia-container/stable/deb/{arch}"

# Where the host downloads the key that signs it.
containers_toolkit_key_url = "https://nvidia.github.io/libnvidia-container/gpgkey"

# The primary fingerprint that key must have (NVIDIA's libnvidia-container key).
containers_toolkit_key_fingerprint = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"

# The packages installed from NVIDIA's repository (toolkit source "nvidia").
containers_toolkit_packages = ["nvidia-container-toolkit"]

# True: "nvidia" becomes Docker's default runtime (every container gets the
# NVIDIA hook without --gpus or --runtime). False: it is not the default (a
# default-runtime of your own is kept). The runtime is registered either way.
containers_nvidia_default_runtime = False

# Users added to the docker group, e.g. ["spark"]. Opt-in: membership is
# root-equivalent (a member can start a privileged container that mounts /).
# The users must exist; nobody is ever removed from the group.
containers_docker_users = []

# The image the compliance suite runs: `docker run --rm IMAGE true`, and on a host
# with a GPU `docker run --rm --gpus all IMAGE nvidia-smi -L` (the toolkit mounts
# nvidia-smi into any image). It must be present or pullable on the host.
containers_check_image = "ubuntu:24.04"

# --- Debian packages (operations/packages.py) --------------------------------

# How long a package install waits for the dpkg and apt locks, in seconds, before
# it fails that host (other hosts go on) with the lock and the process holding it.
# A freshly booted box is busy with unattended-upgrades for minutes. 0: fail at once.
packages_dpkg_lock_timeout_s = 300

# --- Extra CA certificates (operations/ca_certificates.py) ------------------

# CA certificates the hosts trust besides the system's, by name: the PEM text of
# one certificate each, e.g. {"corp-proxy": open("files/corp-proxy.crt").read()}.
# Needed behind a TLS-intercepting proxy: apt, curl, Docker and pip read the
# system store, and uv does because sparkrig runs it with UV_SYSTEM_CERTS=1.
# Written to /usr/local/share/ca-certificates/sparkrig-<name>.crt; a name
# removed here is removed from the hosts.
ca_certificates_extra = {}

# --- Python stack (operations/python_stack.py) --------------------------------

# The versions manifest: Python, torch's versions (from PyPI unless an index is
# named for it alone), vLLM's wheel per architecture with its sha256, extra
# packages, profiles, and which locks exist. It lives in
# group_data/python_stack.yml (documented there); bump the stack by editing it,
# then run `uv run python -m operations.python_lock`.
python_stack = _load_manifest(_Path(__file__).with_name("python_stack.yml"))

# Profiles of the manifest a host installs too, e.g. ["unsloth"]. The manifest's
# locks must list this set for the host's architecture.
python_stack_profiles = []

# Where the controller keeps the manifest's locks (relative: to the repository),
# one per architecture and set of profiles, made by
# `uv run python -m operations.python_lock`. A host whose lock is missing or
# stale for the manifest stops the deploy before any host is contacted.
python_stack_locks = "group_data/python_stack.locks"

# The virtualenv's directory. It is made anew (uv venv --clear) when its Python
# is not the manifest's; an existing non-venv directory is refused, never wiped.
python_venv_path = "/opt/sparkrig/venv"

# The user who owns the venv (and uv's cache); uv runs as this user. A Spark's
# owner usually sets their own login, e.g. "spark". The user must exist.
python_venv_owner = "root"

# How uv finds the venv's Python: "system" (a system interpreter of the
# manifest's version first, a uv-managed download only if none), "only-system"
# (never download), "managed" or "only-managed".
python_venv_python_preference = "system"

# The package index for uv itself and every package the manifest does not pin
# to another index: PyPI, or your mirror of it.
python_index_url = "https://pypi.org/simple"

# Hosts that cannot reach python_index_url: the controller downloads every wheel
# of their lock once (sha256 checked against the lock) into python_offline_cache
# and uploads the ones a host lacks to /var/lib/sparkrig/python-wheels; the host
# installs with `uv pip sync --offline --no-index`. uv itself must already be on
# the host (it is installed from the index).
python_offline = False

# Where the controller keeps those wheels, shared by every host and run (~ is
# the controller user's home).
python_offline_cache = "~/.cache/sparkrig/python-wheels"

# The uv release installed into /opt/sparkrig/uv (linked from /usr/local/bin/uv
# when that name is free).
python_uv_version = "0.13.9"

# sha256 of the uv wheels pip may install for that release (manylinux aarch64
# and x86_64, as PyPI lists them); change them with python_uv_version.
python_uv_sha256 = [
    "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
    "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",
    "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
]

# --- NGC training containers (operations/ngc.py) -----------------------------

# Set up the container workflow of seeds 000 and 004 at all: the pinned image,
# spark-container, and (with ngc_jupyter) JupyterLab. Off by default; it needs
# Docker from the containers concern.
ngc_enabled = False

# The base image, pinned by digest, never by a moving tag alone, e.g.
# "nvcr.io/nvidia/pytorch:25.09-py3@sha256:<64 hex digits>" (read the digest with
# `docker buildx imagetools inspect nvcr.io/nvidia/pytorch:25.09-py3`). Pulled when
# Docker does not have it at that digest, never otherwise. Required when ngc_enabled.
ngc_base_image = ""

# What runs: "none" (the base image as it is), "packages" (the base plus
# ngc_pip_packages) or "unsloth" (seed 000's Unsloth-on-Spark recipe: Triton at a
# fixed commit, xformers v0.0.33 for the profile's compute capability, unsloth,
# bitsandbytes 0.48.0, transformers 4.56.2, trl 0.22.2; plus ngc_pip_packages).
# Built on the host from /etc/sparkrig/ngc/Dockerfile, again only when it changes.
ngc_build = "none"

# Pinned pip requirements ("name==version") installed into the image's own Python
# (never a venv: it would hide the image's CUDA builds). No flash-attn.
ngc_pip_packages = []

# The name the built image gets (ngc_build other than "none").
ngc_image = "sparkrig/ngc:local"

# Run containers with --ulimit memlock=-1, as NVIDIA's PyTorch containers want
# (pinned memory for CUDA). False only where the host cannot grant it: the lab's
# hosts are nspawn containers without CAP_SYS_RESOURCE ("error setting rlimit type 8").
ngc_memlock_unlimited = True

# Users who may run spark-container, e.g. ["spark"]. Launching needs Docker, so
# each must also be in containers_docker_users (root-equivalent). Root always may.
ngc_users = []

# Where the project (spark-container's current directory, or --project) is mounted
# in the container; it is also the working directory.
ngc_project_mount = "/workspace/project"

# The Hugging Face cache on the host, "~/" being the caller's home, mounted at
# /cache/huggingface with HF_HOME pointing there: models are downloaded once.
ngc_hf_cache = "~/.cache/huggingface"

# A host directory mounted over the project's outputs/ (checkpoints on a bigger
# disk, e.g. "/data/outputs" or "~/outputs"). "": outputs stay in the project.
ngc_outputs = ""

# Secrets spark-container passes in, by variable name: from the caller's
# environment, else from ~/.config/sparkrig/secrets/NAME (the caller's, mode 0600).
# Each is mounted read-only as a 0600 file and exported inside the container only,
# never given as --env (docker inspect would show it).
ngc_secrets = ["HF_TOKEN", "WANDB_API_KEY"]

# Run JupyterLab as sparkrig-jupyter.service: the image's Jupyter and Python, on the
# host network bound to 127.0.0.1 only (reach it with `ssh -L 8888:127.0.0.1:8888`),
# its token in /var/lib/sparkrig/jupyter/token (mode 0600), Restart=always.
ngc_jupyter = False

# The user Jupyter runs as: one of ngc_users; owns the token file. Required when
# ngc_jupyter.
ngc_jupyter_user = ""

# The directory Jupyter serves (mounted as the project). "": the user's home.
ngc_jupyter_dir = ""

# Jupyter's port on 127.0.0.1.
ngc_jupyter_port = 8888

# "jupyterlab" (the image's JupyterLab). "stand-in-httpd" is for the lab only: a
# busybox HTTP server in the same unit, because the lab's stand-in image has no Jupyter.
ngc_jupyter_server = "jupyterlab"

# --- Source builds (operations/source_builds.py) -------------------------------

# The catalogue of builds a host may turn on: Triton, xformers and vLLM, each
# with its repository URL, pinned ref (commit or tag), build environment, steps
# and the apt packages it needs. It lives in group_data/source_builds.yml
# (documented there); point `url` at a mirror or a local clone if you have one.
source_builds = _load_catalogue(_Path(__file__).with_name("source_builds.yml"))

# Which builds of the catalogue a host builds and installs into its venv, e.g.
# ["triton", "xformers"]. Off by default. Each build takes 20 to 60 minutes and
# many GB of memory on a Spark (README, "Source builds"); one host of each
# architecture and profile builds it, the others receive its wheel.
source_builds_enabled = []

# True: a deploy that starts a build (or finds one running) waits for it, printing
# a progress line every minute (pyinfra -v shows them). False: it returns at
# once; a later deploy reports the build's result and installs its wheel.
source_builds_wait = True

# Where the controller keeps built wheels (by build and stamp) to upload them to
# the other hosts of the fleet instead of building there too. `~` is the home
# of the user running pyinfra.
source_builds_controller_cache = "~/.cache/sparkrig/wheels"
