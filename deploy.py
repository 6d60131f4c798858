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
from sparkrig.operations.hardware import hardware
from sparkrig.operations.jobs import jobs
from sparkrig.operations.ngc import ngc
from sparkrig.operations.python_stack import python_stack, synced
from sparkrig.operations.source_builds import host_requirement_lines, source_builds
from sparkrig.operations.sshd_guard import sshd_guard
from sparkrig.operations.swap import swap
from sparkrig.operations.updates import updates
from sparkrig.operations.watchdog import watchdog

hardware()  # the box is the kind its profile says (or "auto" detects it); else it stops here
updates()  # holds, unattended upgrades, systemd-oomd; the expected kernel and driver (may stop here)
ca_certificates()  # extra CA certificates (a TLS-intercepting proxy's) in the system store
cuda_env()  # CUDA_HOME, PATH, TORCH_CUDA_ARCH_LIST, ... for login shells and systemd units
swap()  # no swap now, nothing that turns it on at boot
sshd_guard()  # sshd keeps memory under pressure; SSH sessions stay killable
watchdog()  # earlyoom kills the job before the box freezes
jobs()  # spark-run, spark-preflight, spark-drop-caches and training.slice
containers()  # Docker, the NVIDIA container toolkit and the nvidia runtime in daemon.json
ngc()  # NGC training containers: pinned image, spark-container, Jupyter on 127.0.0.1 (off by default)
python_stack(built_wheels=host_requirement_lines)  # uv; a venv holding the controller's lock (PyPI's CUDA 13.0 torch, vLLM, extras) and the built wheels
source_builds(sync_venv=synced)  # optional Triton/xformers/vLLM from source: built once per fleet, detached; python_stack's synced installs them
cluster()  # off unless the host has cluster_name: its ConnectX-7 link, SSH trust between nodes, NCCL's environment
