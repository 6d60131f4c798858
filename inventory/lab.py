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
        },
    )
    for _host in _json.loads(_inventory_path().read_text())["hosts"]
]
