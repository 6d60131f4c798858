"""
Your Sparks. Edit this file, then run:  pyinfra inventory/spark.py deploy.py

Each host is a name (or address) with optional host data. sparkrig connects as
an ordinary user over SSH and uses sudo for changes: the user needs passwordless
sudo, or add --sudo-password / use_sudo_password (see pyinfra's docs).
Settings for all hosts live in group_data/all.py; per-host settings go here.
"""

# The default user and sudo for every host in this file.
_ssh = {"ssh_user": "spark", "_sudo": True}

sparks = [
    # ("spark-01.lan", {**_ssh}),
    # ("10.0.0.12", {**_ssh, "ssh_port": 2222, "ssh_key": "~/.ssh/id_ed25519"}),
    # An RTX 50xx workstation beside the Sparks:
    # ("workstation.lan", {**_ssh, "hardware_profile": "rtx50"}),
]
