"""Low-level helpers: checked commands, files, processes, mounts, locking.

Every command goes through :func:`run`, which raises :class:`LabCommandError`
(with the command's stderr) when it fails.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .model import is_lab_boot, is_lab_nspawn, is_lab_repo_server, nspawn_directory

log = logging.getLogger("sparkrig.lab")

# Programs the lab runs on the controller, and the Debian package that has each.
REQUIRED_PROGRAMS: dict[str, str] = {
    "systemd-nspawn": "systemd-container",
    "systemctl": "systemd",
    "debootstrap": "debootstrap",
    "nft": "nftables",
    "ip": "iproute2",
    "sysctl": "procps",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "chroot": "coreutils",
    "umount": "mount",
    "dpkg-deb": "dpkg",
    "gpg": "gnupg",
    "gpg-agent": "gnupg",
    "gpgconf": "gnupg",
    "git": "git",  # the source-build project's repository (lab/sourcebuild.py)
    "qemu-aarch64-static": "qemu-user-static",  # the emulated aarch64 host (lab/binfmt.py)
}

_ANSI = re.compile(r"\x1b\[[0-9;:?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says what and why."""


class LabCommandError(LabError, subprocess.CalledProcessError):
    """A command failed; unlike CalledProcessError, str() includes its stderr."""

    def __init__(self, returncode: int, cmd: Sequence[str], stdout: str, stderr: str) -> None:
        subprocess.CalledProcessError.__init__(self, returncode, cmd, stdout, stderr)

    def __str__(self) -> str:
        summary = subprocess.CalledProcessError.__str__(self)
        detail = (self.stderr or self.stdout or "").strip()
        return f"{summary}\n{detail}" if detail else summary


def missing_requirements() -> list[str]:
    """Why the lab cannot run here (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append(f"the lab needs root (running as uid {os.geteuid()})")
    for program, package in REQUIRED_PROGRAMS.items():
        if shutil.which(program) is None:
            problems.append(f"{program} is missing (Debian package {package})")
    return problems


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    timeout: float | None = 300,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output as text; raise LabCommandError if it fails."""
    args = [os.fspath(arg) for arg in argv]
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input, check=False)
    except FileNotFoundError as error:
        raise LabError(f"cannot run {args[0]}: {error}") from error
    except subprocess.TimeoutExpired as error:
        raise LabError(f"timed out after {timeout}s: {' '.join(args)}") from error
    if check and result.returncode != 0:
        raise LabCommandError(result.returncode, args, result.stdout, result.stderr)
    return result


