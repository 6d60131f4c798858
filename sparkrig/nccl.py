"""
NCCL's builds on a host, and whether a cluster's nodes load the same one.

Two-node serving hangs when the nodes (or the processes of one node) load NCCL builds that
differ, even at the same version: pip's ``nvidia-nccl-cu13`` and the system's ``libnccl2``
both say 2.27.7 and are not the same library. :class:`NcclBuilds` reads, as root and without
running anything of the venv (its owner controls every file there), each ``libnccl.so.2`` a
job may load: the venv's wheel (``site-packages/nvidia/nccl/lib/``, named by its
``.dist-info``), the system's (``/usr/lib/*-linux-gnu/``, dpkg's ``libnccl2`` version) and a
prefix source build named ``nccl``. A build's identity is its library's sha256 and the version
line NCCL embeds in it ("NCCL version 2.27.7+cuda13.0"), both from one pass of the one
bounded reader (sparkrig/user_files.py).
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from typing import Any

from pyinfra.api import FactBase, StringCommand

from . import host_output, prefix, rendering, user_files

# A wheel's libnccl.so.2 is 200 to 300 MB (nvidia-nccl-cu13 2.27.7: see the unit tests'
# recorded figures); a larger file, or a sparse one claiming to be, is refused unread.
LIBRARY_LIMIT = 1 << 30
READ_TIMEOUT_S = 120  # one library, read and hashed (a 300 MB one: about a second)
PREFIX_LIBRARY = f"{prefix.current('nccl')}/lib/libnccl.so.2"
SCRIPT = rendering.script("sparkrig/nccl-builds.sh")
# What a job's environment may set to load another libnccl.so.2 than the one torch loads
# from its own venv (by its path): the dynamic linker's paths and vLLM's own choice.
LOADER_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "VLLM_NCCL_SO_PATH")

_DIST_INFO = re.compile(r"nvidia_nccl_(cu[0-9]{1,3})-([A-Za-z0-9][A-Za-z0-9.+!_]{0,63})\.dist-info")
_LINE = re.compile(r"NCCL version ([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,4})([^ ]{0,64})")
_SHA = re.compile(r"[0-9a-f]{64}")
_WHY = {1: "missing, not a regular file, or a link on its way", 2: f"over {LIBRARY_LIMIT} bytes", 124: "timed out"}


class NcclBuilds(FactBase):
    """
    Returns each NCCL library a job on this host may load, by where it comes from: the
    venv's wheel (``venv nvidia-nccl-cu13``), the system's (``system libnccl2``) and a
    prefix build (``prefix nccl``); an empty mapping where there is none. A library that
    cannot be read (a link, a FIFO, a file over :data:`LIBRARY_LIMIT`, a read past its
    time) or whose version line is missing or holds a control character fails the host,
    naming the library and why.

    .. code:: python

        {"venv nvidia-nccl-cu13": {
            "version": "2.28.9", "sha256": "1c8618b8...", "line": "NCCL version 2.28.9+cuda13.0",
            "library": "/opt/sparkrig/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"},
         "system libnccl2": {
            "version": "2.28.3-1+cuda13.0", "sha256": "...", "line": "NCCL version 2.28.3+cuda13.0",
            "library": "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"}}
    """

    reading_timeout_s = 3 * READ_TIMEOUT_S  # three libraries at most

    def command(self, venv: str, prefix_library: str = PREFIX_LIBRARY) -> StringCommand:
        return StringCommand(
            " ".join(
                shlex.quote(word)
                for word in (
                    "sh",
                    "-c",
                    SCRIPT,
                    "sparkrig-nccl",
                    venv,
                    user_files.USER_READ,
                    str(LIBRARY_LIMIT),
                    str(READ_TIMEOUT_S),
                    prefix_library,
                )
            )
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for line in output:
            words = line.split(" ")
            if len(words) != 9 or words[0] != "build" or words[1] not in ("venv", "system", "prefix"):
                raise ValueError(f"unexpected line {host_output.printable(line[:80])!r}")
            kind = words[1]
            name, version, library = (host_output.field(w, f"NCCL's {kind} build") for w in words[2:5])
            what = f"NCCL's {kind} build {_shown(library)}"
            if kind == "venv":
                match = _DIST_INFO.fullmatch(name)
                if match is None:
                    raise ValueError(f"the venv's .dist-info {host_output.printable(name)[:80]!r} names no NCCL wheel")
                name, version = f"nvidia-nccl-{match[1]}", match[2]
            status, sha = words[5], words[6]
            said = host_output.printable(_decoded(words[8], what).strip().replace("\n", "; "))
            if status != "0":
                why = _WHY.get(int(status) if status.isdigit() else -1, f"exit {status}")
                said = said.replace(f"sparkrig: {host_output.printable(library)} ", "it ")  # the path comes last
                raise ValueError(f"NCCL's {kind} library not read: {said or why} ({_shown(library)})")
            found[f"{kind} {name}"] = {
                "version": host_output.text(version, f"{what}: its version", 128) or None,
                "library": library,
                "sha256": _sha(sha, what),
                "line": version_line(_decoded(words[7], what), what),
            }
        return found

    @staticmethod
    def default() -> dict:
        return {}


def _shown(library: str) -> str:
    """A library's path as a message names it: its end (a host's message is cut at 200)."""
    path = host_output.printable(library)
    return path if len(path) <= 60 else "..." + path[-57:]


def _decoded(value: str, what: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", "surrogateescape")
    except ValueError as error:
        raise ValueError(f"{what}: not a field of sparkrig's ({error})") from None


def _sha(value: str, what: str) -> str:
    if not _SHA.fullmatch(value):
        raise ValueError(f"{what}: no sha256 ({host_output.printable(value[:80])!r})")
    return value


def version_line(lines: str, what: str) -> str:
    """The version line NCCL embeds in its library ("NCCL version 2.28.9+cuda13.0": the
    script passes on each line that starts "NCCL version " and a digit, and the same library
    also says "NCCL version 2.28.9 compiled with CUDA 13.0"). Each line is checked: a
    control character fails the host, naming the library. ValueError where there is no
    such line, or two that differ (no library of NCCL's)."""
    checked = [host_output.text(line, f"{what}: its version line", 256) for line in lines.split("\n") if line]
    found = {line for line in checked if _LINE.fullmatch(line)}
    if len(found) != 1:
        shown = ", ".join(repr(host_output.printable(line)) for line in sorted(found)) or "none"
        raise ValueError(f"{what}: not one 'NCCL version' line ({shown}): not NCCL's library")
    return found.pop()


def describe(build: Mapping[str, Any] | None) -> str:
    """A build as messages name it: its version line and the start of its sha256."""
    if build is None:
        return "none"
    return f"{build['line']} (sha256 {build['sha256'][:12]})"


def same(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether two builds are one: the same library, byte for byte (None: no such build)."""
    if a is None or b is None:
        return a is b
    return a["sha256"] == b["sha256"]


def differences(mine: str, builds: Mapping[str, Any], peer: str, theirs: Mapping[str, Any]) -> list[str]:
    """Where node ``peer``'s builds differ from node ``mine``'s, one line each naming both."""
    return [
        f"{key}: {peer} has {describe(theirs.get(key))}, {mine} has {describe(builds.get(key))}"
        for key in sorted(set(builds) | set(theirs))
        if not same(builds.get(key), theirs.get(key))
    ]


def line_version(build: Mapping[str, Any]) -> str:
    """The version a build's line names ("2.27.7+cuda13.0" of "NCCL version 2.27.7+cuda13.0")."""
    return build["line"].removeprefix("NCCL version ")


def twins(builds: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Pairs of this host's builds at one version that are not one build (the venv's wheel
    and the system's libnccl2, both 2.27.7+cuda13.0, different libraries)."""
    keys = sorted(builds)
    return [
        (a, b)
        for i, a in enumerate(keys)
        for b in keys[i + 1 :]
        if line_version(builds[a]) == line_version(builds[b]) and not same(builds[a], builds[b])
    ]


def loader_variables(env: Mapping[str, str]) -> list[str]:
    """The variables of a job's environment (the cluster env file's) that can make a process
    load another libnccl.so.2 than the venv's own."""
    return [name for name in LOADER_VARIABLES if env.get(name)]


def cluster_differences(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Where a cluster's nodes (node -> its builds) differ: each node against the first."""
    names = list(nodes)
    return [line for peer in names[1:] for line in differences(names[0], nodes[names[0]], peer, nodes[peer])]
