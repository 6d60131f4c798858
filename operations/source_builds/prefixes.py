"""Source builds of kind prefix: root checks a built archive and installs it into
/opt/sparkrig/builds/NAME/KEY, then points NAME/current at it."""

from __future__ import annotations

import json
import posixpath
from io import BytesIO

from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import atomic, host_output, user_files
from sparkrig.prefix import ARCHIVE, PREFIX_ROOT, current, installed_dir, installed_stamp, unpacker_source

from .cache import INCOMING, PRODUCT_LIMIT, PRODUCT_TIMEOUT_S, cache_root, cached
from .catalogue import wheelhouse_dir
from .facts import SourceBuilds


@operation()
def install_prefix(build_name: str, key: str, cache: str, owner: str = "root"):
    """
    Unpack a prefix build's archive from the wheelhouse into ``/opt/sparkrig/builds/NAME/KEY``
    (root's) and point ``/opt/sparkrig/builds/NAME/current`` at it; nothing while no archive
    is built. Root copies the archive out as its owner, checks it against its sha256 (the
    controller's, when the controller holds it) and checks every member before it unpacks
    (sparkrig/unpack_prefix.py): a member it refuses fails this host, and nothing is installed.

    + build_name: the build's name
    + key: its stamp key
    + cache: the controller's cache directory (its stamp pins the sha256 when it has one)
    + owner: the wheelhouse's owner, who reads the archive out of it
    """
    name = build_name
    found = host_output.direct_fact(SourceBuilds, builds=((name, key, ""),), venv="")
    stamp = ((found or {}).get(name) or {}).get("stamp")
    if (found or {}).get(name, {}).get("state") != "built" or not stamp or "archive" not in stamp:
        return
    pinned = cached(cache_root(cache), name, key)
    sha256 = (pinned or stamp)["sha256"]
    incoming = f"{INCOMING}/{name}-{key}.{ARCHIVE}"
    final, record = installed_dir(name, key), installed_stamp(name, key)
    parent = posixpath.dirname(final)
    record_new = f"{parent}/.{key}.json.new"
    # Root's directories, made anew if anything else is in their place; the owner's archive
    # read by the owner through the one reader (root never opens a path in their directory;
    # a FIFO, a device, a link or a file over PRODUCT_LIMIT fails this host) into a root-owned file.
    top = posixpath.dirname(PREFIX_ROOT)
    yield StringCommand(
        # /opt/sparkrig holds the venv too: made where missing, never chowned; refused unless root's.
        "mkdir -p -m 755",
        QuoteString(top),
        '&& { [ -n "$(find',
        QuoteString(top),
        '-maxdepth 0 -user root ! -perm /022)" ] || { echo',
        QuoteString(
            f"sparkrig: source build {name}: {top} is not root's alone (owned or writable by another user):"
            " root installs no prefix below it"
        ),
        ">&2; exit 1; }; }",
        "&& install -d -m 755 -o root -g root",
        QuoteString(INCOMING),
        QuoteString(PREFIX_ROOT),
        QuoteString(parent),
        "&& rm -rf",
        QuoteString(incoming),
        QuoteString(f"{final}.new"),
        QuoteString(record_new),
        "&& install -m 600 -o root -g root /dev/null",
        QuoteString(incoming),
        "&&",
        user_files.copy_out(
            f"{wheelhouse_dir(name, key)}/{ARCHIVE}",
            incoming,
            PRODUCT_LIMIT,
            owner,
            PRODUCT_TIMEOUT_S,
            f"source build {name}",
        ),
    )
    public = {k: v for k, v in stamp.items() if k != "sha256"}
    yield atomic.Upload(BytesIO((json.dumps({**public, "sha256": sha256}, sort_keys=True) + "\n").encode()), record_new)
    yield StringCommand(
        "command -v python3 >/dev/null || { echo",
        QuoteString(f"sparkrig: source build {name}: root checks its archive with python3, which this host lacks"),
        ">&2; exit 1; };",
        "python3 -I -c",
        QuoteString(unpacker_source()),
        QuoteString(incoming),
        QuoteString(sha256),
        QuoteString(f"{final}.new"),
        QuoteString(f"source build {name}"),
        "|| { rm -rf",
        QuoteString(f"{final}.new"),
        QuoteString(incoming),
        QuoteString(record_new),
        "; exit 1; };",
        "rm -rf",
        QuoteString(final),
        QuoteString(record),
        "&& mv",
        QuoteString(f"{final}.new"),
        QuoteString(final),
        "&& chmod 644",
        QuoteString(record_new),
        "&& chown root:root",
        QuoteString(record_new),
        "&& mv",
        QuoteString(record_new),
        QuoteString(record),
        "&& ln -sfn",
        QuoteString(key),
        QuoteString(f"{current(name)}.new"),
        "&& mv -T",
        QuoteString(f"{current(name)}.new"),
        QuoteString(current(name)),
        "&& rm -f",
        QuoteString(incoming),
    )


# $1 the root-owned incoming directory, $2 the wheelhouse entry, $3 the wheel, $4 its sha256.
