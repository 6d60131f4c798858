"""A cgroup of its own for each lab host.

Without systemd as PID 1 on the controller, nspawn must run with
``--keep-unit --register=no``: it then puts the container in ``payload`` (and
itself in ``supervisor``) below the cgroup it was started in. Two hosts
started from the same cgroup would share one ``payload`` tree, and each
container's systemd would manage (and kill, or wait forever for) the other's
units. So every host's nspawn starts in ``sparkrig-lab/NAME`` of each cgroup
hierarchy systemd uses (the cgroup2 one and the v1 ``name=systemd`` one).

These cgroups also find every process a host left behind, whatever its
namespaces (e.g. Docker containers inside a host).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .config import CGROUP_PARENT
from .system import LabError, unescape_mount_path


def systemd_hierarchies(mountinfo: str) -> list[Path]:
    """Mount points of the cgroup2 hierarchy and of the v1 ``name=systemd`` one."""
    found = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, source = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(source) < 3:
            continue
        fstype, super_options = source[0], source[2].split(",")
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in super_options):
            found.append(Path(unescape_mount_path(fields[4])))
    return found


def _hierarchies() -> list[Path]:
    return systemd_hierarchies(Path("/proc/self/mountinfo").read_text())


def host_cgroups(host_name: str, leaf: str = "") -> list[Path]:
    """The host's cgroup directory in each hierarchy (or its ``leaf`` below it; made if missing)."""
    paths = [
        hierarchy / CGROUP_PARENT / host_name / leaf if leaf else hierarchy / CGROUP_PARENT / host_name
        for hierarchy in _hierarchies()
    ]
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
    return paths


def pids(host_name: str | None = None) -> list[int]:
    """Processes in a host's cgroups (all lab hosts' when ``host_name`` is None)."""
    found: set[int] = set()
    for hierarchy in _hierarchies():
        top = hierarchy / CGROUP_PARENT
        if host_name is not None:
            top = top / host_name
        for directory, _, files in os.walk(top):
            if "cgroup.procs" in files:
                found |= _read_pids(Path(directory) / "cgroup.procs")
    return sorted(found)


def remove(host_name: str | None = None) -> None:
    """Remove a host's (or every lab) cgroup tree; its processes must be gone."""
    for hierarchy in _hierarchies():
        top = hierarchy / CGROUP_PARENT
        if host_name is not None:
            top = top / host_name
        for directory in _deepest_first(top):
            try:
                directory.rmdir()
            except OSError as error:
                raise LabError(f"cannot remove cgroup {directory}: {error}") from error


def _deepest_first(top: Path) -> Sequence[Path]:
    if not top.is_dir():
        return []
    return [Path(directory) for directory, _, _ in os.walk(top, topdown=False)]


def _read_pids(procs: Path) -> set[int]:
    try:
        return {int(pid) for pid in procs.read_text().split() if pid != "0"}
    except OSError:
        return set()
