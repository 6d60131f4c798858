"""Bring the lab up and down: hosts, their boot, readiness, and cleanup.

``up`` always starts from nothing: it first removes whatever an earlier run
left behind, found both through state.json and by name (``sparkrig-*``
namespaces, ``srlab*`` links, the nft table, nspawn processes on a rootfs
below ``LAB_DIR/hosts``, processes in the ``sparkrig-lab`` cgroups, host
directories, the apt repository server by its pid file and its command line).
``down`` is that same cleanup. One lock file serialises all commands that
change the lab.

``up`` also builds (once, cached) the lab's signed apt repositories and
starts a detached HTTP server for them on every host's gateway address; it
keeps serving through ``recreate`` and ``restart`` until ``down``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import binfmt, cgroups, dgxos, network, registry, repo, sourcebuild, system, wheelhouse
from .config import (
    BOOT_TIMEOUT_S,
    CACHE_DIR,
    CLUSTER_KEYS,
    CONTROLLER_CUDA,
    CONTROLLER_RESOLV_CONF,
    HOSTS_DIR,
    INVENTORY,
    KNOWN_HOSTS,
    LAB_DIR,
    LOCK,
    MIRROR,
    NETNS_PREFIX,
    NFT_TABLE,
    REPO_CACHE,
    REPO_PORT,
    REPO_SERVER_LOG,
    REPO_SERVER_PID,
    SSH_CONFIG,
    SSH_KEY,
    SSH_USER,
    STATE,
    STOP_GRACE_S,
    WHEEL_CACHE,
)
from .image import copy_image, ensure_images, missing_images
from .model import BOOT_MARKER, BOOTED_FLEET, FLAVOURS, AptRepo, LabHost, cluster_links, plan_fleet, repo_url
from .render import (
    parse_nameservers,
    parse_public_key,
    passwd_ids,
    render_daemon_json,
    render_etc_hosts,
    render_inventory,
    render_known_hosts,
    render_resolv_conf,
    render_ssh_config,
)
from .system import (
    JOIN_THEN_EXEC,
    LabError,
    kill_processes,
    lab_nspawn_pids,
    locked,
    missing_requirements,
    pid_alive,
    remove_tree,
    run,
    spawn,
    stop_processes,
    tail,
    write_file,
)

log = logging.getLogger("sparkrig.lab")

# A lab host's /sys is the controller's, and writable (SYSTEMD_NSPAWN_API_VFS_WRITABLE): to
# systemd-networkd that means udev runs, so it waits for udev to announce each link, which
# never happens in a namespace without udev. A read-only /sys for networkd alone is what a
# container normally gives it: it then configures links (the cluster's stand-in link) at once.
NETWORKD_LAB_DROP_IN = "/etc/systemd/system/systemd-networkd.service.d/sparkrig-lab.conf"
NETWORKD_LAB_CONF = (
    "# sparkrig lab (lab/fleet.py): /sys here is the controller's; networkd must not wait for udev\n"
    "[Service]\nBindReadOnlyPaths=/sys\n"
)
# STAND-IN environment for fwupd: its unit refuses containers (ConditionVirtualization=
# !container), so fwupdmgr would wait 25 s for a daemon that never starts. In the lab it runs,
# with the controller's /sys read-only for it, and finds no firmware device (the container's
# CPU only, without a version): the real fwupd answers, with nothing to show.
FWUPD_LAB_DROP_IN = "/etc/systemd/system/fwupd.service.d/sparkrig-lab.conf"
FWUPD_LAB_CONF = (
    "# sparkrig lab (lab/fleet.py), a STAND-IN environment: fwupd runs in this container, /sys read-only\n"
    "[Unit]\nConditionVirtualization=\n[Service]\nBindReadOnlyPaths=/sys\n"
)
NSPAWN_ENV = {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1", "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "1"}
NSPAWN_PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")
NSPAWN_LOCK_DIR = Path("/run/systemd/nspawn/locks")


@dataclass
class _State:
    """What state.json records: the hosts, the controller's ip_forward before the lab, the repos."""

    hosts: list[LabHost]
    ip_forward_before: int | None
    apt_repo: AptRepo | None = None


# --- public API ------------------------------------------------------------


