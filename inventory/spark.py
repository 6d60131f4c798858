"""
Your Sparks. Edit this file, then run:  pyinfra inventory/spark.py deploy.py

Each host is a name (or address) with optional host data. sparkrig connects as
an ordinary user over SSH and uses sudo for changes: the user needs passwordless
sudo, or add --sudo-password / use_sudo_password (see pyinfra's docs).
Each top-level list is a group: `--limit GROUP` targets it, and
group_data/<group>.py holds its settings (over group_data/all.py, under host data).
"""

# The default user and sudo for every host in this file.
_ssh = {"ssh_user": "spark", "_sudo": True}

sparks = [
    # ("spark-01.lan", {**_ssh}),
    # ("10.0.0.12", {**_ssh, "ssh_port": 2222, "ssh_key": "~/.ssh/id_ed25519"}),
]

# RTX 50xx workstations beside the Sparks (group_data/workstations.py: the rtx50 profile).
workstations = [
    # ("ws-5070ti.lan", {**_ssh}),
]
