"""
Cluster controls: the link carries its address and jumbo MTU to every peer, the cluster user
logs in to every peer without a prompt and only to pinned host keys, from the cluster's
addresses only, and jobs get NCCL's environment.

The expected addresses, peers and variables are worked out here from the inventory's
settings, independently of operations/cluster/. Hosts that are in no cluster skip.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import warnings

import pytest

from sparkrig import nccl
from sparkrig.user_files import user_read

from .conftest import inventory_hosts as _inventory_hosts
from .conftest import inventory_name
from .reads import need, system_login
from .targets import LAB_INVENTORY, REPO, inventory_host_data


@pytest.fixture(scope="session")
def inventory_hosts(request, host_data) -> dict[str, dict]:
    """Every host of the inventory (a --limit may leave peers out of host_data)."""
    if request.config.sparkrig_targets == "inventory":
        return _inventory_hosts(request.config, limit=[])
    return inventory_host_data(str(REPO / LAB_INVENTORY)) if request.config.sparkrig_targets == "lab" else {}


@pytest.fixture
def node(request, host, settings) -> dict:
    """This host's cluster: its interfaces and its peers with their addresses."""
    if settings["cluster_name"] is None:
        pytest.skip("not in a cluster (cluster_name is None)")
    inventory_hosts = request.getfixturevalue("inventory_hosts")  # read only where needed
    found = cluster_node(inventory_name(host), settings, inventory_hosts)
    if found is None:
        pytest.skip("the suite has no inventory for this host's cluster (a --hosts target)")
    return found


def cluster_node(me: str, settings, inventory_hosts: dict[str, dict]) -> dict | None:
    """The ``node`` of host ``me`` (None where the inventory does not hold it)."""
    name = settings["cluster_name"]
    nodes = {n: d for n, d in inventory_hosts.items() if d.get("cluster_name") == name}
    if me not in nodes:
        return None
    interfaces = settings["cluster_interfaces"]
    peers = []
    for peer, data in nodes.items():
        if peer == me:
            continue
        for address in data["cluster_interfaces"].values():
            ip = ipaddress.IPv4Interface(address).ip
            for interface, own in interfaces.items():
                if ip in ipaddress.IPv4Interface(own).network:
                    peers.append({"name": peer, "address": str(ip), "interface": interface})
    head = settings["cluster_head"] or next(iter(nodes))
    return {
        "me": me,
        "name": name,
        "interfaces": interfaces,
        "peers": peers,
        "user": settings["cluster_user"],
        "mtu": settings["cluster_mtu"],
        "addresses": sorted(
            str(ipaddress.IPv4Interface(a).ip) for d in nodes.values() for a in d["cluster_interfaces"].values()
        ),
        "head": str(ipaddress.IPv4Interface(next(iter(nodes[head]["cluster_interfaces"].values()))).ip),
        "nodes": [head] + [n for n in nodes if n != head],
        "firsts": {
            n: str(ipaddress.IPv4Interface(next(iter(d["cluster_interfaces"].values()))).ip) for n, d in nodes.items()
        },
        "node_addresses": {
            n: sorted(str(ipaddress.IPv4Interface(a).ip) for a in d["cluster_interfaces"].values())
            for n, d in nodes.items()
        },
    }


def as_user(user: str, command: str) -> str:
    """``command`` as the cluster user (through sudo when the suite logs in as someone else)."""
    return (
        f'if [ "$(id -nu)" = {shlex.quote(user)} ]; then {command}; '
        f"else sudo -n runuser -u {shlex.quote(user)} -- {command}; fi"
    )


AUTHORIZED_KEYS_LIMIT = 1024 * 1024


# The logins ask about host keys and keys, which every key exchange checks alike, so they offer
# the cheapest first (`^`: the default set behind it, for a peer that refuses that one): OpenSSH's
# default hybrid exchange (sntrup761, ML-KEM) cost a lab node 45 to 65 ms of CPU more a login.
_SSH = "ssh -n -o BatchMode=yes -o ConnectTimeout=5 -o KexAlgorithms=^curve25519-sha256"


def _unpinned_probe(peer) -> str:
    return f"{_SSH} -o GlobalKnownHostsFile=/dev/null {peer['address']} true"


_NCCL_NAMES = ["NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include", "MASTER_ADDR", "VLLM_HOST_IP"]
_LOGIN_ENV = "printf '%s\\n' " + " ".join(f'"${n}"' for n in _NCCL_NAMES)


def _unit_env(settings) -> str:
    return (
        f"systemd-run -q --wait --pipe -p EnvironmentFile={settings['cluster_env_file']} "
        f"printenv {' '.join(_NCCL_NAMES)}"
    )


def _reader_node(r) -> dict | None:
    """The ``node`` of the host a need reads (None off a cluster, or without its inventory)."""
    if r.settings["cluster_name"] is None or r.inventory is None:
        return None
    return cluster_node(r.name, r.settings, r.inventory)


