"""
The machine you are logged in to, as one host: check it with the compliance suite.

    pytest tests/compliance --inventory inventory/local.py

pyinfra's ``@local`` is testinfra's local backend: no SSH. Two settings come from the
environment, so a box that is not a default Spark needs no edit here:
SPARKRIG_PROFILE (hardware_profile, default gb10) and SPARKRIG_VENV
(python_venv_path, default /opt/sparkrig/venv). Everything else is group_data's.
Deploying to it (``pyinfra inventory/local.py deploy.py``) configures this machine:
do that only on a box that is yours to configure.
"""

import os as _os

_data = {}
if _os.environ.get("SPARKRIG_PROFILE"):
    _data["hardware_profile"] = _os.environ["SPARKRIG_PROFILE"]
if _os.environ.get("SPARKRIG_VENV"):
    _data["python_venv_path"] = _os.environ["SPARKRIG_VENV"]

local = [("@local", _data)]
