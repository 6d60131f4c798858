"""Clusters: the link. Each cluster interface's file (systemd-networkd's, or netplan's where
the host has it), validated before it takes effect, applied to those interfaces alone (taken
from NetworkManager at once where it runs), and kept only when a NEW SSH connection confirms
it AND each cluster port is up with its address and MTU and reaches a peer; else the node
puts the old files back by itself."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import gevent
from pyinfra import logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation

from sparkrig import atomic, messages, rendering
from sparkrig.connection import run_on_new_connection

from .environment import peer_links
from .facts import NETPLAN_FILE, NETWORKD, NETWORKD_PREFIX, NM_FILE, WAIT_ONLINE, link_files


def render_networkd(interface: str, address: str, mtu: int) -> str:
    return rendering.render("cluster/link.network.j2", interface=interface, address=address, mtu=mtu)


NETWORKD_VALIDATOR = atomic.unit_file_validator(
    ["Match", "Link", "Network"],
    {
        "Name": r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}",
        "MTUBytes": "[0-9]+",
        "RequiredForOnline": "no",
        "Address": r"[0-9.]+/[0-9]+",
        "LinkLocalAddressing": "no",
        "IPv6AcceptRA": "no",
        "ConfigureWithoutCarrier": "yes",
    },
)


def render_networkmanager(interfaces: Iterable[str]) -> str:
    return rendering.render(
        "cluster/networkmanager.conf.j2", devices=",".join(f"interface-name:{name}" for name in interfaces)
    )


NM_VALIDATOR = atomic.unit_file_validator(
    ["device-sparkrig-cluster"],
    {"match-device": r"interface-name:[A-Za-z0-9_.-]+(,interface-name:[A-Za-z0-9_.-]+)*", "managed": "0"},
)


def render_netplan(interfaces: Mapping[str, str], mtu: int) -> str:
    return rendering.render("cluster/netplan.yaml.j2", interfaces=sorted(interfaces.items()), mtu=mtu)


# netplan reads every file under /etc/netplan: the new one is checked with all the others,
# in a scratch root, before it takes effect. For `sh -c SCRIPT NAME NEW`.
VERIFY_NETPLAN = rendering.script("cluster/verify-netplan.sh")


# A change of the link is kept only when a NEW SSH connection confirms it (as `netplan try`
# does): before anything is written, the host arms a timer that puts the old link files back
# and applies them; the controller cancels it through a fresh connection once the change is
# applied. Nodes are changed one after the other, and none after one that failed.
LINK_DIR = "/var/lib/sparkrig/cluster-link"
LINK_LOADED = "/var/lib/sparkrig/cluster-link.loaded"  # touched when sparkrig's networkctl reload ran
ROLLBACK_UNIT = "sparkrig-cluster-rollback"
# The timer above dies with a reboot: while a change waits, this unit rolls it back at boot.
BOOT_UNIT = "sparkrig-cluster-rollback-boot"
BOOT_FILES = (
    f"/etc/systemd/system/{BOOT_UNIT}.service",
    f"/etc/systemd/system/sysinit.target.wants/{BOOT_UNIT}.service",
)
APPLY_UNIT = "sparkrig-cluster-apply"
NETWORKD_DIRS = ("/etc/systemd/network", "/run/systemd/network", "/usr/lib/systemd/network", "/lib/systemd/network")
_unconfirmed: set[str] = set()  # clusters whose link change a node did not confirm in this run
_confirmed: set[str] = set()  # clusters whose link change a node confirmed in this run


def render_link_apply(interfaces: Sequence[str], netplan: bool, networkmanager: bool) -> str:
    return rendering.render(
        "cluster/link-apply.sh.j2",
        dir=LINK_DIR,
        loaded=LINK_LOADED,
        interfaces=list(interfaces),
        netplan=netplan,
        networkmanager=networkmanager,
        nm_file=NM_FILE,
    )


def render_link_rollback(
    paths: Sequence[str], added: Sequence[tuple[str, str]], started_networkd: bool, netplan: bool
) -> str:
    return rendering.render(
        "cluster/link-rollback.sh.j2",
        dir=LINK_DIR,
        unit=ROLLBACK_UNIT,
        boot_unit=BOOT_UNIT,
        boot_files=BOOT_FILES,
        paths=list(paths),
        added=list(added),
        started_networkd=started_networkd,
        netplan=netplan,
        networkd=NETWORKD,
    )


BOOT_SERVICE = rendering.render("cluster/link-rollback-boot.service.j2", dir=LINK_DIR, unit=ROLLBACK_UNIT)


def pending_check(own: Sequence[str]) -> str:
    """sh that fails, naming them, when networkd files other than ``own`` (name patterns)
    changed after systemd-networkd last loaded its files (its start, or sparkrig's last
    reload): ``networkctl reload`` would apply their change to their interfaces too."""
    skip = " ".join(f"! -name {shlex.quote(pattern)}" for pattern in own)
    return (
        f"if systemctl is-active -q {NETWORKD}; then "
        f'r="$d/networkd-started"; touch -d "$(systemctl show -P ActiveEnterTimestamp {NETWORKD})" "$r"; '
        f'if [ {LINK_LOADED} -nt "$r" ]; then r={LINK_LOADED}; fi; '
        f"p=$(find {' '.join(NETWORKD_DIRS)} -maxdepth 2 -type f "
        "\\( -name '*.network' -o -name '*.netdev' -o -path '*.network.d/*.conf' -o -path '*.netdev.d/*.conf' \\) "
        f'{skip} -newer "$r" 2>/dev/null | sort -u | tr "\\n" " "); '
        'if [ -n "$p" ]; then echo "sparkrig: changed since systemd-networkd loaded its files: ${p% }; '
        "networkctl reload would apply them to their interfaces too, so the cluster link is not changed: "
        f'apply them yourself (networkctl reload) and touch {LINK_LOADED}, or undo them" >&2; exit 1; fi; fi'
    )


def arm_rollback(
    paths: Sequence[str], own: Sequence[str], apply_script: str, rollback_script: str, seconds: int
) -> str:
    """sh, as root: refuse while another link's change is pending, keep the old link files,
    write the apply and rollback scripts, arm the rollback at boot and the rollback timer."""
    keep = " ".join(paths)
    return (
        f"set -e; d={LINK_DIR}; install -d -m 755 -o root -g root /var/lib/sparkrig; "
        f"systemctl stop {ROLLBACK_UNIT}.timer {APPLY_UNIT}.service 2>/dev/null || true; "
        f"systemctl reset-failed {ROLLBACK_UNIT}.timer {ROLLBACK_UNIT}.service {APPLY_UNIT}.service "
        "2>/dev/null || true; "
        f'rm -rf "$d"; mkdir -m 700 "$d"; {pending_check(own)}; '
        f'printf %s {shlex.quote(apply_script)} >"$d/apply.sh"; '
        f'printf %s {shlex.quote(rollback_script)} >"$d/rollback.sh"; '
        f'for f in {keep}; do if [ -f "$f" ]; then mkdir -p "$d/old${{f%/*}}"; cp -a "$f" "$d/old$f"; fi; done; '
        f't=$(mktemp /etc/systemd/system/.{BOOT_UNIT}.XXXXXX); printf %s {shlex.quote(BOOT_SERVICE)} >"$t"; '
        f'chmod 644 "$t"; mv -f "$t" {BOOT_FILES[0]}; mkdir -p {BOOT_FILES[1].rsplit("/", 1)[0]}; '
        f'ln -sfn {BOOT_FILES[0]} {BOOT_FILES[1]}; touch "$d/armed"; '
        f"systemd-run --quiet --unit={ROLLBACK_UNIT} --on-active={seconds}s --timer-property=AccuracySec=1s "
        f'/bin/sh "$d/rollback.sh"'
    )


def render_confirm(ports: Sequence[tuple[str, str, int, Sequence[str]]], peers: bool) -> str:
    """sh, through a NEW connection: the apply's outcome and each cluster port's state (up,
    its address and MTU; with ``peers``, a peer on its subnet answers); when both are right,
    the rollback is cancelled. ``ports``: (interface, address, MTU, peer addresses)."""
    return rendering.script(
        "cluster/confirm-link.sh.j2",
        dir=LINK_DIR,
        unit=ROLLBACK_UNIT,
        boot_files=BOOT_FILES,
        ports=[{"interface": i, "address": a, "mtu": m, "peers": list(p) if peers else []} for i, a, m, p in ports],
    )


def _not_after_a_failure(state, host, cluster: str) -> bool:
    if cluster in _unconfirmed:
        logger.error(
            f"{host.print_prefix}sparkrig: cluster {cluster}: the link is not changed here, as a node "
            "before this one did not confirm its change in this run (see above)"
        )
        return False
    return True


def _confirm_link(state, host, cluster: str, seconds: int, ports: Sequence[tuple]) -> bool:
    """Confirm the link change through NEW SSH connections until the host's rollback timer
    would fire; else wait for it, and say whether the host came back. The first node changed
    in a run is not asked to reach its peers (they wait for their own change)."""
    confirm = render_confirm(ports, peers=cluster in _confirmed)
    deadline = time.monotonic() + seconds - 5
    said, rolled_back = "no new SSH connection", False
    while time.monotonic() < deadline:
        ok, lines = run_on_new_connection(state, host, confirm, timeout=10)
        answer = lines[-1] if ok and lines else ""
        if answer == "confirmed":
            _confirmed.add(cluster)
            return True
        rolled_back = answer == "rolled-back"
        if answer.startswith("failed") or rolled_back:
            said = f"the apply {answer}" if answer.startswith("failed") else "the host rolled back already"
            break
        if answer.startswith("link: "):
            said = f"the link is not up as configured: {answer[6:]}"
        elif ok:
            said = "the apply did not finish"
        else:  # the last word: an apply seen running and then cut off the controller
            said = "no new SSH connection"
        gevent.sleep(1)
    _unconfirmed.add(cluster)
    logger.error(
        f"{host.print_prefix}sparkrig: cluster {cluster}: the link change was not confirmed ({said}): "
        f"the host puts its previous link files back and applies them by itself ({ROLLBACK_UNIT}.timer)"
    )
    if not rolled_back:  # else a new connection just saw it done
        gevent.sleep(max(0.0, deadline + 15 - time.monotonic()))
    ok, lines = run_on_new_connection(state, host, f"cat {LINK_DIR}/rolled-back", timeout=10)
    if ok:
        logger.error(f"{host.print_prefix}sparkrig: cluster {cluster}: rolled back; a new SSH connection works again")
    else:
        logger.error(
            f"{host.print_prefix}sparkrig: cluster {cluster}: still no new SSH connection after the rollback "
            f"time: reach the host another way ({LINK_DIR} holds the old files and rollback.sh)"
        )
    return False


@operation()
def link(
    cluster: str,
    files: Sequence[tuple],
    stale: Sequence[str],
    start_networkd: Sequence[str],
    paths: Sequence[str],
    own: Sequence[str],
    interfaces: Sequence[str],
    added: Sequence[tuple[str, str]],
    netplan: bool,
    networkmanager: bool,
    seconds: int,
    ports: Sequence[tuple[str, str, int, Sequence[str]]],
):
    """
    Change the cluster link: its files written, applied to its interfaces alone, kept only when
    a NEW SSH connection confirms it within ``seconds`` and each port is as configured and
    reaches a peer (else the host restores the old files).

    + cluster: the cluster's name
    + files: (dest, content, mode, validate, current) of each link file to write
    + stale: link files to remove
    + start_networkd: the commands that enable and start systemd-networkd (none when it runs)
    + paths: every link file sparkrig may hold here (kept before the change, restored after)
    + own: name patterns of the networkd files this change makes
    + interfaces: the cluster interfaces (never the one the deploy's connection uses)
    + added: (interface, address) the change adds (taken off again by a rollback)
    + netplan: the host renders netplan's files
    + networkmanager: NetworkManager runs: it re-reads its configuration and lets go of them at once
    + seconds: how long the host waits for the confirmation before it rolls back
    + ports: (interface, address, MTU, peer addresses on its subnet) the confirmation checks
    """
    yield FunctionCommand(_not_after_a_failure, (cluster,), {})
    apply_script = render_link_apply(interfaces, netplan, networkmanager)
    rollback_script = render_link_rollback(paths, added, bool(start_networkd), netplan)
    yield StringCommand(arm_rollback(paths, own, apply_script, rollback_script, seconds))
    for dest, content, mode, validate, current in files:
        yield from atomic.file_commands(dest=dest, content=content, mode=mode, validate=validate, current=current)
    if stale:
        yield StringCommand("rm -f", *[QuoteString(p) for p in stale])
    for command in start_networkd:
        yield command
    # Detached: a change that cuts this connection off still runs to its end.
    yield StringCommand(f"systemd-run --quiet --collect --unit={APPLY_UNIT} /bin/sh {LINK_DIR}/apply.sh")
    yield FunctionCommand(_confirm_link, (cluster, seconds, ports), {})


def converge_link(
    settings: Mapping[str, Any],
    node: Mapping[str, Any],
    state: Mapping[str, Any],
    interfaces: Mapping[str, str],
    peers: Sequence[Mapping[str, Any]],
) -> None:
    """The link step of the cluster's deploy: each rail's file written where it differs
    from ``interfaces`` (every rail: the listed interfaces and the twins ``node`` read),
    stale ones removed, networkd started, then applied by :func:`link`, which keeps the
    change only once a new SSH connection confirms it."""
    name, mtu = settings["cluster_name"], settings["cluster_mtu"]
    files = {**node["link_state"], **state["files"]}
    netplan = node["netplan"]
    if netplan:
        contents = {NETPLAN_FILE: (render_netplan(interfaces, mtu), 0o600, ("sh", "-c", VERIFY_NETPLAN, "verify"))}
    else:
        contents = {
            path: (render_networkd(i, interfaces[i], mtu), 0o644, NETWORKD_VALIDATOR)
            for i, path in zip(interfaces, link_files(interfaces, False))
        }
    if node["networkmanager"]:
        # DGX OS: NetworkManager manages every port, netplan or not.
        contents[NM_FILE] = (render_networkmanager(interfaces), 0o644, NM_VALIDATOR)
    writes = [
        (dest, content, mode, validate, files.get(dest))
        for dest, (content, mode, validate) in contents.items()
        if not atomic.up_to_date(files.get(dest), content, mode=mode)
    ]
    stale = sorted(set(node["link_files"]) - set(contents))
    units = state["units"]
    start_networkd = []
    if (units.get(NETWORKD, {}).get("active"), units.get(NETWORKD, {}).get("enabled")) != ("active", "enabled"):
        start_networkd = [f"systemctl enable --now {NETWORKD}"]
        if units.get(WAIT_ONLINE, {}).get("enabled") not in ("enabled", "enabled-runtime"):
            # Enabling networkd enables its wait-online too (Also=), which would hold boot up
            # to two minutes for links it does not manage: keep boot as it was.
            start_networkd.append(f"systemctl disable {WAIT_ONLINE}")
    drifted = [
        i
        for i, a in interfaces.items()
        if not node["links"][i]["up"]
        or node["links"][i]["mtu"] != mtu
        or a not in node["links"][i]["addresses"]
        or (node["networkmanager"] and i in node["nm_managed"])
    ]
    if writes or stale or start_networkd or drifted:
        for dest, *_rest in writes:
            messages.detail(f"writing {dest}")
        if stale:
            messages.detail(f"removing {', '.join(stale)}")
        if drifted:
            messages.detail(f"{', '.join(drifted)}: down, MTU or address not as configured, or NetworkManager's")
        link(
            name="Cluster link: written, applied to its interfaces alone, kept once a new SSH connection confirms it",
            cluster=name,
            files=writes,
            stale=stale,
            start_networkd=start_networkd,
            paths=sorted({*contents, *stale, *node["link_files"]}),
            own=[f"{NETWORKD_PREFIX}*.network", *[f"10-netplan-{i}.*" for i in interfaces]],
            interfaces=list(interfaces),
            added=[(i, a) for i, a in interfaces.items() if a not in node["links"][i]["addresses"]],
            netplan=netplan,
            networkmanager=node["networkmanager"],
            seconds=settings["cluster_link_confirm_seconds"],
            ports=[(i, a, mtu, [p["address"] for p in peer_links({i: a}, peers)]) for i, a in interfaces.items()],
            _serial=True,  # node after node: a change no new connection confirms stops the others'
        )