@need
def cluster(r) -> dict | None:
    """What the cluster controls read of a node (nothing off a cluster)."""
    settings = r.settings
    node = _reader_node(r)
    if node is None:
        return None
    user = node["user"]
    # The cluster user's authorized_keys, a file that user controls: through the bounded reader.
    keys = f"h=$(getent passwd {shlex.quote(user)} | cut -d: -f6) && " + user_read(
        '"$h/.ssh/authorized_keys"', AUTHORIZED_KEYS_LIMIT
    )
    return {
        "links": {
            interface: r.run(f"ip -j addr show dev {shlex.quote(interface)}") for interface in node["interfaces"]
        },
        "routes": {peer["address"]: r.run(f"ip -o route get {peer['address']}") for peer in node["peers"]},
        "pings": {
            peer["address"]: r.run(f"ping -n -c 1 -W 2 -M do -s {node['mtu'] - 28} {peer['address']}", sudo=True)
            for peer in node["peers"]
        },
        "logins": {peer["address"]: r.run(as_user(user, f"{_SSH} {peer['address']} id -un")) for peer in node["peers"]},
        # ssh's own exit status 255 is what the control checks: said, not taken for a failure.
        "unpinned": r.run(f"{{ {as_user(user, _unpinned_probe(node['peers'][0]))}; }} 2>&1; echo exit=$?")
        if node["peers"]
        else None,
        "key": r.path("/etc/sparkrig/cluster/id_ed25519"),
        "key_dir": r.path("/etc/sparkrig/cluster"),
        "authorized_keys": r.run(keys, sudo=True),
        "login_env": r.run(system_login(_LOGIN_ENV, user), sudo=True),
        "unit_env": r.run(_unit_env(settings), sudo=True),
        "hostfile": r.file("/etc/sparkrig/cluster/hostfile"),
    }


@need(prefetch=False)
def cluster_check(r):
    """spark-cluster-check as root, run whole (nothing off a cluster): asked by its action
    control alone. It pings and logs in to every peer, each once more than the reads above:
    a second login per peer in every read-only run (docs/performance.md)."""
    return None if _reader_node(r) is None else r.run("spark-cluster-check", sudo=True)


def test_cluster_interfaces_carry_their_address_and_mtu(read, node):
    """Protects against a link that comes up without its address (NCCL then finds no
    interface to bind), at the default 1500 bytes (NCCL over TCP loses much of its
    bandwidth), or left down."""
    for interface, address in node["interfaces"].items():
        (link,) = json.loads(read(cluster)["links"][interface].check())
        assert "UP" in link["flags"], f"{interface} is down: {link['flags']}"
        assert link["mtu"] == node["mtu"], f"{interface}: MTU {link['mtu']}"
        found = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
        assert address in found, f"{interface}: {found}"


def test_jumbo_frames_reach_every_peer_unfragmented(read, node):
    """Protects against a path with a smaller MTU somewhere (a switch, the peer's port):
    large frames are then dropped or fragmented, and collectives stall or crawl."""
    if not node["peers"]:
        pytest.skip("no peer shares a subnet with this node")
    found = read(cluster)
    for peer in node["peers"]:
        route = found["routes"][peer["address"]].check()
        assert f" dev {peer['interface']} " in f"{route} ", route
        # As root: Debian 13 lets users ping only where ping_group_range allows it.
        result = found["pings"][peer["address"]]
        assert result.rc == 0, f"{peer['name']} ({peer['address']}): {result.stdout}{result.stderr}"


def test_the_cluster_user_logs_in_to_every_peer_without_a_prompt(read, node):
    """Protects against mpirun and Ray stopping at a password or host-key prompt on a
    node (every node runs this control, so trust is checked both ways)."""
    for peer in node["peers"]:
        result = read(cluster)["logins"][peer["address"]]
        assert result.rc == 0 and result.stdout.strip() == node["user"], (
            f"{peer['name']}: {result.stdout}{result.stderr}"
        )


def test_a_host_key_that_is_not_pinned_is_refused(read, node):
    """Protects against trust on first use: a node answering with a key sparkrig did not
    pin (a replaced box, a man in the middle on the link) is refused, never learnt."""
    if not node["peers"]:
        pytest.skip("no peer shares a subnet with this node")
    said = read(cluster)["unpinned"].check()
    assert "Host key verification failed" in said and said.endswith("exit=255"), said


def test_the_cluster_key_is_the_cluster_users_alone(read, node):
    """Protects against a private key others can read (anyone holding it logs in to every
    node as the cluster user) or replace (a root-owned directory keeps it in place)."""
    found = read(cluster)
    key = found["key"]
    assert key.is_file and not key.is_symlink, f"{key.path} is missing or a link: converge this host again"
    assert (key.user, key.mode) == (node["user"], 0o600), (key.user, oct(key.mode))
    directory = found["key_dir"]
    assert directory.user == "root" and not directory.mode & 0o022, oct(directory.mode)