def inventory_path() -> Path:
    """Where ``up`` writes inventory.json."""
    return INVENTORY


def ssh_config_path() -> Path:
    """Where ``up`` writes the ssh_config for the lab hosts."""
    return SSH_CONFIG


def up(hosts: Sequence[tuple[str, str]] | None = None, keep_on_failure: bool = False) -> list[LabHost]:
    """Boot a fresh fleet (default: one Debian 12 and one Debian 13 host).

    Leftovers of earlier runs are removed first. If booting fails, the lab is
    torn down again unless ``keep_on_failure`` (to look at it).
    """
    _require_runnable()
    planned = plan_fleet(hosts or BOOTED_FLEET, HOSTS_DIR)
    with locked(LOCK):
        _teardown()
        try:
            return _bring_up(planned)
        except BaseException:
            if not keep_on_failure:
                log.error("up failed: tearing the lab down again")
                _teardown_after_failure()
            raise


def down() -> None:
    """Remove every host, namespace, veth, nft table and process of the lab.

    Keeps the image cache and the lab's SSH key. Succeeds when nothing is up.
    """
    _require_runnable()
    with locked(LOCK):
        _teardown()


def recreate(name: str) -> LabHost:
    """Destroy one host and boot it fresh from the cached image (new host keys)."""
    _require_runnable()
    with locked(LOCK):
        state, host = _running_host(name)
        if state.apt_repo is None:
            raise LabError("state.json records no apt repository (an older lab): run up again")
        _stop_host(host)
        _remove_rootfs(host.rootfs)
        _register_emulation([host])
        image = _images([host.flavour])[host.flavour]
        _make_rootfs(host, image, _ensure_ssh_key(), _controller_nameservers())
        _write_starting_state(host, state.apt_repo)
        _write_client_files(state.hosts, state.apt_repo)
        _boot(host)
        _write_state(state)
        _wait_ready(host)
        _install_starting_stack(host)
        return host


def kill(name: str) -> None:
    """Cut one host's power: SIGKILL its nspawn and everything it ran, no shutdown. Its
    files stay as they were at that instant (half-written ones too); ``restart`` boots it."""
    _require_runnable()
    with locked(LOCK):
        _state, host = _running_host(name)
        kill_processes(lab_nspawn_pids(HOSTS_DIR, under=host.rootfs, boot_loops=True))
        kill_processes(lab_nspawn_pids(HOSTS_DIR, under=host.rootfs))
        _kill_leftovers(cgroups.pids(host.name), [host.netns])
        log.info("%s: killed", host.name)


def restart(name: str) -> LabHost:
    """Shut one host down cleanly and boot it again from the same root file system.

    What a reboot does to a real box: its files stay, its processes, /run and
    /tmp do not.
    """
    _require_runnable()
    with locked(LOCK):
        state, host = _running_host(name)
        _stop_host(host)
        _boot(host)
        _write_state(state)
        _wait_ready(host)
        return host


def link(first: str, second: str, interface: str) -> None:
    """Cable two running hosts together: a ConnectX-7 STAND-IN link (a veth pair named
    ``interface`` in both, see :class:`lab.model.ClusterLink`), as a test that adds a node
    to a cluster needs. It goes with the hosts' namespaces, or with :func:`unlink`."""
    _require_runnable()
    with locked(LOCK):
        _state, one = _running_host(first)
        _state, other = _running_host(second)
        network.create_cluster_link(one, other, interface)


def unlink(name: str, interface: str) -> None:
    """Remove the link ``interface`` of a running host (and so its other end)."""
    _require_runnable()
    with locked(LOCK):
        _state, host = _running_host(name)
        run(["ip", "-n", host.netns, "link", "delete", interface])