def write_file(path: Path, content: str, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
    """Atomically replace ``path`` (never following a symlink there) with ``content``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tail(path: Path, lines: int = 40) -> str:
    """The last non-blank lines of a log, without terminal escape codes ('' if unreadable)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line for line in _ANSI.sub("", text).splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


@contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` so two lab commands never interleave."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- processes -------------------------------------------------------------

# Popen objects of the nspawn processes this Python process started, so that
# they are reaped (not left as zombies) and never garbage-collected while running.
_children: dict[int, subprocess.Popen[bytes]] = {}


# sh -ec JOIN_THEN_EXEC sh CGROUP_PROCS... -- COMMAND...: join the cgroups, then become COMMAND.
JOIN_THEN_EXEC = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    log_path: Path,
    env: dict[str, str],
    cgroup_dirs: Sequence[Path],
) -> int:
    """Start a long-running command in its own session and in ``cgroup_dirs``; its PID.

    Output goes to ``log_path``. A shell joins the cgroups, then execs the
    command, so the PID is the command's and it starts inside its cgroups.
    """
    join_then_exec = JOIN_THEN_EXEC
    procs = [os.fspath(directory / "cgroup.procs") for directory in cgroup_dirs]
    with open(log_path, "wb") as log_file:
        child = subprocess.Popen(
            ["sh", "-ec", join_then_exec, "sh", *procs, "--", *map(os.fspath, argv)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
    _children[child.pid] = child
    return child.pid


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    if pid <= 0:
        return False
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        _children.pop(pid, None)
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    """A process's argv ([] if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def lab_nspawn_pids(hosts_dir: Path, under: Path | None = None, boot_loops: bool = False) -> list[int]:
    """Live systemd-nspawn processes booting a rootfs below ``hosts_dir`` (and ``under``); with
    ``boot_loops``, the boot loops around them instead (lab/model.py is_lab_boot)."""
    found = []
    matches = is_lab_boot if boot_loops else is_lab_nspawn
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        argv = cmdline(pid)
        if not matches(argv, hosts_dir) or not pid_alive(pid):
            continue
        directory = nspawn_directory(argv)
        if under is None or (directory and Path(directory).is_relative_to(under)):
            found.append(pid)
    return sorted(found)


def lab_repo_server_pids(repo_cache: Path, pid_file: Path) -> list[int]:
    """Live apt repository servers of the lab: serving below ``repo_cache``, or in ``pid_file``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and is_lab_repo_server(cmdline(int(entry.name)), repo_cache):
            found.add(int(entry.name))
    try:
        recorded = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        recorded = 0
    # Whatever it serves: a pid file may outlive a change of SPARKRIG_LAB_CACHE.
    if recorded > 0 and is_lab_repo_server(cmdline(recorded), Path("/")):
        found.add(recorded)
    return sorted(pid for pid in found if pid_alive(pid))


def stop_processes(pids: Sequence[int], grace: float) -> None:
    """SIGTERM ``pids``, wait up to ``grace`` seconds, then SIGKILL what is left."""
    _signal_all(pids, signal.SIGTERM)
    if not _wait_gone(pids, grace):
        stubborn = [pid for pid in pids if pid_alive(pid)]
        log.warning("SIGKILL to processes still alive after %.0f s: %s", grace, stubborn)
        kill_processes(stubborn)


def kill_processes(pids: Sequence[int]) -> None:
    """SIGKILL ``pids`` and wait until they are gone."""
    _signal_all(pids, signal.SIGKILL)
    if not _wait_gone(pids, 10):
        raise LabError(f"processes survive SIGKILL: {[pid for pid in pids if pid_alive(pid)]}")


def _wait_gone(pids: Sequence[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(pid_alive(pid) for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def _signal_all(pids: Sequence[int], signum: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


# --- mounts and removal ----------------------------------------------------


def unescape_mount_path(field: str) -> str:
    """Decode the octal escapes (``\\040`` for a space...) of a mountinfo path."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def mounts_below(mountinfo: str, path: Path) -> list[str]:
    """Mount points at or below ``path`` in a mountinfo text, deepest first."""
    found = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        mount_point = unescape_mount_path(fields[4])
        if Path(mount_point).is_relative_to(path):
            found.add(mount_point)
    return sorted(found, key=lambda point: (point.count("/"), point), reverse=True)


def remove_tree(path: Path, hosts_dir: Path) -> None:
    """``rm -rf`` a lab tree, once no nspawn uses it and nothing is mounted below it."""
    if not path.exists() and not path.is_symlink():
        return
    users = lab_nspawn_pids(hosts_dir, under=path)
    if users:
        raise LabError(f"not removing {path}: systemd-nspawn {users} still runs on it")
    for mount_point in mounts_below(Path("/proc/self/mountinfo").read_text(), path):
        log.warning("lazily unmounting leftover mount %s", mount_point)
        run(["umount", "--lazy", mount_point])
    run(["rm", "-rf", "--one-file-system", "--", path])


# Each lab host's systemd, journald, logind, udev-less daemons and Docker take inotify
# instances out of root's budget (the hosts share the controller's uid 0), about 10 each;
# fs.inotify.max_user_instances defaults to 128, so a few labs at once run out, and a host
# then boots "degraded" with mount units failed ("Failed to allocate inotify"), or not at all.
INOTIFY_PER_HOST = 16
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def inotify_instances(uid: int = 0) -> int:
    """inotify instances held now by processes of ``uid``."""
    count = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            count += sum(1 for fd in (proc / "fd").iterdir() if os.readlink(fd) == "anon_inode:inotify")
        except OSError:  # gone, or not ours to read
            continue
    return count


def inotify_limit_for(limit: int, in_use: int, hosts: int) -> int | None:
    """The limit ``hosts`` more lab hosts need (a multiple of 128), or None when ``limit`` will do."""
    needed = in_use + INOTIFY_PER_HOST * hosts
    return None if limit >= needed else -(-needed // 128) * 128


def ensure_inotify_instances(hosts: int) -> None:
    """Raise root's inotify instance limit where the lab's hosts would exhaust it (never lower it;
    not restored by ``down``: other labs may be running)."""
    limit = int(INOTIFY_LIMIT.read_text())
    raised = inotify_limit_for(limit, inotify_instances(), hosts)
    if raised is not None:
        INOTIFY_LIMIT.write_text(f"{raised}\n")
        log.info("lab: fs.inotify.max_user_instances raised from %d to %d for %d hosts", limit, raised, hosts)