def test_authorized_keys_admit_the_cluster_key_from_cluster_addresses_only(read, node):
    """Protects against a cluster key opening the node from anywhere: each node's own key is
    admitted from that node's addresses alone, so a copy of it off the cluster, or the key of a
    node removed from the inventory, is refused."""
    keys = read(cluster)["authorized_keys"]
    assert keys.rc == 0, f"{node['user']}'s authorized_keys could not be read (exit {keys.rc}): {keys.stderr.strip()}"
    text = keys.stdout
    lines = [line for line in text.splitlines() if " sparkrig-cluster:" in line]
    by_node = {line.rsplit(":", 1)[1]: line for line in lines}
    assert len(by_node) == len(lines) and sorted(by_node) == sorted(node["node_addresses"]), lines
    for name, line in by_node.items():
        options = line.split(" ", 1)[0]
        sources = options.split('from="', 1)[1].split('"', 1)[0].split(",")
        assert sorted(sources) == node["node_addresses"][name], (name, sources)
        assert "restrict" in options.split(","), options


def test_nccl_environment_names_the_link_for_shells_and_units(read, node):
    """Protects against NCCL, Gloo or MPI choosing the management network (slow, and it
    may not reach the peers) in a login shell or a systemd unit."""
    interfaces = ",".join(node["interfaces"])
    own = str(ipaddress.IPv4Interface(next(iter(node["interfaces"].values()))).ip)
    wanted = [interfaces, interfaces, node["head"], own]
    found = read(cluster)
    login = found["login_env"].check()
    assert login.splitlines() == wanted
    unit = found["unit_env"].check()
    assert unit.splitlines() == wanted


def test_the_mpi_hostfile_lists_every_node_head_first(read, node):
    """Protects against mpirun starting ranks on a node left out, or rank 0 (NCCL's root)
    off the head."""
    lines = [
        line.split()[0] for line in read(cluster)["hostfile"].check().splitlines() if line and not line.startswith("#")
    ]
    assert lines == [node["firsts"][n] for n in node["nodes"]]


@pytest.mark.action
def test_spark_cluster_check_passes(read, node):
    """Protects against a cluster that looks configured yet cannot run a job: the same
    checks a user runs before a multi-node job, each line OK or SKIP (the NCCL run needs
    GPUs and nccl-tests)."""
    result = read(cluster_check)
    assert result.rc == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert all(line.startswith(("OK ", "SKIP ")) for line in lines), lines
    for peer in node["peers"]:
        assert f"OK ping {peer['name']}: {node['mtu'] - 28} bytes to {peer['address']}" in result.stdout
        assert f"OK ssh {peer['name']}: " in result.stdout


@need(peers=True)
def nccl_builds(r) -> dict:
    """NCCL's builds on the host, as the deploy's reading reads them (sparkrig.nccl: each
    libnccl.so.2's sha256 and version line through the one bounded reader, as root, nothing
    of the venv run); what the venv's owner put in its place fails this host, naming why."""
    fact = nccl.NcclBuilds()
    command = fact.command(venv=r.settings["python_venv_path"]).get_raw_value()
    return fact.process(r.check_output(command, sudo=True).splitlines())


def test_nccl_is_one_build_on_every_node(read, read_node, node):
    """Protects against a multi-node job that hangs or fails at its first collective: nodes
    loading NCCL builds that differ, even at one version (pip's nvidia-nccl-cu13 and the
    system's libnccl2 both 2.27.7, not one library). Depends on every other node of the
    cluster: each is read too, and one that cannot be read fails this control, named."""
    mine = read(nccl_builds)
    differing = []
    for peer in node["nodes"]:
        if peer != node["me"]:
            differing += nccl.differences(node["me"], mine, peer, read_node(peer, nccl_builds))
    assert not differing, f"cluster {node['name']}: NCCL differs across its nodes: " + "; ".join(differing)


def test_one_nccl_version_is_one_build_on_this_node(read, node, settings):
    """Protects against the venv's wheel and the system's libnccl2 at one version but two
    builds where a job's processes may load either: the cluster env file sets what the
    dynamic linker or vLLM reads (LD_LIBRARY_PATH, LD_PRELOAD, VLLM_NCCL_SO_PATH), so one
    process loads the system's build and another the venv's. Without those variables torch
    and vLLM load the venv's own (torch through its RUNPATH, vLLM the one torch loaded), and
    the system's serves programs outside the venv (nccl-tests, MPI): a warning, not a failure."""
    found = read(nccl_builds)
    twins = [f"{a} is {nccl.describe(found[a])} and {b} is {nccl.describe(found[b])}" for a, b in nccl.twins(found)]
    if not twins:
        return
    loaders = nccl.loader_variables(settings["cluster_env_extra"])
    said = f"{node['me']}: one NCCL version, two builds: " + "; ".join(twins)
    assert not loaders, f"{said}; {settings['cluster_env_file']} sets {', '.join(loaders)}: a job may load either"
    warnings.warn(f"{said} (torch and vLLM load the venv's)", UserWarning, stacklevel=1)