def appear_as(name: str, address: str | None) -> None:
    """A FAULT for the cluster tests: the controller's SSH connections to host ``name`` leave
    with source ``address`` (SNAT in the lab's own table), as a controller behind NAT or a jump
    host reaches a node under an address of its own, which the controller cannot know. ``None``
    takes the fault away. Replies come back through the controller, which un-NATs them."""
    _require_runnable()
    comment = f"fault:{name}"
    with locked(LOCK):
        _state, host = _running_host(name)
        listing = run(["nft", "-a", "list", "chain", "inet", NFT_TABLE, "postrouting"]).stdout
        for line in listing.splitlines():
            if f'comment "{comment}"' in line:
                run(["nft", "delete", "rule", "inet", NFT_TABLE, "postrouting", "handle", line.rsplit(" ", 1)[1]])
        if address is not None:
            run(
                [
                    "nft",
                    "add",
                    "rule",
                    "inet",
                    NFT_TABLE,
                    "postrouting",
                    "ip",
                    "daddr",
                    host.address,
                    "tcp",
                    "dport",
                    "22",
                    "snat",
                    "ip",
                    "to",
                    address,
                    "comment",
                    f'"{comment}"',
                ]
            )


def _running_host(name: str) -> tuple[_State, LabHost]:
    state = _read_state()
    if state is None:
        raise LabError("the lab is not up (no state.json): run up first")
    host = next((h for h in state.hosts if h.name == name), None)
    if host is None:
        raise LabError(f"no lab host {name!r}; hosts: {[h.name for h in state.hosts]}")
    if host.netns not in network.lab_netns():
        raise LabError(f"{host.netns} is gone: run up again")
    return state, host


def status() -> list[dict[str, Any]]:
    """One dict per host of the lab (empty when it is down); never raises."""
    state = _read_state()
    if state is None:
        return []
    return [_host_status(host) for host in state.hosts]


