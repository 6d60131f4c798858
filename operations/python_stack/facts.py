"""Python stack: the state of uv and of one virtualenv, read in one command."""

from __future__ import annotations

import base64
import json
import re
import shlex
import urllib.parse
from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version
from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output, rendering, user_files
from sparkrig.python_wheels import lock_entries, normalise
from sparkrig.venv import LOCK_LIMIT, UV, UV_CACHE

UV_LINK = "/usr/local/bin/uv"
OFFLINE_DIR = "/var/lib/sparkrig/python-wheels"  # the controller's wheels, on a host
URL_LIMIT = 1 << 16  # a direct_url.json is a few hundred bytes
LIST_TIMEOUT_S = 30  # the venv's listing, killed after this long (a hung file system)

STACK_SCRIPT = rendering.script(
    "python_stack/stack.sh.j2",
    uv=UV,
    link=UV_LINK,
    cache=UV_CACHE,
    offline=OFFLINE_DIR,
    read_cfg=user_files.user_read('"$v/pyvenv.cfg"', 1 << 16),
    read_lock=user_files.user_read('"$s/requirements.lock"', LOCK_LIMIT),
    dists=shlex.quote(rendering.script("python_stack/dists.sh")),
    reader=shlex.quote(user_files.USER_READ),
    url_limit=URL_LIMIT,
    list_timeout=LIST_TIMEOUT_S,
)
# A .dist-info directory's name: the distribution's name (PEP 427: its runs of - _ . as one _)
# and version (PEP 440's characters).
_DIST_INFO = re.compile(r"([A-Za-z0-9][A-Za-z0-9._]*)-([A-Za-z0-9][A-Za-z0-9.+!_]{0,63})\.dist-info")


def dist_info(entry: str) -> tuple[str, str] | None:
    """The distribution (normalised) and version a ``.dist-info`` directory's name says; None
    for a name that says none."""
    match = _DIST_INFO.fullmatch(entry)
    return (normalise(match[1]), match[2]) if match else None


def major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


class PythonStack(FactBase):
    """
    Returns the state of uv and of one virtualenv, read in one command: uv's version,
    whether ``/usr/local/bin/uv`` is taken, whether ``python3 -m venv`` can make a tool
    environment, the venv's Python, owner and usability, the sha256 of its lock, the
    wheel files in ``wheels`` (the controller's wheels, with ``python_offline``), and
    whether :data:`OFFLINE_DIR` is there at all (``offline_dir``). What the venv holds,
    from its records alone (nothing of the venv runs: its owner controls it, and this runs
    as root): ``dists``, each ``.dist-info`` directory's distribution (normalised) and
    version; ``urls``, the URL each one's ``direct_url.json`` names; ``dists_unreadable``
    when a link is on the way; ``bad_dists``, entries that name no distribution.
    :func:`plan_clean` compares them with the lock.

    .. code:: python

        {"uv": "0.13.9", "link_exists": True,
         "venv_module": True, "cache_owner": "spark", "owner_exists": True, "occupied": True, "python": "3.12.3",
         "owner": "spark", "usable": True, "lock": "9a...", "wheels": [], "offline_dir": False,
         "dists": {"torch": "2.11.0+cu130", ...}, "urls": {"vllm": "https://..."},
         "dists_unreadable": False, "bad_dists": []}
    """

    def command(self, venv: str, owner: str, wheels: str = "") -> StringCommand:
        return host_output.encoded(
            StringCommand(
                "v=",
                QuoteString(venv),
                "; o=",
                QuoteString(owner),
                "; w=",
                QuoteString(wheels),
                ";\n",
                STACK_SCRIPT,
                _separator="",
            )
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        return self.parse(host_output.decoded(output))

    def parse(self, output: list[str]) -> dict:
        """The reading from the command's decoded lines."""
        found = self.default()
        for line in output:
            key, _, value = line.partition(" ")
            if key in (
                "link_exists",
                "venv_module",
                "usable",
                "root_python",
                "occupied",
                "owner_exists",
                "offline_dir",
            ):
                found[key] = value == "yes"
            elif key == "wheel":
                found["wheels"].append(value)
            elif key == "dists":
                if value == "unreadable":
                    found["dists_unreadable"] = True
                    continue
                names = base64.b64decode(value, validate=True).decode("utf-8", "surrogateescape")
                for entry in filter(None, names.split("\0")):
                    dist = dist_info(entry)
                    if dist:
                        found["dists"][dist[0]] = dist[1]
                    else:
                        found["bad_dists"].append(host_output.printable(entry[:200]))  # the owner's name, escaped
            elif key == "url":
                entry, _, record = value.partition(" ")
                name = base64.b64decode(entry, validate=True).decode("utf-8", "surrogateescape")
                dist = dist_info(name)  # another name is in bad_dists already
                if dist:
                    found["urls"][dist[0]] = _direct_url(base64.b64decode(record, validate=True))
            elif key == "python":  # pyvenv.cfg's, the venv owner's: escaped, then no version we want
                found[key] = host_output.printable(value) or None
            elif key in found and key not in ("dists", "urls", "bad_dists", "dists_unreadable"):
                found[key] = value or None
        return found

    @staticmethod
    def default() -> dict:
        return {
            "uv": None,
            "link_exists": False,
            "venv_module": False,
            "cache_owner": None,
            "owner_exists": False,
            "occupied": False,
            "python": None,
            "owner": None,
            "usable": False,
            "root_python": False,
            "lock": None,
            "wheels": [],
            "offline_dir": False,
            "dists": {},
            "urls": {},
            "dists_unreadable": False,
            "bad_dists": [],
        }


def _direct_url(record: bytes) -> str | None:
    """The URL a ``direct_url.json`` names (None for one that is no such record)."""
    try:
        url = json.loads(record.decode("utf-8")).get("url")
    except (ValueError, AttributeError):
        return None
    return url if isinstance(url, str) else None


def locked(lock: str) -> dict[str, tuple[str | None, str | None]]:
    """What a lock installs: {normalised name: (version, URL or None)} (a URL's version from
    its wheel file's name)."""
    wanted: dict[str, tuple[str | None, str | None]] = {}
    for name, lines in lock_entries(lock):
        first = lines[0].rstrip("\\").split(";")[0].strip()
        if " @ " in first:
            url = first.split(" @ ", 1)[1].split()[0]  # a built wheel's line holds its --hash too
            wheel = urllib.parse.unquote(url.rsplit("/", 1)[-1])
            parts = wheel.split("-")
            wanted[name] = (parts[1] if wheel.endswith(".whl") and len(parts) >= 5 else None, url)
        else:
            wanted[name] = (first.partition("==")[2].strip() or None, None)
    return wanted


def _same_version(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    if a == b:
        return True
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return False


def plan_clean(found: Mapping[str, Any], lock: str) -> bool:
    """Whether the venv holds exactly what ``lock`` installs, as its records say: every
    distribution at its locked version (one locked by URL installed from that URL), and no
    other. A sync changes nothing then (a reinstall uv repeats at every sync, a wheel whose
    WHEEL file names another platform, is no change here)."""
    if found["dists_unreadable"] or found["bad_dists"]:
        return False
    wanted = locked(lock)
    have = found["dists"]
    if set(have) != set(wanted):
        return False
    for name, (version, url) in wanted.items():
        if not _same_version(have[name], version):
            return False
        installed_url = found["urls"].get(name)
        if (url is None) != (installed_url is None):
            return False
        if url is not None and urllib.parse.unquote(url) != urllib.parse.unquote(installed_url):
            return False
    return True
