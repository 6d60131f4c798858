"""Clusters: settings checked one host at a time and across the cluster, the files, the plan."""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.context import ctx_host, ctx_state

from sparkrig import atomic
from sparkrig.operations import cluster as cl
from sparkrig.operations.cluster import deploy as cl_deploy
from sparkrig.operations.cluster import environment as cl_env
from sparkrig.operations.cluster import facts as cl_facts
from sparkrig.operations.cluster import fleet as cl_fleet
from sparkrig.operations.cluster import link as cl_link
from sparkrig.operations.cluster import trust as cl_trust
from sparkrig.prefix import current
from sparkrig.settings import SettingsError, all_settings, problems, resolve, validate_hosts
from tests.unit.pyinfra_fake import HOST_STATE, PlannedOp, _record, host_state, plan

LINK = {"cluster_name": "lab", "cluster_user": "spark"}
A = {**LINK, "ssh_hostname": "10.0.0.1", "cluster_interfaces": {"cx7": "192.168.100.11/24"}}
B = {**LINK, "ssh_hostname": "10.0.0.2", "cluster_interfaces": {"cx7": "192.168.100.12/24"}}


# Settings, one host at a time ---------------------------------------------------------


def test_off_by_default_and_the_defaults_are_valid():
    assert problems(cl.SETTINGS, {}) == []
    # Off a cluster a host reads only what a node would have left (in its one reading).
    assert [part.fact for part in cl_deploy.parts(resolve(all_settings(), {}))] == [cl_facts.ClusterLeftovers]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {**A, "cluster_name": "Lab A"},
            "cluster_name = 'Lab A': allowed is None (not in a cluster) or a cluster name",
        ),
        ({**LINK, "cluster_interfaces": {}}, "cluster_interfaces = {}: allowed is a mapping of interface names"),
        ({**LINK, "cluster_interfaces": {"cx7": "192.168.100.11"}}, "not an IPv4 address with its prefix"),
        ({**LINK, "cluster_interfaces": {"cx7": "192.168.100.011/24"}}, "'192.168.100.011/24'"),
        ({**LINK, "cluster_interfaces": {"cx7": "192.168.100.0/24"}}, "network or broadcast address"),
        ({**LINK, "cluster_interfaces": {"cx7": "169.254.3.4/16"}}, "link-local addresses are not"),
        ({**LINK, "cluster_interfaces": {"lo": "192.168.100.11/24"}}, "'lo' is no interface name"),
        ({**LINK, "cluster_interfaces": {"a-very-long-name-0": "192.168.100.11/24"}}, "is no interface name"),
        (
            {**LINK, "cluster_interfaces": {"a": "192.168.100.11/24", "b": "192.168.100.12/25"}},
            "two interfaces of one host in 192.168.100.0/24",
        ),
        (
            {"cluster_name": "lab", "cluster_interfaces": {"cx7": "192.168.100.11/24"}},
            "cluster_user = None: allowed is the user (not root)",
        ),
        ({**A, "cluster_user": "root"}, "cluster_user = 'root'"),
        ({**A, "cluster_mtu": 65000}, "cluster_mtu = 65000: allowed is an integer from 1280 to 9216"),
        ({**A, "cluster_env_extra": {"MASTER_ADDR": "x"}}, "MASTER_ADDR is managed"),
        ({**A, "cluster_mut": 9000}, "not a sparkrig setting (did you mean cluster_mtu?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(cl.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


# Across the cluster ----------------------------------------------------------------------


def _fleet(*hosts, targeted=None):
    everyone = [(name, {**data, **resolve(cl.SETTINGS, data)}) for name, data in hosts]
    run = everyone if targeted is None else [h for h in everyone if h[0] in targeted]
    return cl_fleet.fleet_problems(run, everyone)


def test_a_valid_cluster_of_two_has_no_problem():
    assert _fleet(("a", A), ("b", B), ("c", {})) == []


def test_a_run_that_leaves_out_a_node_is_no_settings_problem():
    # The deploy then leaves the cluster as it is (--limit and the rollout's batches work).
    assert _fleet(("a", A), ("b", B), targeted={"a"}) == []
    assert _fleet(("a", A), ("b", {**B, "cluster_mtu": 1500}), targeted={"a"}) != []  # seen across the inventory


def test_a_cluster_of_one_is_refused():
    assert "a cluster of two hosts or more" in _fleet(("a", A), ("b", {}))[0][1]


@pytest.mark.parametrize(
    ("b", "expected"),
    [
        ({**B, "cluster_interfaces": {"cx7": "192.168.100.11/24"}}, "192.168.100.11 is also a's"),
        ({**B, "cluster_interfaces": {"cx7": "192.168.100.12/25"}}, "overlaps 192.168.100.0/24, which a uses"),
        ({**B, "cluster_interfaces": {"cx7": "192.168.101.12/24"}}, "no other node of cluster 'lab' has an address in"),
        ({**B, "cluster_mtu": 1500}, "cluster_mtu = 1500: allowed is the same value on every node"),
        ({**B, "cluster_user": "other"}, "cluster_user = 'other': allowed is the same value"),
        ({**B, "ssh_hostname": "192.168.100.50"}, "192.168.100.50 is in 192.168.100.0/24): sparkrig never"),
    ],
)
def test_cluster_wide_rules(b, expected):
    found = _fleet(("a", A), ("b", b))
    assert any(host in ("a", "b") and expected in problem for host, problem in found), found


def test_the_head_must_be_a_node():
    found = _fleet(("a", {**A, "cluster_head": "c"}), ("b", {**B, "cluster_head": "c"}), ("c", {}))
    assert {host for host, _ in found} == {"a", "b"} and "a host of cluster 'lab': a, b" in found[0][1]
    assert cl_fleet.head_of([("a", resolve(cl.SETTINGS, A)), ("b", resolve(cl.SETTINGS, {**B}))], "lab") == "a"


def test_validation_reports_cluster_problems_before_any_host_is_contacted():
    with pytest.raises(SettingsError) as error:
        validate_hosts([("a", A)], [("a", A), ("b", {**B, "cluster_interfaces": {"cx7": "192.168.100.11/24"}})])
    assert (
        "  host 'b': cluster_interfaces = {'cx7': '192.168.100.11/24'}: allowed is addresses unique in "
        "cluster 'lab' (192.168.100.11 is also a's)"
    ) in str(error.value)
    validate_hosts([("a", A), ("b", B)])  # the whole cluster: fine


# The files ------------------------------------------------------------------------------


def test_the_networkd_file_passes_its_own_validation(tmp_path):
    text = cl_link.render_networkd("cx7", "192.168.100.11/24", 9000)
    path = tmp_path / "link.network"
    path.write_text(text)
    assert subprocess.run([*cl_link.NETWORKD_VALIDATOR, str(path)]).returncode == 0
    assert "MTUBytes=9000\n" in text and "Address=192.168.100.11/24\n" in text
    path.write_text(text + "Gateway=192.168.100.1\n")  # a route out through the link: refused
    assert subprocess.run([*cl_link.NETWORKD_VALIDATOR, str(path)]).returncode != 0


def test_the_env_file_names_the_link_for_every_library(tmp_path):
    variables = cl_env.env_variables(
        ["cx7a", "cx7b"], "192.168.100.12", "192.168.100.11", "lab", {"NCCL_DEBUG": "INFO"}
    )
    path = tmp_path / "cluster.env"
    path.write_text(cl_env.render_env_file(variables))
    shown = subprocess.run(["sh", "-c", f"set -a; . {path}; env"], capture_output=True, text=True, check=True).stdout
    for line in (
        "NCCL_SOCKET_IFNAME=cx7a,cx7b",
        "GLOO_SOCKET_IFNAME=cx7a",
        "UCX_NET_DEVICES=cx7a,cx7b",
        "OMPI_MCA_btl_tcp_if_include=cx7a,cx7b",
        "MASTER_ADDR=192.168.100.11",
        "VLLM_HOST_IP=192.168.100.12",
        "NCCL_DEBUG=INFO",
    ):
        assert line in shown.splitlines()


NODES = [
    {
        "name": "a",
        "addresses": ["192.168.100.11"],
        "first": "192.168.100.11",
        "host_keys": ["ssh-ed25519 AAAAa"],
        "public": "ssh-ed25519 AAAAkeya sparkrig-cluster:lab:a",
    },
    {
        "name": "b",
        "addresses": ["192.168.100.12"],
        "first": "192.168.100.12",
        "host_keys": ["ssh-ed25519 AAAAb", "ssh-rsa AAAAB"],
        "public": "ssh-ed25519 AAAAkeyb sparkrig-cluster:lab:b",
    },
]


def test_trust_is_pinned_and_restricted_to_the_cluster_addresses(tmp_path):
    known = cl_trust.render_known_hosts(NODES)
    assert [line for line in known.splitlines() if not line.startswith("#")] == [
        "192.168.100.11 ssh-ed25519 AAAAa",
        "192.168.100.12 ssh-ed25519 AAAAb",
        "192.168.100.12 ssh-rsa AAAAB",
    ]
    # Each node's own key, from that node's addresses only.
    assert cl_trust.authorized_lines(NODES, "lab") == [
        'from="192.168.100.11",restrict,pty ssh-ed25519 AAAAkeya sparkrig-cluster:lab:a',
        'from="192.168.100.12",restrict,pty ssh-ed25519 AAAAkeyb sparkrig-cluster:lab:b',
    ]
    config = tmp_path / "c.conf"
    config.write_text(cl_trust.render_ssh_config(NODES, getpass.getuser()))  # Match localuser: the one running ssh
    if shutil.which("ssh"):
        shown = subprocess.run(["ssh", "-G", "-F", str(config), "192.168.100.12"], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        assert "stricthostkeychecking true" in shown.stdout and "identitiesonly yes" in shown.stdout
    assert "StrictHostKeyChecking yes" in config.read_text() and "StrictHostKeyChecking no" not in config.read_text()


def test_the_check_script_is_valid_sh_and_names_each_peer_link():
    script = cl_env.render_check(
        "lab", "spark", 9000, {"cx7": "192.168.100.11/24"}, NODES[1:], "/etc/sparkrig/cluster.env"
    )
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    assert "check_ping b 192.168.100.12 cx7\n" in script and "check_link cx7" in script


def test_each_node_key_is_made_once_kept_private_and_its_own(tmp_path):
    key, public = cl_trust.controller_key(str(tmp_path / "keys"), "lab", "a", ["ssh-ed25519 AAAAa"])
    again, public_again = cl_trust.controller_key(str(tmp_path / "keys"), "lab", "a", ["ssh-ed25519 AAAAa"])
    assert (key, public) == (again, public_again) and public.startswith("ssh-ed25519 ")
    assert (
        cl_trust.controller_key(str(tmp_path / "keys"), "lab", "b", ["ssh-ed25519 AAAAb"])[1] != public
    )  # one pair per node
    assert (tmp_path / "keys" / "lab" / "a" / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "keys" / "lab" / "a").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "keys" / "lab").stat().st_mode & 0o777 == 0o700
    assert (
        cl_trust.node_label("@fake/a").startswith("_fake_a-") and cl_trust.node_label("spark-01.lan") == "spark-01.lan"
    )
    assert repr(cl_trust.Secret(key)) == "<secret>"


def test_a_node_whose_host_keys_changed_gets_a_new_pair_which_replaces_the_old(tmp_path):
    keys = str(tmp_path / "keys")
    record = tmp_path / "keys" / "lab" / "b" / "host_keys"
    old = cl_trust.controller_key(keys, "lab", "b", ["ssh-rsa AAAAB", "ssh-ed25519 AAAAb"])
    assert record.read_text() == "ssh-ed25519 AAAAb\nssh-rsa AAAAB\n"  # the keys it was made for, in order
    assert cl_trust.controller_key(keys, "lab", "b", ["ssh-ed25519 AAAAb", "ssh-rsa AAAAB"]) == old
    # Reinstalled: new host keys, so a new pair; the old private half is gone from the controller.
    new = cl_trust.controller_key(keys, "lab", "b", ["ssh-ed25519 AAAAnew"])
    assert new[1] != old[1] and (tmp_path / "keys" / "lab" / "b" / "id_ed25519").read_bytes() == new[0]
    assert [p.name for p in record.parent.iterdir() if p.name not in ("id_ed25519", "host_keys", "lock")] == []
    assert record.read_text() == "ssh-ed25519 AAAAnew\n"
    assert cl_trust.controller_key(keys, "lab", "b", ["ssh-ed25519 AAAAnew"]) == new  # once, not every run
    assert cl_trust.controller_key(keys, "lab", "b", []) == new  # nothing read: nothing decided
    # A pair made before host keys were recorded is kept, and its host keys recorded.
    record.unlink()
    assert cl_trust.controller_key(keys, "lab", "b", ["ssh-ed25519 AAAAlater"]) == new
    assert record.read_text() == "ssh-ed25519 AAAAlater\n"


def test_two_runs_deciding_a_nodes_pair_take_turns(tmp_path):
    keys = str(tmp_path / "keys")
    first = cl_trust.controller_key(keys, "lab", "b", ["ssh-ed25519 AAAAb"])
    got = []
    with open(tmp_path / "keys" / "lab" / "b" / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run, deciding
        waiting = threading.Thread(
            target=lambda: got.append(cl_trust.controller_key(keys, "lab", "b", ["ssh-ed25519 AAAAnew"]))
        )
        waiting.start()
        waiting.join(0.5)
        assert got == [] and waiting.is_alive()
    waiting.join(10)
    assert got and got[0] != first


def test_a_runs_hosts_deciding_pairs_at_once_do_not_wait_on_each_other_forever(tmp_path):
    """pyinfra's CLI patches threading for gevent and plans each host in a greenlet: two
    greenlets deciding pairs at once finish (a flock alone blocked the process: a deadlock)."""
    script = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import sys, gevent\n"
        "from sparkrig.operations.cluster import trust\n"
        "jobs = [gevent.spawn(trust.controller_key, sys.argv[1], 'lab', n, ['ssh-ed25519 AAAA' + n]) for n in 'abab']\n"
        "gevent.joinall(jobs, timeout=30)\n"
        "sys.exit(0 if all(j.successful() for j in jobs) and jobs[0].value == jobs[2].value else 1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "keys")],
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert done.returncode == 0, done.stderr


# The plan, on two fake hosts --------------------------------------------------------------


def _node_fact(links: dict, user=True, authorized=(), host_key="ssh-ed25519 AAAAhost", files=()) -> list[str]:
    lines = [
        "links "
        + json.dumps(
            [
                {
                    "ifname": name,
                    "flags": ["BROADCAST", "UP"] if up else ["BROADCAST"],
                    "mtu": mtu,
                    "addr_info": [
                        {"family": "inet", "local": a.split("/")[0], "prefixlen": int(a.split("/")[1])} for a in addrs
                    ],
                }
                for name, (up, mtu, addrs) in links.items()
            ]
        ),
        "netplan no",
        "networkmanager no",
        "ssh_config_d yes",
        f"hostkey {host_key}",
        *[f"linkfile {f}" for f in files],
    ]
    if user:
        lines += ["user 1000 spark /home/spark", *[f"authorized {a}" for a in authorized]]
    else:
        lines.append("nouser")
    return lines


class _Client:
    """What the SSH connector's paramiko client says about the deploy's connection."""

    def __init__(self, address: str):
        self.address = address

    def get_transport(self):
        return self

    def getpeername(self):
        return (self.address, 22)


def _plan(tmp_path, responses_a: dict, responses_b: dict, connected_to: str | None = None) -> list[PlannedOp]:
    keys = {"cluster_key_dir": str(tmp_path / "keys")}
    hosts = [
        ("@fake/a", {**A, **keys, "fake_responses": responses_a}),
        ("@fake/b", {**B, **keys, "fake_responses": responses_b}),
    ]
    inventory = Inventory(([(name, {"fake_delay": 0, "fake_delay_jitter": 0, **data}) for name, data in hosts], {}))
    state = State(inventory, Config())
    connect_all(state)
    # The cross-host check keys on inventory names: the fake hosts connect to no address.
    if connected_to:
        inventory.get_host("@fake/a").connector.client = _Client(connected_to)
    add_deploy(state, cl.cluster)
    host = inventory.get_host("@fake/a")
    ops = []
    for op_hash in state.get_op_order():
        planned = PlannedOp(name=" ".join(sorted(state.op_meta[op_hash].names)))
        with ctx_state.use(state), ctx_host.use(host):
            if op_hash not in state.ops[host]:
                continue
            op = state.get_op_data_for_host(host, op_hash)
            for command in op.command_generator():
                _record(planned, command)
        if planned.commands or planned.uploads:
            ops.append(planned)
    return ops


FRESH = {"cx7": (False, 1500, [])}
LINK_OP = "| Cluster link: written, applied to its interfaces alone, kept once a new SSH connection confirms it"
CONVERGED = {"cx7": (True, 9000, ["192.168.100.11/24"]), "eth0": (True, 1500, ["10.0.0.1/24"])}


def test_a_fresh_node_gets_link_trust_and_environment(tmp_path):
    ops = _plan(
        tmp_path,
        {
            HOST_STATE: host_state(packages={"iputils-ping": None}),
            "ip -j addr": _node_fact({**FRESH, "eth0": (True, 1500, ["10.0.0.1/24"])}),
        },
        {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAApeer")},
    )
    names = [op.name for op in ops]
    apply = next(op for op in ops if LINK_OP in op.name)
    # Armed before anything is written; applied detached; confirmed through a new connection.
    assert apply.commands[0] == "python: _not_after_a_failure"
    assert "systemd-run --quiet --unit=sparkrig-cluster-rollback --on-active=60s" in apply.commands[1]
    assert list(apply.uploads) == [atomic.temp_path("/etc/systemd/network/40-sparkrig-cluster-cx7.network")]
    assert apply.commands[-4:] == [
        "systemctl enable --now systemd-networkd.service",
        "systemctl disable systemd-networkd-wait-online.service",
        "systemd-run --quiet --collect --unit=sparkrig-cluster-apply /bin/sh /var/lib/sparkrig/cluster-link/apply.sh",
        "python: _confirm_link",
    ]
    key = next(op for op in ops if "| Cluster key of spark" in op.name)
    assert key.commands[0] == "python: _stage_secret" and "install -m 600 -o spark -g spark" in key.commands[1]
    assert not key.uploads  # the private key never goes through pyinfra's world-readable temp file
    known = next(op for op in ops if "| Every node's pinned host keys" in op.name)
    assert b"192.168.100.12 ssh-ed25519 AAAApeer\n" in next(iter(known.uploads.values()))
    auth = next(op for op in ops if "| Each node's own cluster key in spark's authorized_keys" in op.name)
    assert any("runuser -u spark -- sh -c" in c for c in auth.commands)
    assert any("Install ping" in n for n in names)


def test_a_converged_node_plans_nothing(tmp_path):
    keys = {"cluster_key_dir": str(tmp_path / "keys")}
    key, _public = cl_trust.controller_key(str(tmp_path / "keys"), "lab", "@fake/a", ["ssh-ed25519 AAAAhost"])
    settings_a = resolve(cl.SETTINGS, {**A, **keys})
    nodes = [
        cl_deploy._node("@fake/a", settings_a, ["ssh-ed25519 AAAAhost"]),
        cl_deploy._node("@fake/b", resolve(cl.SETTINGS, {**B, **keys}), ["ssh-ed25519 AAAApeer"]),
    ]
    files = {
        cl_facts.link_files(["cx7"], False)[0]: cl_link.render_networkd("cx7", "192.168.100.11/24", 9000),
        cl_facts.KNOWN_HOSTS: cl_trust.render_known_hosts(nodes),
        cl_facts.SSH_CONFIG: cl_trust.render_ssh_config(nodes, "spark"),
        cl_facts.HOSTFILE: cl_env.render_hostfile(nodes, 1),
        "/etc/sparkrig/cluster.env": cl_env.render_env_file(
            cl_env.env_variables(["cx7"], "192.168.100.11", "192.168.100.11", "lab", {}), cl_env.no_rdma_note(["cx7"])
        ),
        cl_facts.PROFILE_SCRIPT: cl_env.render_profile_script("/etc/sparkrig/cluster.env"),
        cl_facts.CHECK: (
            cl_env.render_check(
                "lab", "spark", 9000, {"cx7": "192.168.100.11/24"}, nodes[1:], "/etc/sparkrig/cluster.env"
            ),
            0o755,
        ),
    }
    state = host_state(files=files, units={cl_facts.NETWORKD: (True, True)}, packages={"iputils-ping": "1"})
    # The key is the cluster user's: HostState reports its owner.
    state.append(f"file 600 spark spark {hashlib.sha256(key).hexdigest()} {cl_facts.KEY_FILE}")
    lines = cl_trust.authorized_lines(nodes, "lab")
    ops = _plan(
        tmp_path,
        {HOST_STATE: state, "ip -j addr": _node_fact(CONVERGED, authorized=lines, files=list(files)[:1])},
        {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAApeer")},
    )
    assert ops == []


def test_a_link_that_is_down_is_brought_up_again(tmp_path):
    down = {**CONVERGED, "cx7": (False, 9000, ["192.168.100.11/24"])}
    ops = _plan(
        tmp_path,
        {HOST_STATE: host_state(), "ip -j addr": _node_fact(down)},
        {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAApeer")},
    )
    assert any(LINK_OP in op.name for op in ops)


@pytest.mark.parametrize(
    ("fact", "expected"),
    [
        (_node_fact({"eth0": (True, 1500, ["10.0.0.1/24"])}), "names cx7, which this host has no interface of"),
        (_node_fact(CONVERGED, user=False), "cluster_user spark is no user on this host"),
    ],
)
def test_what_cannot_be_done_fails_the_host_saying_why(tmp_path, fact, expected):
    ops = _plan(
        tmp_path,
        {HOST_STATE: host_state(), "ip -j addr": fact},
        {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAApeer")},
    )
    assert len(ops) == 1 and expected in ops[0].commands[0], ops


def test_a_peer_without_a_host_key_is_not_trusted_blindly(tmp_path):
    fact = _node_fact({})
    fact = [line for line in fact if not line.startswith("hostkey")]
    ops = _plan(
        tmp_path,
        {HOST_STATE: host_state(), "ip -j addr": _node_fact(CONVERGED)},
        {HOST_STATE: host_state(), "ip -j addr": fact},
    )
    assert len(ops) == 1 and "cluster node @fake/b could not be read" in ops[0].commands[0]


def test_a_reinstalled_peer_is_pinned_anew_and_its_new_key_replaces_the_old_one_everywhere(tmp_path):
    """Node b reinstalled: new host key, no cluster files. a's own plan already pins b's new host
    key alone and admits b's new key alone: one run, whichever node plans first."""
    keys = str(tmp_path / "keys")
    cl_trust.controller_key(keys, "lab", "@fake/a", ["ssh-ed25519 AAAAhost"])
    old_b = cl_trust.controller_key(keys, "lab", "@fake/b", ["ssh-ed25519 AAAAold"])[1]  # the run before
    nodes = [
        cl_deploy._node("@fake/a", resolve(cl.SETTINGS, {**A, "cluster_key_dir": keys}), ["ssh-ed25519 AAAAhost"]),
        cl_deploy._node("@fake/b", resolve(cl.SETTINGS, {**B, "cluster_key_dir": keys}), ["ssh-ed25519 AAAAold"]),
    ]
    assert nodes[1]["public"] == old_b
    ops = _plan(
        tmp_path,
        {
            HOST_STATE: host_state(),
            "ip -j addr": _node_fact(CONVERGED, authorized=cl_trust.authorized_lines(nodes, "lab")),
        },
        {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAAnew")},
    )
    new_b = cl_trust.controller_key(keys, "lab", "@fake/b", ["ssh-ed25519 AAAAnew"])[1]
    assert new_b != old_b
    known = next(op for op in ops if "| Every node's pinned host keys" in op.name)
    pinned = next(iter(known.uploads.values())).decode()
    assert "192.168.100.12 ssh-ed25519 AAAAnew\n" in pinned and "AAAAold" not in pinned
    auth = next(op for op in ops if "| Each node's own cluster key in spark's authorized_keys" in op.name)
    lines = next(iter(auth.uploads.values())).decode().splitlines()
    b_key, b_label = " ".join(new_b.split()[:2]), cl_trust.node_label("@fake/b")
    assert [line for line in lines if line.endswith(f"sparkrig-cluster:lab:{b_label}")] == [
        f'from="192.168.100.12",restrict,pty {b_key} sparkrig-cluster:lab:{b_label}'
    ]
    assert " ".join(old_b.split()[:2]) not in "\n".join(lines)  # never both
    assert len(lines) == 2


def test_a_host_key_line_that_is_no_key_fails_the_host():
    with pytest.raises(Exception, match="not an SSH host key"):
        cl_facts.ClusterHost().process(["hostkey ssh-ed25519 AAAA; rm -rf /"])


def _fake_tools(bin_dir: Path, link: str, route: str, ping_rc: int, ssh_rc: int) -> None:
    """STAND-INS for ip, ping and ssh as a node would answer: the check's own logic runs for real."""
    bin_dir.mkdir()
    tools = {
        "ip": f'case "$*" in *"route get"*) echo {shlex.quote(route)} ;; *) echo {shlex.quote(link)} ;; esac',
        # Like iputils' ping, it answers only when asked what the check means to ask: one
        # unfragmented (-M do) packet of MTU - 28 bytes; a ping that may fragment proves nothing.
        "ping": (
            'case " $* " in *" -M do "*) ;; *) echo "ping STAND-IN: fragmentation allowed: $*"; exit 3 ;; esac; '
            'case " $* " in *" -s 8972 "*) ;; *) echo "ping STAND-IN: not 8972 bytes: $*"; exit 3 ;; esac; '
            f"echo 'ping: local error: message too long, mtu=1500'; exit {ping_rc}"
        ),
        "ssh": f"echo 'Permission denied (publickey).' >&2; exit {ssh_rc}",
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)


@pytest.mark.parametrize(
    ("link", "ping_rc", "ssh_rc", "status", "wanted"),
    [
        (
            "2: cx7: <BROADCAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT",
            0,
            0,
            0,
            [
                "OK link cx7: up",
                "OK mtu cx7: 9000",
                "OK ping b: 8972 bytes to 192.168.100.12 through cx7, not fragmented",
                "OK ssh b: ",
            ],
        ),
        (
            "2: cx7: <NO-CARRIER,BROADCAST,UP> mtu 9000 qdisc mq state DOWN mode DEFAULT",
            1,
            255,
            4 | 16 | 32,
            ["FAIL link cx7: cx7 is DOWN, not up", "FAIL ping b: no answer", "FAIL ssh b: "],
        ),
        (
            "2: cx7: <BROADCAST,UP,LOWER_UP> mtu 1500 qdisc mq state UP mode DEFAULT",
            1,
            0,
            8 | 16,
            [
                "FAIL mtu cx7: 1500, not 9000",
                "FAIL ping b: no answer to 8972 unfragmented bytes from 192.168.100.12 "
                "through cx7: ping: local error: message too long, mtu=1500",
            ],
        ),
    ],
)
def test_spark_cluster_check_says_which_check_failed_and_sums_the_codes(
    tmp_path, link, ping_rc, ssh_rc, status, wanted
):
    script = tmp_path / "spark-cluster-check"
    script.write_text(
        cl_env.render_check(
            "lab", getpass.getuser(), 9000, {"cx7": "192.168.100.11/24"}, NODES[1:], "/etc/sparkrig/cluster.env"
        )
    )
    _fake_tools(tmp_path / "bin", link, "192.168.100.12 dev cx7 src 192.168.100.11 uid 0", ping_rc, ssh_rc)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    result = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env)
    assert result.returncode == status, result.stdout
    for line in wanted:
        assert any(shown.startswith(line) for shown in result.stdout.splitlines()), (line, result.stdout)
    assert result.stdout.splitlines()[-1].startswith("SKIP nccl: not asked for")


def test_spark_cluster_check_fails_a_peer_reached_through_another_interface(tmp_path):
    script = tmp_path / "spark-cluster-check"
    script.write_text(
        cl_env.render_check(
            "lab", getpass.getuser(), 9000, {"cx7": "192.168.100.11/24"}, NODES[1:], "/etc/sparkrig/cluster.env"
        )
    )
    _fake_tools(tmp_path / "bin", "2: cx7: <UP> mtu 9000 state UP mode", "192.168.100.12 via 10.0.0.1 dev eth0", 0, 0)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    result = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env)
    assert result.returncode == 16 and "FAIL ping b: 192.168.100.12 is not reached through cx7" in result.stdout


def _plan_one(data: dict, responses: dict) -> list[PlannedOp]:
    return [op for op in plan(cl.cluster, data, responses) if op.commands]


def test_a_host_in_no_cluster_with_nothing_left_plans_nothing():
    assert _plan_one({}, {"keyowner": []}) == []


def test_a_node_taken_out_of_its_cluster_loses_the_clusters_files_and_key_line():
    ops = _plan_one(
        {},
        {
            "keyowner": [
                f"file {cl_facts.KEY_FILE}",
                "file /etc/systemd/network/40-sparkrig-cluster-cx7.network",
                "keyowner spark",
            ]
        },
    )
    (op,) = ops
    assert "runuser -u spark -- sh -c" in op.commands[0] and "sparkrig-cluster:" in op.commands[0]
    assert f"rm -f {cl_facts.KEY_FILE} /etc/systemd/network/40-sparkrig-cluster-cx7.network;" in op.commands[1]
    assert "changed since systemd-networkd loaded its files" in op.commands[1]  # no other link's change applied
    assert "networkctl reconfigure cx7" in op.commands[1]


def test_the_deploys_own_connection_is_never_reconfigured(tmp_path):
    peer = {HOST_STATE: host_state(), "ip -j addr": _node_fact({**CONVERGED}, host_key="ssh-ed25519 AAAApeer")}
    # Connected through eth0: the cluster goes ahead.
    ops = _plan(
        tmp_path,
        {HOST_STATE: host_state(), "ip -j addr": _node_fact(FRESH | {"eth0": CONVERGED["eth0"]})},
        peer,
        connected_to="10.0.0.1",
    )
    assert any(LINK_OP in op.name for op in ops)
    # Connected to an address the cluster interface holds: refused before any change.
    ops = _plan(
        tmp_path, {HOST_STATE: host_state(), "ip -j addr": _node_fact(CONVERGED)}, peer, connected_to="192.168.100.11"
    )
    assert len(ops) == 1 and "cx7 carries this deploy's SSH connection (192.168.100.11): sparkrig never" in ops[
        0
    ].commands[0].replace("'\"'\"'", "'")


def test_networkmanager_lets_go_of_the_cluster_ports(tmp_path):
    text = cl_link.render_networkmanager(["cx7a", "cx7b"])
    path = tmp_path / "nm.conf"
    path.write_text(text)
    assert subprocess.run([*cl_link.NM_VALIDATOR, str(path)]).returncode == 0
    assert "match-device=interface-name:cx7a,interface-name:cx7b\nmanaged=0\n" in text
    fact = [
        line.replace("networkmanager no", "networkmanager yes")
        for line in _node_fact({**FRESH, "eth0": (True, 1500, ["10.0.0.1/24"])})
    ]
    ops = _plan(
        tmp_path,
        {HOST_STATE: host_state(), "ip -j addr": fact},
        {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAApeer")},
    )
    apply = next(op for op in ops if LINK_OP in op.name)
    assert atomic.temp_path(cl_facts.NM_FILE) in apply.uploads
    script = cl_link.render_link_apply(["cx7"], False, True)
    assert 0 < script.index("systemctl reload NetworkManager\n") < script.index("networkctl reload\n")


def test_on_dgx_os_netplan_renders_the_ports_with_networkd_and_networkmanager_lets_go_of_them(tmp_path):
    """DGX OS: netplan and NetworkManager both. The netplan file and NetworkManager's setting
    are written, and the apply hands the ports over (the lab runs it: test_cluster_lab.py)."""
    fact = [
        line.replace("networkmanager no", "networkmanager yes").replace("netplan no", "netplan yes")
        for line in _node_fact({**FRESH, "eth0": (True, 1500, ["10.0.0.1/24"])})
    ]
    ops = _plan(
        tmp_path,
        {HOST_STATE: host_state(), "ip -j addr": fact},
        {HOST_STATE: host_state(), "ip -j addr": _node_fact({}, host_key="ssh-ed25519 AAAApeer")},
    )
    apply = next(op for op in ops if LINK_OP in op.name)
    assert set(apply.uploads) == {atomic.temp_path(cl_facts.NETPLAN_FILE), atomic.temp_path(cl_facts.NM_FILE)}
    found = cl_facts.ClusterHost().process(
        [*fact, "nmdevice cx7:connected (externally)", "nmdevice eth0:connected", "nmdevice eth1:unmanaged"]
    )
    assert found["nm_managed"] == ["cx7", "eth0"]
    armed = apply.commands[1]
    assert "nmcli device set" in armed and "g=/usr/libexec/netplan/generate" in armed


RECORDED = Path(__file__).parent / "data" / "cluster"


def recorded(name: str) -> str:
    """A recorded real output (tests/unit/operations/data/cluster), without its '## ' header."""
    return "".join(
        line for line in (RECORDED / name).read_text().splitlines(keepends=True) if not line.startswith("## ")
    )


def _nccl_tools(
    tmp_path, gpu: bool, build: bool, mpirun: str | None, output: str = "all_gather_perf-dgx-spark-issue25.txt"
) -> tuple[str, str]:
    """STAND-INS for nvidia-smi, the nccl-tests build and mpirun (no GPU, no MPI here); the
    check's own sh decides from what they answer. The build's all_reduce_perf prints a
    RECORDED REAL output of nccl-tests (``output``). Returns the check's PATH and the build's bin."""
    tools, built = tmp_path / "tools", tmp_path / "nccl-tests" / "bin"
    tools.mkdir()
    built.mkdir(parents=True)
    scripts = {tools / "nvidia-smi": "echo 'GPU 0: NVIDIA GB10 (UUID: GPU-0)'" if gpu else "exit 9"}
    if build:
        (tmp_path / "recorded.txt").write_text(recorded(output))
        scripts[built / "all_reduce_perf"] = f'echo "ran $0 $*"; cat {tmp_path / "recorded.txt"}'
    if mpirun is not None:
        # Drops mpirun's options, then runs the program it was given, as mpirun would on each node.
        scripts[tools / "mpirun"] = (
            'echo "mpirun $*" >&2; '
            "while [ $# -gt 0 ]; do case $1 in --hostfile|-np|-x) shift 2;; *) break;; esac; done; " + mpirun
        )
    for path, body in scripts.items():
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return f"{tools}:/usr/bin:/bin", str(built)


@pytest.mark.parametrize(
    ("gpu", "build", "mpirun", "status", "line"),
    [
        (False, True, '"$@"', 0, "SKIP nccl: no GPU on this node (nvidia-smi lists none)"),
        (
            True,
            False,
            '"$@"',
            0,
            "SKIP nccl: nccl-tests are not built here (no all_reduce_perf in {bin} nor on PATH:"
            " a prefix source build named nccl-tests puts it there)",
        ),
        (
            True,
            True,
            None,
            0,
            "SKIP nccl: no mpirun on PATH (openmpi-bin; a prefix build installs it with runtime_packages)",
        ),
        (
            True,
            True,
            '"$@"',
            0,
            "OK nccl: all_reduce_perf on 2 nodes: bus bandwidth 18.94 GB/s at 17179869184 bytes (floor 12)",
        ),
        (
            True,
            True,
            "echo 'ORTE was unable to reliably start one or more daemons.'; exit 1",
            64,
            "FAIL nccl: all_reduce_perf on 2 nodes failed: ORTE was unable to reliably start one or more daemons.",
        ),
    ],
)
def test_spark_cluster_check_nccl_runs_the_built_all_reduce_perf_or_says_why_not(
    tmp_path, gpu, build, mpirun, status, line
):
    hostfile, env_file = tmp_path / "hostfile", tmp_path / "cluster.env"
    hostfile.write_text("192.168.100.11 slots=1\n192.168.100.12 slots=1\n")
    env_file.write_text("NCCL_SOCKET_IFNAME='cx7'\n")
    path, built = _nccl_tools(tmp_path, gpu, build, mpirun)
    script = tmp_path / "spark-cluster-check"
    # No interface and no peer: only the nccl check runs.
    script.write_text(
        cl_env.render_check(
            "lab", getpass.getuser(), 9000, {}, [], str(env_file), hostfile=str(hostfile), nccl_tests_bin=built
        )
    )
    result = subprocess.run(["sh", str(script), "--nccl"], capture_output=True, text=True, env={"PATH": path})
    assert result.returncode == status, result.stdout
    assert result.stdout.splitlines() == [
        "SKIP bandwidth: not asked for (--bandwidth runs ib_write_bw on each rail to each peer)",
        line.format(bin=built),
    ], result.stdout


def test_spark_cluster_check_nccl_fails_under_its_floor_on_a_recorded_real_run(tmp_path):
    """PR 103's recorded all_reduce_perf (two Sparks) as quoted ends at 64 KiB: 0.96 GB/s there."""
    hostfile, env_file = tmp_path / "hostfile", tmp_path / "cluster.env"
    hostfile.write_text("192.168.100.11 slots=1\n192.168.100.12 slots=1\n")
    env_file.write_text("NCCL_SOCKET_IFNAME='cx7'\n")
    path, built = _nccl_tools(tmp_path, True, True, '"$@"', output="all_reduce_perf-dgx-spark-pr103.txt")
    script = tmp_path / "spark-cluster-check"
    script.write_text(
        cl_env.render_check(
            "lab",
            getpass.getuser(),
            9000,
            {},
            [],
            str(env_file),
            hostfile=str(hostfile),
            nccl_tests_bin=built,
            nccl_floor=12,
        )
    )
    result = subprocess.run(["sh", str(script), "--nccl"], capture_output=True, text=True, env={"PATH": path})
    assert result.returncode == 64, result.stdout
    assert result.stdout.splitlines()[-1] == (
        "FAIL nccl: all_reduce_perf on 2 nodes: bus bandwidth 0.96 GB/s at 65536 bytes, under the floor of 12 GB/s "
        "(NCCL fallen back to TCP gives ~3: is NCCL_IB_HCA set?)"
    )


def test_spark_cluster_check_looks_for_the_source_build_where_source_builds_installs_it():
    assert cl_env.NCCL_TESTS_BIN == current("nccl-tests") + "/bin" == "/opt/sparkrig/builds/nccl-tests/current/bin"
    text = cl_env.render_check("lab", "spark", 9000, {}, [], "/etc/sparkrig/cluster.env")
    assert "NCCL_TESTS_BIN=/opt/sparkrig/builds/nccl-tests/current/bin" in text and '"$perf" -b 8' in text


# The deploy's own path: a cluster subnet keeps clear of it (checked before any host is contacted)

UNREACHABLE = ("203.0.113.10", "203.0.113.11")  # TEST-NET-3: routed like any remote node, never answers


def _source_towards(address: str) -> ipaddress.IPv4Address:
    """The controller's source address towards ``address`` (a UDP socket's: nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 22))
        except OSError as error:
            pytest.skip(f"this machine has no route to {address} ({error}): no source address to take")
        return ipaddress.IPv4Address(probe.getsockname()[0])


def _two_beside(subnet: ipaddress.IPv4Network, *avoid: ipaddress.IPv4Address) -> list[str]:
    hosts = [h for h in subnet.hosts() if h not in avoid]
    return [f"{hosts[0]}/{subnet.prefixlen}", f"{hosts[1]}/{subnet.prefixlen}"]


def _pair(first: str, second: str, addresses: list[str]) -> tuple[tuple, tuple]:
    return (
        ("a", {**A, "ssh_hostname": first, "cluster_interfaces": {"cx7": addresses[0]}}),
        ("b", {**B, "ssh_hostname": second, "cluster_interfaces": {"cx7": addresses[1]}}),
    )


def test_a_subnet_holding_the_controllers_source_address_is_refused():
    source = _source_towards(UNREACHABLE[0])
    subnet = ipaddress.IPv4Interface(f"{source}/24").network
    found = _fleet(*_pair(*UNREACHABLE, _two_beside(subnet, source)))
    assert {host for host, _ in found} == {"a", "b"}, found
    assert (
        f"the controller's own address towards this host ({source}, the source of its route to 203.0.113.10, "
        f"is in {subnet}: the node would answer the controller through the link)" in found[0][1]
    ), found


def test_a_subnet_overlapping_the_controllers_route_to_a_node_is_refused():
    routes = (
        json.loads(subprocess.run(["ip", "-j", "route"], capture_output=True, text=True).stdout or "[]")
        if shutil.which("ip")
        else []
    )
    connected = [
        ipaddress.IPv4Network(r["dst"])
        for r in routes
        if "/" in r.get("dst", "default") and int(r["dst"].split("/")[1]) <= 28
    ]
    if not connected:
        pytest.skip("this machine has no directly connected IPv4 route of /28 or wider to put a node in")
    route = connected[0]
    node = list(route.hosts())[-2]
    source = _source_towards(str(node))
    # A /30 of that route holding neither the node nor the controller's address.
    piece = next(s for s in route.subnets(new_prefix=30) if node not in s and source not in s)
    found = _fleet(*_pair(str(node), UNREACHABLE[1], _two_beside(piece)))
    assert any(
        host == "a"
        and f"the controller's route to this host ({node} is reached through {route}, which {piece} overlaps)"
        in problem
        for host, problem in found
    ), found


def test_a_host_name_is_resolved_before_its_path_is_compared(monkeypatch):
    real = socket.getaddrinfo

    def dns_standin(host, *args, **kwargs):  # STAND-IN for the site's DNS: one name, one address
        if host == "spark-01.lan":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.168.100.50", 22))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns_standin)
    found = _fleet(*_pair("spark-01.lan", UNREACHABLE[1], ["192.168.100.11/24", "192.168.100.12/24"]))
    assert [
        (h, "the address the deploy connects to (192.168.100.50 is in 192.168.100.0/24)" in p) for h, p in found
    ] == [("a", True)], found
    found = _fleet(*_pair("nowhere.invalid", UNREACHABLE[1], ["192.168.100.11/24", "192.168.100.12/24"]))
    assert (
        found
        and found[0][0] == "a"
        and "ssh_hostname = 'nowhere.invalid': allowed is a host name the controller resolves, or an IPv4 address"
        in found[0][1]
    ), found


def test_pyinfra_refuses_a_cluster_holding_the_controllers_address_before_contacting_any_host(tmp_path):
    """The real CLI: two nodes whose cluster subnet holds the controller's own address towards them."""
    source = _source_towards(UNREACHABLE[0])
    subnet = ipaddress.IPv4Interface(f"{source}/24").network
    first, second = _two_beside(subnet, source)
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        f"duo = [\n"
        f"    ('spark-01', {{'ssh_hostname': '{UNREACHABLE[0]}', 'cluster_interfaces': {{'cx7': '{first}'}}}}),\n"
        f"    ('spark-02', {{'ssh_hostname': '{UNREACHABLE[1]}', 'cluster_interfaces': {{'cx7': '{second}'}}}}),\n"
        f"], {{'cluster_name': 'duo', 'cluster_user': 'spark', 'cluster_key_dir': '{tmp_path / 'keys'}'}}\n"
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "pyinfra"), "-y", str(inventory), "deploy.py"],
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "invalid sparkrig settings, nothing was changed on any host" in output, output
    assert (
        f"host 'spark-01': cluster_interfaces = {{'cx7': '{first}'}}: allowed is subnets apart from the "
        f"controller's own address towards this host ({source}" in output
    ), output
    assert "Connecting" not in output and "Connected" not in output, output
    assert not (tmp_path / "keys").exists()  # nothing made, not even the cluster's key pair


def test_a_pending_change_of_another_interface_stops_the_link_change_run_here(tmp_path, monkeypatch):
    """`networkctl reload` would apply an administrator's unapplied edit of eth0's file: the
    check (real sh and find against a real tree; systemctl a STAND-IN, no systemd here) refuses
    while a file other than sparkrig's is newer than networkd's start and sparkrig's last reload."""
    network = tmp_path / "etc" / "systemd" / "network"
    network.mkdir(parents=True)
    mine, theirs = network / "40-sparkrig-cluster-cx7.network", network / "10-eth0.network"
    for path in (mine, theirs):
        path.write_text("[Match]\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        '#!/bin/sh\ncase "$*" in "is-active -q"*) exit 0 ;; '
        '*ActiveEnterTimestamp*) echo "Mon 2026-11-23 10:00:00 UTC" ;; esac\n'
    )
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setattr(cl_link, "NETWORKD_DIRS", (str(network), str(tmp_path / "run" / "systemd" / "network")))
    monkeypatch.setattr(cl_link, "LINK_LOADED", str(tmp_path / "loaded"))
    (tmp_path / "state").mkdir()
    script = f"d={tmp_path / 'state'}; " + cl_link.pending_check([f"{cl_facts.NETWORKD_PREFIX}*.network"])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(theirs_mtime: str, loaded: str | None = None):
        subprocess.run(["touch", "-d", theirs_mtime, str(theirs)], check=True)
        subprocess.run(["touch", "-d", "2026-11-25 12:00", str(mine)], check=True)  # sparkrig's own: never counted
        if loaded:
            subprocess.run(["touch", "-d", loaded, str(tmp_path / "loaded")], check=True)
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)

    assert run("2026-11-22 09:00").returncode == 0  # loaded at networkd's start
    refused = run("2026-11-24 09:00")  # edited since, not loaded
    assert (
        refused.returncode == 1
        and f"changed since systemd-networkd loaded its files: {theirs}; networkctl "
        "reload would apply them to their interfaces too"
        in refused.stderr
    ), refused.stderr
    assert run("2026-11-24 09:00", loaded="2026-11-24 10:00").returncode == 0  # sparkrig's reload loaded it later
