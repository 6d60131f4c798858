"""The suite reads an inventory in its own process (sparkrig.tools.inventory.load_inventory): the
same hosts, groups and data as pyinfra's ``debug-inventory``, settings validated as a deploy
validates them, and the process left unpatched by gevent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sparkrig.tools.inventory import REPO, load_inventory, read_inventory


def _inventory(tmp_path, hosts: str, **group_data: str):
    (tmp_path / "group_data").mkdir()
    for group, text in group_data.items():
        (tmp_path / "group_data" / f"{group}.py").write_text(textwrap.dedent(text))
    path = tmp_path / "fleet.py"
    path.write_text(textwrap.dedent(hosts))
    return path


def test_the_same_hosts_groups_and_data_as_pyinfra_s_debug_inventory(tmp_path):
    inventory = _inventory(
        tmp_path,
        """
        _ssh = {"ssh_user": "spark", "_sudo": True}
        sparks = [("spark-01.lan", {**_ssh, "swap_disable": True}), ("spark-02.lan", _ssh)]
        duo = (["spark-02.lan", "ws.lan"], {"jobs_memory_max": "80%"})
        """,
        sparks="""
        from pathlib import Path as _Path
        import json
        watchdog_prefer = "^(python|torch)"
        jobs_model_cache_users = ("alice", "bob")
        """,
    )
    here = load_inventory(str(inventory))
    assert here == read_inventory(str(inventory))
    assert [host["name"] for host in here] == ["spark-01.lan", "spark-02.lan", "ws.lan"]
    assert here[1]["data"]["jobs_model_cache_users"] == ["alice", "bob"]  # as pyinfra's JSON has it
    assert here[1]["data"]["_chdir"] == "/"  # as config.py sets it


def test_a_bad_setting_stops_the_load_naming_the_host_and_key(tmp_path):
    inventory = _inventory(tmp_path, 'sparks = [("spark-01.lan", {"swap_disable": "yes"})]\n')
    said = r"(?s)could not load .*fleet.py.*host 'spark-01.lan': swap_disable = 'yes': allowed is True or False"
    with pytest.raises(RuntimeError, match=said):
        load_inventory(str(inventory))


def test_an_inventory_that_exits_is_an_error_not_the_end_of_the_caller(tmp_path):
    inventory = _inventory(tmp_path, 'raise SystemExit("sparkrig: the lab is not up")\n')
    with pytest.raises(RuntimeError, match="the lab is not up"):
        load_inventory(str(inventory))


def test_loading_does_not_patch_the_process_for_gevent(tmp_path):
    """pyinfra_cli's package patches the process when imported: the loader skips it, and a
    later import of the CLI still patches as pyinfra's command does."""
    inventory = _inventory(tmp_path, 'sparks = ["spark-01.lan"]\n')
    script = textwrap.dedent(
        f"""
        import sys, threading
        from sparkrig.tools.inventory import load_inventory
        assert [h["name"] for h in load_inventory({str(inventory)!r})] == ["spark-01.lan"]
        import gevent.monkey
        assert not gevent.monkey.is_anything_patched()
        assert "pyinfra_cli" not in sys.modules
        import pyinfra_cli
        assert gevent.monkey.is_module_patched("threading")
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=120)
