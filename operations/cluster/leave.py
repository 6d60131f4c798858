"""Clusters: a host taken out of its cluster loses what a node holds: its link (the interfaces
reconfigured without it), key, trust, environment and check files, and the cluster's lines in
its former cluster user's authorized_keys."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import messages, rendering

from .facts import MARKER, NETPLAN_FILE, NETWORKD, NETWORKD_DIR, NETWORKD_PREFIX, NM_FILE
from .link import LINK_DIR, pending_check, render_link_apply

# As the former cluster user: sparkrig's cluster lines leave their authorized_keys.
# For `sh -c SCRIPT NAME HOME`.
DROP_AUTHORIZED = rendering.script("cluster/drop-authorized.sh.j2", marker=MARKER)


@operation()
def leave(files: Sequence[str], key_owner: str | None):
    """
    Take a host out of its cluster: remove the files a node holds, and the cluster key's
    line from its user's authorized_keys (written as them).

    + files: the cluster files still there
    + key_owner: the user the cluster key belonged to (None: no key left)
    """
    messages.detail(f"removing {', '.join(files)}")
    if key_owner and key_owner != "root":
        yield StringCommand(
            "h=$(getent passwd",
            QuoteString(key_owner),
            '| cut -d: -f6) && [ -n "$h" ] && runuser -u',
            QuoteString(key_owner),
            "-- sh -c",
            QuoteString(DROP_AUTHORIZED),
            'sparkrig "$h" || true',
        )
    links = [f for f in files if f in (NETPLAN_FILE, NM_FILE) or f.startswith(f"{NETWORKD_DIR}/")]
    if not links or links == [NM_FILE]:
        yield StringCommand("rm -f", *[QuoteString(f) for f in files])
        if links:
            yield StringCommand("if systemctl is-active -q NetworkManager; then systemctl reload NetworkManager; fi")
        return
    # The link's interfaces alone are reconfigured (their files gone: unmanaged, addresses
    # dropped), never while another link's change waits to be loaded.
    interfaces = [
        f[len(f"{NETWORKD_DIR}/{NETWORKD_PREFIX}") : -len(".network")] for f in links if f.startswith(NETWORKD_DIR)
    ]
    netplan = NETPLAN_FILE in links
    names = ([f"10-netplan-{i}.*" for i in interfaces] + ["10-netplan-*"] * netplan) or ["-"]
    apply = render_link_apply([*interfaces, *(["$n"] if netplan else [])], netplan, NM_FILE in links)
    yield StringCommand(
        f'set -e; d={LINK_DIR}; install -d -m 755 -o root -g root /var/lib/sparkrig; rm -rf "$d"; mkdir -m 700 "$d"; '
        + pending_check([f"{NETWORKD_PREFIX}*.network", *names])
        + "; "
        + (
            f"n=$(sed -n 's/^    \\([A-Za-z0-9_.-]*\\):$/\\1/p' {NETPLAN_FILE} | tr '\\n' ' '); export n; "
            if netplan
            else ""
        )
        + " ".join(["rm -f", *[shlex.quote(f) for f in files]])
        + "; "
        + f'if systemctl is-active -q {NETWORKD}; then printf %s {shlex.quote(apply)} >"$d/apply.sh"; '
        + 'sh "$d/apply.sh"; cat "$d/apply.log"; [ "$(cat "$d/applied")" = 0 ]; fi'
    )
