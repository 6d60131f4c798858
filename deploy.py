"""
sparkrig: configure DGX Spark (and other Blackwell) boxes, one concern after another.

    pyinfra inventory/spark.py deploy.py

Each line below is one concern; its module under operations/ holds the facts and
operations, templates/<concern>/ its files, group_data/all.py its settings and
tests/compliance/test_<concern>.py the controls that prove it.
"""

from sparkrig.operations.ca_certificates import ca_certificates
from sparkrig.operations.cluster import cluster
from sparkrig.operations.containers import containers
from sparkrig.operations.cuda_env import cuda_env
from sparkrig.operations.gpu_policy import gpu_policy
from sparkrig.operations.hardware import hardware
from sparkrig.operations.jobs import jobs
from sparkrig.operations.metrics import metrics
from sparkrig.operations.ngc import ngc
from sparkrig.operations.prometheus import prometheus
from sparkrig.operations.python_stack import python_stack
from sparkrig.operations.serving import serving
from sparkrig.operations.source_builds import source_builds
from sparkrig.operations.sshd_guard import sshd_guard
from sparkrig.operations.swap import swap
from sparkrig.operations.updates import updates
from sparkrig.operations.watchdog import watchdog

hardware()  # the box is the kind its profile says (or `"auto"` detects it); otherwise that host stops before any change
updates()  # holds, unattended upgrades (off by default), the expected kernel and driver, systemd-oomd masked beside earlyoom, fwupd to read firmware, the journal kept across boots (how each boot ended)
ca_certificates()  # a proxy's CA in the system store, for apt, curl, Docker, pip and uv
cuda_env()  # one env file (CUDA_HOME, PATH, TORCH_CUDA_ARCH_LIST, ...) read by login shells and systemd units
swap()  # no swap now, nothing that turns it on at boot
sshd_guard()  # sshd keeps its memory under pressure; SSH sessions stay killable
watchdog()  # earlyoom kills the job before the box freezes
gpu_policy()  # off unless set: persistence mode, an SM clock cap and a power limit, applied at every boot by a oneshot unit
jobs()  # `spark-run` (also `--detach`), `spark-jobs`, `spark-preflight`, `spark-drop-caches`, `training.slice`, the shared model cache
metrics()  # node exporter (on the loopback unless `metrics_listen` says otherwise, answering `metrics_allow` alone) and sparkrig's textfile collector: memory, GPU, earlyoom kills, jobs, versions
containers()  # Docker and the NVIDIA container toolkit, the `nvidia` runtime merged into `daemon.json`
ngc()  # off by default: NVIDIA's PyTorch image pinned by digest (or built on it), `spark-container`, JupyterLab on 127.0.0.1
python_stack()  # uv, and a venv holding the controller's lock of `group_data/python_stack.yml` (PyPI's CUDA 13.0 PyTorch, a pinned vLLM, extras) and the built wheels
source_builds()  # optional Triton, xformers, vLLM (wheels into the venv) and your own C/CUDA projects such as NCCL (root-owned prefixes), built from source once per fleet, detached
serving()  # off unless `serving_models` lists models: one unit each running the venv's vLLM (or root's llama.cpp server with a GGUF file) as its owner, ready once a completion answers, a forward-progress probe that restarts a stalled engine, a memory guard, loopback or an allow-list and a key
cluster()  # off unless a host has `cluster_name`: the ConnectX-7 link, SSH trust between nodes, NCCL's environment, `spark-cluster-check`
prometheus()  # off unless `prometheus_server` names a host: Debian's Prometheus there scrapes every host, with alert rules (memory low, earlyoom kill, throttling, failed control, reboot pending, host down)
