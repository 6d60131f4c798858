"""
Debian packages, installed the one way every concern installs them.

A freshly booted box is often busy with apt already: unattended-upgrades and
apt-daily hold the dpkg and apt locks for minutes after boot. apt-get fails at
once when a lock is held, which would fail a fleet rollout on every box that
happens to be upgrading. So sparkrig waits, a bounded time, for every lock to be
free; past that it fails the host with a message naming the lock and the process
holding it (other hosts go on). A dpkg run that was interrupted (a box that lost
power mid-deploy) is completed with ``dpkg --configure -a`` before the install,
as apt itself would demand.

Concerns decide from their own facts whether a package is missing; this
operation only runs when one is, so a converged host costs nothing here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from . import host_output, host_settings, rendering
from .settings import Setting, declare, int_range

TIMEOUT_KEY = "packages_dpkg_lock_timeout_s"
DEFAULT_TIMEOUT_S = 300

# The locks apt and dpkg take (lists for `apt-get update`, archives for downloads).
LOCKS = (
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/apt/lists/lock",
    "/var/cache/apt/archives/lock",
)

# Waits until none of the locks is held (read from /proc/locks: apt and dpkg take
# POSIX record locks, which `flock` cannot see), at most $1 seconds; then names the
# holder and fails. Arguments: timeout, then the lock files.
WAIT_FOR_LOCKS = rendering.script("sparkrig/wait-for-apt-locks.sh")


# Finishes an interrupted dpkg run. A package whose unpacking was cut off (power lost
# mid-deploy) is "half-installed, reinstall required": dpkg --configure -a passes over it
# and the next install fails on it ("package is in a very bad inconsistent state"), so apt
# reinstalls such packages; apt itself refuses to run while dpkg's journal is pending ("dpkg
# was interrupted, you must manually run 'dpkg --configure -a'"), so dpkg replays it first
# (what depends on the broken package may fail to configure then: the last run settles it).
# Arguments: apt-get and its options.
COMPLETE_DPKG = rendering.script("sparkrig/complete-dpkg.sh")


def install_command(
    packages: Sequence[str], timeout_s: int, no_recommends: bool = True, only_upgrade: bool = False
) -> StringCommand:
    """The one remote command: wait for the locks, finish an interrupted dpkg run,
    fresh lists, install (``only_upgrade``: upgrade those installed, install none).
    apt also waits (the rest of the timeout) should another process take the lock
    between the check and the install. No packages: the lists only."""
    apt = ["DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y", "-o", f"DPkg::Lock::Timeout={timeout_s}"]
    # A conffile sparkrig changed (e.g. /etc/default/earlyoom) is kept on a reinstall, never prompted for.
    keep = ["-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
    install = [
        *keep,
        "install",
        *(["--no-install-recommends"] if no_recommends else []),
        *(["--only-upgrade"] if only_upgrade else []),
    ]
    return StringCommand(
        "sh",
        "-c",
        QuoteString(WAIT_FOR_LOCKS),
        "sparkrig-wait-for-apt",
        str(timeout_s),
        *LOCKS,
        "&&",
        "DEBIAN_FRONTEND=noninteractive",
        "sh",
        "-c",
        QuoteString(COMPLETE_DPKG),
        "sparkrig-complete-dpkg",
        *apt[1:],
        *keep,
        "&&",
        *apt,
        "update",
        *(["&&", *apt, *install, *[QuoteString(p) for p in packages]] if packages else []),
    )


def locked(argv: Sequence[str], timeout_s: int | None = None) -> StringCommand:
    """``argv`` (a dpkg or apt command, such as ``apt-mark hold``) once the locks are free,
    waiting as :func:`install_command` does (``packages_dpkg_lock_timeout_s`` by default)."""
    timeout = _timeout() if timeout_s is None else timeout_s
    return StringCommand(
        "sh",
        "-c",
        QuoteString(WAIT_FOR_LOCKS),
        "sparkrig-wait-for-apt",
        str(timeout),
        *LOCKS,
        "&&",
        *[QuoteString(word) for word in argv],
    )


@operation()
def installed(
    packages: Sequence[str], no_recommends: bool = True, only_upgrade: bool = False, optional: bool = False
) -> Iterator[StringCommand]:
    """
    Install Debian packages the caller found missing, with fresh package lists, waiting a
    bounded time for the dpkg and apt locks.

    + packages: the package names (the caller decided from its facts that some are missing)
    + no_recommends: install without recommended packages
    + only_upgrade: upgrade those of ``packages`` that are installed, install none
    + optional: a failed install says so and fails nothing (what only reports, never what acts)

    **Example:**

    .. code:: python

        packages.installed(name="Install earlyoom", packages=["earlyoom"])
    """
    command = install_command(packages, _timeout(), no_recommends, only_upgrade)
    if optional:
        said = f"sparkrig: {' '.join(packages)} could not be installed (apt said why above); the deploy goes on without"
        command = StringCommand("{", command, ";", "}", "||", "echo", QuoteString(said))
    yield command


def _timeout() -> int:
    """``packages_dpkg_lock_timeout_s`` of the current host, from its settings."""
    return host_settings.current().get(TIMEOUT_KEY, DEFAULT_TIMEOUT_S)


SETTINGS = (
    Setting(
        TIMEOUT_KEY,
        DEFAULT_TIMEOUT_S,
        "How long a package install waits for the dpkg and apt locks, in seconds, before it "
        "fails that host (other hosts go on) with the lock and the process holding it. A freshly "
        "booted box is busy with unattended-upgrades for minutes. 0: fail at once.",
        int_range(0, 3600, "seconds"),
    ),
)
declare(__name__, SETTINGS)


class Candidates(FactBase):
    """
    Returns, for each package named, the version apt would install now (its candidate, pins
    counted: a version pinned below 0 is none), None where apt has none: the package is not in
    the package lists (an offline box whose lists lack it: "Unable to locate package") or every
    version of it is pinned away. No lists are fetched: it reads what ``apt-get update`` left.

    .. code:: python

        {"fwupd": "2.0.20-1~deb12u2", "missing-package": None}
    """

    def command(self, packages: Sequence[str]) -> StringCommand:
        return StringCommand("LC_ALL=C", "apt-cache", "policy", "--", *[QuoteString(p) for p in packages])

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found: dict = {}
        name = None
        for line in output:
            if any(ord(c) < 32 or ord(c) == 127 for c in line):
                raise ValueError(f"a control character in apt-cache's line {line[:80]!r}")
            if line and not line.startswith(" ") and line.endswith(":"):
                name = line[:-1]
                found[name] = None
            elif line.strip().startswith("Candidate: ") and name is not None:
                version = line.strip().removeprefix("Candidate: ")
                if not _VERSION.fullmatch(version):
                    raise ValueError(f"apt-cache's candidate of {name} is {version[:80]!r}")
                found[name] = None if version == "(none)" else version
        return found

    @staticmethod
    def default() -> dict:
        return {}


# A Debian version as apt prints it, or apt's "(none)".
_VERSION = re.compile(r"\(none\)|[0-9A-Za-z.+~:_-]{1,128}")
