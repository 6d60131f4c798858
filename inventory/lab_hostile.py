"""
The lab's hostile host alone (lab/hostile.py): the lab's data for it (inventory/lab.py), with
a venv that belongs to a user without sudo, who attacks; no cluster, no Prometheus server
(the fleet's tests own those), no source build (its cost is the fleet's, not an attack).

    pyinfra inventory/lab_hostile.py deploy.py
"""

import runpy as _runpy
from pathlib import Path as _Path

from lab import FLAVOURS as _FLAVOURS
from lab.hostile import VENV_OWNER as _VENV_OWNER

_lab = _runpy.run_path(str(_Path(__file__).with_name("lab.py")))
# The fleet's monitoring names lab-deb12's Prometheus, which this inventory does not hold.
_FLEET_ONLY = ("prometheus_server", "prometheus_scrape_interval_s", "prometheus_evaluation_interval_s")


def _data(host: dict) -> dict:
    data = {key: value for key, value in _lab["host_data"](host).items() if key not in _FLEET_ONLY}
    data.update(
        containers_docker_source="distro",
        containers_toolkit_source="auto",
        containers_nvidia_default_runtime=False,
        containers_docker_users=[],
        python_venv_owner=_VENV_OWNER,
        source_builds_enabled=[],
        metrics_listen="127.0.0.1:9100",
        metrics_allow=[],
    )
    return data


hostile = [(h["name"], _data(h)) for h in _lab["_inventory"]["hosts"] if _FLAVOURS[h["flavour"]].hostile]
