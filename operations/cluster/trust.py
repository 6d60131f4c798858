"""Clusters: SSH trust between the nodes. One key pair per node, made on the controller once
per install of the node (reinstalled, new host keys: a new pair replaces the old); a node's
private half goes to its cluster user, every node's public half to every node's
authorized_keys (written as that user, from that node's addresses only), and every node's
host keys are pinned."""

from __future__ import annotations

import fcntl
import hashlib
import os
import posixpath
import re
import secrets
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation

from sparkrig import atomic, rendering

from .facts import KEY_FILE, KNOWN_HOSTS, MARKER, SSH_CONFIG

# Runs at once take turns deciding a node's pair: this lock within a run, whose hosts plan in
# greenlets (pyinfra's CLI patches threading, so a greenlet waiting here lets the others run;
# a bare flock would block them all while its holder waits on ssh-keygen), flock between runs.
_DECIDING = threading.Lock()
STAGE = "/var/lib/sparkrig/stage"  # root's: files on their way to a directory of another user
# Checks a new ssh_config.d file as ssh will read it. For `sh -c SCRIPT NAME NEW`.
VERIFY_SSH_CONFIG = rendering.script("cluster/verify-ssh-config.sh")


# The files ----------------------------------------------------------------------------------


def render_known_hosts(nodes: Sequence[Mapping[str, Any]]) -> str:
    return rendering.render("cluster/known_hosts.j2", nodes=nodes)


def render_ssh_config(nodes: Sequence[Mapping[str, Any]], user: str) -> str:
    patterns = ",".join(address for node in nodes for address in node["addresses"])
    return rendering.render(
        "cluster/ssh_config.conf.j2", user=user, hosts=patterns, key=KEY_FILE, known_hosts=KNOWN_HOSTS
    )


def authorized_lines(nodes: Sequence[Mapping[str, Any]], name: str) -> list[str]:
    """The authorized_keys lines of the cluster: each node's own key (``node["public"]``),
    from that node's addresses only, no forwarding (``restrict``) but a terminal for
    interactive use. A node removed from the cluster takes its line, so its key, with it."""
    lines = []
    for node in nodes:
        key = " ".join(node["public"].split()[:2])
        sources = ",".join(node["addresses"])
        lines.append(f'from="{sources}",restrict,pty {key} {MARKER}{name}:{node_label(node["name"])}')
    return lines


# The controller's key pair -----------------------------------------------------------------


def node_label(node: str) -> str:
    """An inventory name as a key directory's name and an authorized_keys comment: letters,
    digits, '.', '_' and '-' kept, anything else '_' (with a short hash, so two names differ)."""
    label = re.sub(r"[^A-Za-z0-9._-]", "_", node)
    if label != node or label in (".", ".."):
        label = f"{label}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"
    return label


def controller_key(key_dir: str, name: str, node: str, host_keys: Sequence[str]) -> tuple[bytes, str]:
    """The key pair of ``node`` in cluster ``name`` on the controller (private bytes, public
    line): ``KEY_DIR/NAME/NODE/id_ed25519`` (0600) in 0700 directories, beside ``host_keys``,
    the node's SSH host keys it was made for (as the controller's own connection read them).
    Each node has its own pair, so a node removed from the cluster loses its login to the
    others. A node whose host keys are no longer those (reinstalled: its old disk held the
    old private half) gets a new pair, which replaces the old one here, so in every
    authorized_keys the run writes; the first call of a run decides, the others find it made.
    No host keys (none read): the pair is kept as it is. Runs at once take turns (a lock)."""
    directory = Path(key_dir).expanduser() / name / node_label(node)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory.parent, 0o700)
    os.chmod(directory, 0o700)
    private, record = directory / "id_ed25519", directory / "host_keys"
    pinned = "".join(f"{key}\n" for key in sorted(set(host_keys)))
    with _DECIDING, open(directory / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recorded = record.read_text() if record.exists() else None
        if not private.exists() or (pinned and recorded is not None and recorded != pinned):
            with tempfile.TemporaryDirectory(dir=directory) as tmp:
                new = Path(tmp) / "id_ed25519"
                subprocess.run(
                    [
                        "ssh-keygen",
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        f"{MARKER}{name}:{node_label(node)}",
                        "-f",
                        str(new),
                    ],
                    check=True,
                    capture_output=True,
                )
                os.replace(new, private)
            recorded = None
        if pinned and recorded is None:  # a pair made before this record existed is kept
            staged = directory / ".host_keys.new"
            staged.write_text(pinned)
            os.replace(staged, record)
    os.chmod(private, 0o600)
    public = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], check=True, capture_output=True, text=True)
    return private.read_bytes(), public.stdout.strip()


# Installed on the node ----------------------------------------------------------------------