def run_ssh(
    host_name: str,
    command: str,
    check: bool = True,
    timeout: float | None = 600,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on a lab host as the lab's SSH user (a CompletedProcess)."""
    return run(_ssh_argv(host_name, command), check=check, timeout=timeout, input=input)


# --- bringing up -------------------------------------------------------------


def _require_runnable() -> None:
    problems = missing_requirements()
    if problems:
        raise LabError("the lab cannot run here: " + "; ".join(problems))


def _bring_up(hosts: list[LabHost]) -> list[LabHost]:
    started = time.monotonic()
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    pubkey = _ensure_ssh_key()
    _register_emulation(hosts)
    system.ensure_inotify_instances(len(hosts))
    images = _images([host.flavour for host in hosts])
    apt_repo = repo.ensure_repo(REPO_CACHE, REPO_PORT)
    busybox = [images[flavour] / "bin" / "busybox" for flavour in sorted(images)]
    registry.build(apt_repo.root, next(path for path in busybox if path.is_file()))
    nameservers = _controller_nameservers()
    ip_forward_before = network.read_ip_forward()
    state = _State(hosts, ip_forward_before, apt_repo)
    _write_state(state)
    network.install_nft(nameservers, ip_forward_before, apt_repo.port)
    if ip_forward_before != 1:
        network.write_ip_forward(1)
    _parallel(lambda host: _make_host(host, images[host.flavour], pubkey, nameservers), hosts)
    by_name = {host.name: host for host in hosts}
    for link in cluster_links(list(by_name)):
        network.create_cluster_link(by_name[link.hosts[0]], by_name[link.hosts[1]], link.interface)
    for host in hosts:
        _write_starting_state(host, apt_repo)
    repo.start_server(apt_repo, [host.gateway for host in hosts], REPO_SERVER_PID, REPO_SERVER_LOG)
    _write_client_files(hosts, apt_repo)
    for host in hosts:
        _boot(host)
    _write_state(state)
    _parallel(_wait_ready, hosts)
    _parallel(_install_starting_stack, hosts)
    log.info("lab up: %d hosts in %.0f s", len(hosts), time.monotonic() - started)
    return hosts


def _register_emulation(hosts: Sequence[LabHost]) -> None:
    """qemu-user's binfmt_misc entry, where a host's architecture is foreign here."""
    arches = {FLAVOURS[host.flavour].arch for host in hosts}
    problems = binfmt.missing(arches)
    if problems:
        raise LabError("the lab cannot run here: " + "; ".join(problems))
    if any(binfmt.needs_emulation(arch) for arch in arches):
        binfmt.ensure()


def _write_starting_state(host: LabHost, apt_repo: AptRepo) -> None:
    """The files a host starts with beyond its image (DGX OS's sources, a GPU stand-in)."""
    key = (apt_repo.root / repo.PUBLIC_KEYS["dgx"]).read_text()
    files = dgxos.rootfs_files(FLAVOURS[host.flavour], repo_url(host.index, apt_repo.port), repo.DGX_ORIGIN, key)
    files.update(dgxos.network_files(FLAVOURS[host.flavour], host.address, host.gateway, _controller_nameservers()))
    for path, (content, mode) in files.items():
        _write_in_root(host.rootfs, path.lstrip("/"), content, mode)
    _write_in_root(host.rootfs, NETWORKD_LAB_DROP_IN.lstrip("/"), NETWORKD_LAB_CONF, 0o644)
    _write_in_root(host.rootfs, FWUPD_LAB_DROP_IN.lstrip("/"), FWUPD_LAB_CONF, 0o644)


def _install_starting_stack(host: LabHost) -> None:
    """Docker and the toolkit from the DGX OS stand-in source, on a ``dgx_os`` host."""
    if not FLAVOURS[host.flavour].dgx_os:
        return
    started = time.monotonic()
    run_ssh(host.name, dgxos.install_command(), timeout=600)
    log.info("%s: DGX OS's Docker and toolkit (stand-ins) installed in %.0f s", host.name, time.monotonic() - started)


def images_to_build(hosts: Sequence[tuple[str, str]] | None = None) -> list[str]:
    """The images ``up`` would build before it boots ``hosts`` (default: the
    default fleet): none once they are cached."""
    return missing_images([flavour for _name, flavour in hosts or BOOTED_FLEET], CACHE_DIR, MIRROR)


def _images(flavours: Sequence[str]) -> dict[str, Path]:
    return ensure_images(flavours, CACHE_DIR, MIRROR, HOSTS_DIR)


def _ensure_ssh_key() -> str:
    """The lab's public key, making the key pair once (atomically) if needed."""
    key_dir = SSH_KEY.parent
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(key_dir, 0o700)
    if not SSH_KEY.exists():
        with tempfile.TemporaryDirectory(dir=key_dir) as tmp:
            new = Path(tmp) / SSH_KEY.name
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkrig-lab", "-f", new])
            os.replace(f"{new}.pub", f"{SSH_KEY}.pub")
            os.replace(new, SSH_KEY)
    os.chmod(SSH_KEY, 0o600)
    public = Path(f"{SSH_KEY}.pub")
    if not public.exists():
        write_file(public, run(["ssh-keygen", "-y", "-f", SSH_KEY]).stdout)
    return public.read_text().strip()


def _controller_nameservers() -> list[str]:
    nameservers = parse_nameservers(CONTROLLER_RESOLV_CONF.read_text())
    if not nameservers:
        raise LabError(
            f"no IPv4 nameserver other than loopback in {CONTROLLER_RESOLV_CONF}: the lab hosts would have no DNS"
        )
    return nameservers


def _make_host(host: LabHost, image: Path, pubkey: str, nameservers: list[str]) -> None:
    network.create_host_network(host)
    _make_rootfs(host, image, pubkey, nameservers)


def _make_rootfs(host: LabHost, image: Path, pubkey: str, nameservers: list[str]) -> None:
    """Copy the image and make it this host's: name, machine-id, host keys, login key, DNS."""
    root = host.rootfs
    copy_image(image, root)
    _write_in_root(root, "etc/hostname", f"{host.name}\n")
    _write_in_root(root, "etc/hosts", render_etc_hosts(host.name))
    _write_in_root(root, "etc/machine-id", f"{uuid.uuid4().hex}\n", 0o444)
    _write_in_root(root, "etc/resolv.conf", render_resolv_conf(nameservers))
    for old_key in (root / "etc/ssh").glob("ssh_host_*"):
        old_key.unlink()
    run(["ssh-keygen", "-A", "-f", root])
    uid, gid = passwd_ids((root / "etc/passwd").read_text(), SSH_USER)
    home = root / "home" / SSH_USER
    ssh_dir = home / ".ssh"
    if home.is_symlink() or ssh_dir.is_symlink():
        raise LabError(f"{ssh_dir} is a symlink in the image")
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    os.chown(ssh_dir, uid, gid)
    os.chmod(ssh_dir, 0o700)
    write_file(ssh_dir / "authorized_keys", pubkey + "\n", 0o600, uid, gid)
    _write_in_root(root, "etc/docker/daemon.json", render_daemon_json(host))
    toolkit = cuda_toolkit(host)
    if toolkit:
        _link_cuda_toolkit(root, toolkit)


def cuda_toolkit(host: LabHost) -> Path | None:
    """The controller's CUDA toolkit this host sees, or None (flavour without, or none here)."""
    toolkit = Path(CONTROLLER_CUDA) if CONTROLLER_CUDA else None
    if not FLAVOURS[host.flavour].cuda_toolkit or toolkit is None:
        return None
    if not re.fullmatch(r"cuda-\d+\.\d+", toolkit.name) or not (toolkit / "bin" / "nvcc").is_file():
        return None
    return toolkit


def _link_cuda_toolkit(root: Path, toolkit: Path) -> None:
    """A mount point for the toolkit and Ubuntu's link chain to it."""
    (root / "usr/local" / toolkit.name).mkdir(parents=True, exist_ok=True)
    for link, target in (
        ("etc/alternatives/cuda", f"/usr/local/{toolkit.name}"),
        ("usr/local/cuda", "/etc/alternatives/cuda"),
    ):
        path = root / link
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(target)


def _write_in_root(root: Path, relative: str, content: str, mode: int = 0o644) -> None:
    """Write a file inside a rootfs, replacing (never following) a symlink there."""
    target = root / relative
    if target.is_symlink():
        target.unlink()
    write_file(target, content, mode)


def _host_keys(host: LabHost) -> list[tuple[str, str]]:
    keys = [parse_public_key(path.read_text()) for path in sorted((host.rootfs / "etc/ssh").glob("ssh_host_*_key.pub"))]
    if not keys:
        raise LabError(f"no SSH host keys in {host.rootfs}/etc/ssh")
    return keys


def _write_client_files(hosts: list[LabHost], apt_repo: AptRepo) -> None:
    """known_hosts, ssh_config and inventory.json for all ``hosts``."""
    keys = {host.name: _host_keys(host) for host in hosts}
    write_file(KNOWN_HOSTS, render_known_hosts(hosts, keys))
    write_file(SSH_CONFIG, render_ssh_config(hosts, SSH_KEY, KNOWN_HOSTS))
    write_file(
        INVENTORY,
        render_inventory(
            hosts,
            SSH_KEY,
            KNOWN_HOSTS,
            apt_repo,
            wheelhouse.read_description(apt_repo.root),
            registry.read_description(apt_repo.root),
            sourcebuild.read_description(apt_repo.root),
        ),
    )


def _console_log(host: LabHost) -> Path:
    return host.rootfs.parent / "console.log"


def _boot(host: LabHost) -> None:
    network.power_on_ports(host)
    argv = [
        "systemd-nspawn",
        "--boot",
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path=/run/netns/{host.netns}",
        "-D",
        str(host.rootfs),
        f"--machine={host.name}",
        "--capability=all",
        "--system-call-filter=@keyring bpf",
        "--console=read-only",
    ]
    toolkit = cuda_toolkit(host)
    if toolkit:
        argv.append(f"--bind-ro={toolkit}:/usr/local/{toolkit.name}")
    # nspawn starts in the host's cgroups, as before; the loop waits in a leaf of its own.
    procs = [str(directory / "cgroup.procs") for directory in cgroups.host_cgroups(host.name)]
    loop = ["sh", "-c", BOOT_LOOP, BOOT_MARKER, *procs, "--", *argv]
    host.pid = spawn(loop, _console_log(host), NSPAWN_ENV, cgroups.host_cgroups(host.name, "boot"))
    write_file(host.rootfs.parent / "pid", f"{host.pid}\n")
    log.info("%s: booting (boot loop pid %d)", host.name, host.pid)


# A lab host that reboots itself boots again, as a real box does: nspawn exits 133 when the
# container asks for a reboot (systemd-nspawn@.service restarts it on that status alone,
# RestartForceExitStatus=133); any other exit (a poweroff, a stop, a kill) ends the loop.
BOOT_LOOP = (
    f'while :; do sh -ec {shlex.quote(JOIN_THEN_EXEC)} sh "$@"; status=$?; '
    '[ "$status" -eq 133 ] || exit "$status"; '
    'echo "sparkrig-lab: reboot asked from inside (nspawn exit 133): booting again"; done'
)


def _wait_ready(host: LabHost, timeout: float = BOOT_TIMEOUT_S) -> None:
    """Wait until SSH works and systemd reports ``running``."""
    started = time.monotonic()
    deadline = started + timeout
    last = "no attempt yet"
    while time.monotonic() < deadline:
        if not pid_alive(host.pid):
            raise LabError(_boot_error(host, "systemd-nspawn exited"))
        wait = max(1, int(deadline - time.monotonic()))
        try:
            result = run(
                _ssh_argv(host.name, f"timeout {wait} systemctl is-system-running --wait", 2),
                check=False,
                timeout=wait + 10,
            )
        except LabError as error:
            last = str(error)
            continue
        state = result.stdout.strip()
        if state == "running":
            log.info("%s: ready after %.1f s", host.name, time.monotonic() - started)
            return
        if state == "degraded":
            failed = run_ssh(host.name, "systemctl --failed --no-legend --plain", check=False)
            failed_units = f"systemd is degraded; failed units:\n{failed.stdout}"
            raise LabError(_boot_error(host, failed_units))
        last = f"ssh exit {result.returncode}: {(result.stderr or state).strip()}"
        time.sleep(1)
    raise LabError(_boot_error(host, f"not ready after {timeout:.0f} s (last: {last})"))


def _boot_error(host: LabHost, what: str) -> str:
    return f"{host.name}: {what}\n--- end of {_console_log(host)} ---\n{tail(_console_log(host))}"


def _ssh_argv(host_name: str, command: str, connect_timeout: int = 10) -> list[str]:
    return [
        "ssh",
        "-F",
        str(SSH_CONFIG),
        "-o",
        f"ConnectTimeout={connect_timeout}",
        host_name,
        command,
    ]


def _parallel(action: Callable[[LabHost], None], hosts: Sequence[LabHost]) -> None:
    """Run ``action`` for every host at once; raise one error naming each host that failed."""
    with ThreadPoolExecutor(max_workers=min(len(hosts), 8)) as pool:
        futures = {host.name: pool.submit(action, host) for host in hosts}
    errors = []
    for name, future in futures.items():
        error = future.exception()
        if error is not None:
            message = str(error)
            errors.append(message if message.startswith(f"{name}:") else f"{name}: {message}")
    if errors:
        raise LabError("\n".join(errors))


# --- state -----------------------------------------------------------------


def _write_state(state: _State) -> None:
    document = {
        "ip_forward_before": state.ip_forward_before,
        "hosts": [host.to_json() for host in state.hosts],
        "apt_repo": None if state.apt_repo is None else state.apt_repo.to_json(),
    }
    write_file(STATE, json.dumps(document, indent=2) + "\n")


def _read_state() -> _State | None:
    """state.json, or None when it is missing or unreadable (then leftovers are found by name)."""
    try:
        document = json.loads(STATE.read_text())
        before = document.get("ip_forward_before")
        apt_repo = document.get("apt_repo")
        return _State(
            hosts=[LabHost.from_json(entry) for entry in document["hosts"]],
            ip_forward_before=None if before is None else int(before),
            apt_repo=None if apt_repo is None else AptRepo.from_json(apt_repo),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("ignoring unreadable %s: %s", STATE, error)
        return None


# --- status ------------------------------------------------------------------


def _host_status(host: LabHost) -> dict[str, Any]:
    alive = host.pid in lab_nspawn_pids(HOSTS_DIR, under=host.rootfs, boot_loops=True) and bool(
        lab_nspawn_pids(HOSTS_DIR, under=host.rootfs)
    )
    ssh_ok = False
    if alive and SSH_CONFIG.exists():
        try:
            ssh_ok = run(_ssh_argv(host.name, "true", 5), check=False, timeout=15).returncode == 0
        except LabError:
            ssh_ok = False
    return {
        "name": host.name,
        "flavour": host.flavour,
        "address": host.address,
        "pid": host.pid,
        "alive": alive,
        "ssh_ok": ssh_ok,
    }


# --- tearing down ------------------------------------------------------------


def _stop_host(host: LabHost, clean: bool = True) -> None:
    """Stop one host's nspawn (``clean``: a poweroff, else killed, for a tree removed next),
    kill whatever it left, remove its cgroups."""
    # The boot loop first: it would boot the host again if a reboot were under way.
    kill_processes(lab_nspawn_pids(HOSTS_DIR, under=host.rootfs, boot_loops=True))
    pids = lab_nspawn_pids(HOSTS_DIR, under=host.rootfs)
    if pids and clean:
        stop_processes(pids, STOP_GRACE_S)
    else:
        kill_processes(pids)
    namespaces = [host.netns] if host.netns in network.lab_netns() else []
    _kill_leftovers(cgroups.pids(host.name), namespaces)
    cgroups.remove(host.name)


def _kill_leftovers(cgroup_pids: list[int], namespaces: list[str]) -> None:
    """SIGKILL what a stopped (or killed) nspawn left in the lab's cgroups and namespaces."""
    leftovers = set(cgroup_pids)
    for ns in namespaces:
        leftovers |= set(network.netns_pids(ns))
    if leftovers:
        log.info("killing processes left behind by lab hosts: %s", sorted(leftovers))
        kill_processes(sorted(leftovers))


def _teardown() -> None:
    """Remove everything of the lab, whether recorded in state.json or only found by name."""
    state = _read_state()
    namespaces = network.lab_netns()
    names = {ns.removeprefix(NETNS_PREFIX) for ns in namespaces}
    if state is not None:
        names |= {host.name for host in state.hosts}
    if HOSTS_DIR.is_dir():
        names |= {entry.name for entry in HOSTS_DIR.iterdir()}

    repo.stop_server(REPO_SERVER_PID, REPO_CACHE)
    kill_processes(lab_nspawn_pids(HOSTS_DIR, boot_loops=True))  # no host boots again
    nspawn = lab_nspawn_pids(HOSTS_DIR)
    if nspawn:
        # Killed, not powered off: their trees are removed next, and an emulated host's
        # systemd never powers off within the grace (20 s lost at every teardown).
        log.info("killing systemd-nspawn %s (their trees are removed next)", nspawn)
        kill_processes(nspawn)
    _kill_leftovers(cgroups.pids(), namespaces)
    cgroups.remove()
    for ns in namespaces:
        network.delete_netns(ns)
    for link in network.lab_links():
        network.delete_link(link)

    binfmt.remove()
    recorded = network.delete_nft()
    if state is not None and state.ip_forward_before is not None:
        recorded = state.ip_forward_before
    if recorded is not None and network.read_ip_forward() != recorded:
        others = network.other_labs_netns() if recorded == 0 else []
        if others:  # their hosts still reach the registries through this machine
            log.info("leaving net.ipv4.ip_forward at 1: another lab still runs (%s)", ", ".join(others[:3]))
        else:
            network.write_ip_forward(recorded)

    if HOSTS_DIR.is_dir():
        # All hosts at once: a deployed host's tree (a venv, Docker's images) takes seconds
        # to remove, most of them waiting on the disk.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(_remove_host_dir, sorted(HOSTS_DIR.iterdir())))
    for name in sorted(names):
        remove_tree(NSPAWN_PROPAGATE_DIR / name, HOSTS_DIR)
    for path in (INVENTORY, SSH_CONFIG, KNOWN_HOSTS, STATE, REPO_SERVER_LOG):
        path.unlink(missing_ok=True)
    shutil.rmtree(WHEEL_CACHE, ignore_errors=True)
    shutil.rmtree(CLUSTER_KEYS, ignore_errors=True)


def _remove_host_dir(host_dir: Path) -> None:
    _remove_rootfs(host_dir / "rootfs")
    remove_tree(host_dir, HOSTS_DIR)


def _remove_rootfs(rootfs: Path) -> None:
    """Remove a host's rootfs and the image lock nspawn leaves for it in /run."""
    try:
        inode = rootfs.stat()
    except FileNotFoundError:
        return
    remove_tree(rootfs, HOSTS_DIR)
    (NSPAWN_LOCK_DIR / f"inode-{inode.st_dev}:{inode.st_ino}").unlink(missing_ok=True)


def _teardown_after_failure() -> None:
    try:
        _teardown()
    except Exception as error:  # the original failure matters more
        log.error("teardown after the failure failed too: %s", error)