class Secret(bytes):
    """Bytes that never show in a log (pyinfra's debug output prints commands' arguments)."""

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


def _stage_secret(state, host, directory: str, data: bytes) -> bool:
    """Upload ``data`` as the login user into ``directory``, made 0700 first (mkdir fails if
    anything is there): pyinfra's own uploads pass through a world-readable temp file."""
    ok, output = host.connector.run_shell_command(StringCommand("umask 077 && mkdir -m 700", QuoteString(directory)))
    if not ok:
        logger.error(
            f"{host.print_prefix}sparkrig: cannot make a private directory for the cluster key: {output.stderr}"
        )
        return False
    return bool(host.connector.put_file(BytesIO(data), f"{directory}/key"))


@operation()
def private_key(dest: str, key: bytes, user: str, group: str):
    """
    Install a private key as a 0600 file of ``user``, never passing through a file others may read.

    + dest: where, in a directory of root's
    + key: the private key (OpenSSH format)
    + user: its owner
    + group: its group
    """
    staged = f"/tmp/sparkrig-key-{secrets.token_hex(8)}"
    temp = atomic.temp_path(dest)
    yield FunctionCommand(_stage_secret, (staged, Secret(key)), {})
    yield StringCommand(
        "install -d -m 755 -o root -g root",
        QuoteString(posixpath.dirname(dest)),
        "&& install -m 600 -o",
        QuoteString(user),
        "-g",
        QuoteString(group),
        QuoteString(f"{staged}/key"),
        QuoteString(temp),
        "&& ssh-keygen -y -f",
        QuoteString(temp),
        ">/dev/null && mv -f",
        QuoteString(temp),
        QuoteString(dest),
        "; s=$?; rm -rf",
        QuoteString(staged),
        QuoteString(temp),
        "; exit $s",
    )


# As the cluster user: their authorized_keys keeps every line but sparkrig's cluster lines,
# then gets the staged file's. For `sh -c SCRIPT NAME HOME STAGED`.
PUT_AUTHORIZED = rendering.script("cluster/put-authorized.sh.j2", marker=MARKER)


@operation()
def authorized_key(user: str, home: str, lines: Sequence[str]):
    """
    Make ``lines`` the cluster lines of ``user``'s ``~/.ssh/authorized_keys``, written as them.

    + user: the cluster user
    + home: their home directory
    + lines: the authorized_keys lines (their comments start with ``sparkrig-cluster:``)
    """
    staged = f"{STAGE}/authorized-{secrets.token_hex(8)}"
    yield StringCommand("install -d -m 755 -o root -g root", QuoteString(STAGE))
    yield atomic.Upload(BytesIO("".join(f"{line}\n" for line in lines).encode()), staged)
    yield StringCommand(
        "chmod 644",
        QuoteString(staged),
        "&& runuser -u",
        QuoteString(user),
        "-- sh -c",
        QuoteString(PUT_AUTHORIZED),
        "sparkrig",
        QuoteString(home),
        QuoteString(staged),
        "; s=$?; rm -f",
        QuoteString(staged),
        "; exit $s",
    )


def converge_trust(
    settings: Mapping[str, Any], node: Mapping[str, Any], files: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]
) -> None:
    """The trust step of the cluster's deploy: this node's private key for its cluster
    user, every node's host keys pinned, ssh's configuration between the nodes, and each
    node's public key in the cluster user's authorized_keys."""
    name, user = settings["cluster_name"], settings["cluster_user"]
    key, _public = controller_key(settings["cluster_key_dir"], name, host.name, node["host_keys"])
    group = node["user"]["group"]
    if not atomic.up_to_date(files.get(KEY_FILE), key, mode=0o600, user=user, group=group):
        private_key(name=f"Cluster key of {user} ({KEY_FILE}, 0600)", dest=KEY_FILE, key=key, user=user, group=group)
    root_files = {
        KNOWN_HOSTS: ("Every node's pinned host keys", render_known_hosts(nodes), None),
        SSH_CONFIG: (
            "ssh uses the cluster key and the pinned host keys between nodes",
            render_ssh_config(nodes, user),
            ("sh", "-c", VERIFY_SSH_CONFIG, "verify"),
        ),
    }
    # host.loop: each file keeps its place (and its row in pyinfra's table) on every host.
    for dest, (title, content, validate) in host.loop(root_files.items()):
        atomic.file_if_changed(
            name=f"{title} ({dest})", dest=dest, current=files.get(dest), content=content, validate=validate
        )
    lines = authorized_lines(nodes, name)
    if node["user"]["authorized"] != lines:
        authorized_key(
            name=f"Each node's own cluster key in {user}'s authorized_keys, from that node's addresses only",
            user=user,
            home=node["user"]["home"],
            lines=lines,
        )
