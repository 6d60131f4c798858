"""Cached Debian images, one per flavour, built with debootstrap.

An image is a root file system under ``CACHE_DIR/images/<flavour>-<key>``.
The key hashes everything that shapes the image: the suite, the packages,
the mirror, :data:`RECIPE_VERSION` and the customisation steps, so any change
builds a new image. Images hold no CA certificate of the controller's: the lab
inventory hands them to the deploy (``ca_certificates_extra``), as a fleet behind
a TLS-intercepting proxy would.

A build runs in ``CACHE_DIR/tmp`` and is renamed into ``images/`` only when
complete: a directory under ``images/`` is always a finished image.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .config import SSH_UID, SSH_USER
from .model import FLAVOURS, Flavour
from .system import LabError, remove_tree, run, tail, write_file

log = logging.getLogger("sparkrig.lab")

RECIPE_VERSION = 2

PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "ca-certificates",
    "iproute2",
    "sudo",
    "procps",
    "libpam-systemd",
    # A static busybox, to `docker import` a tiny test image inside the hosts.
    "busybox-static",
)

# Units that cannot work in a systemd-nspawn container and would fail the boot.
MASKED_UNITS: tuple[str, ...] = ("systemd-modules-load.service",)

DEBOOTSTRAP_TIMEOUT_S = 1200

# Debian 12's units that load credentials, and those that need a network namespace of
# their own: neither works under qemu-user emulation (foreign-architecture images).
EMULATION_NO_CREDENTIALS: tuple[str, ...] = (
    "procps.service",
    "systemd-firstboot.service",
    "systemd-sysctl.service",
    "systemd-sysusers.service",
    "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-setup.service",
)
EMULATION_MASKED_UNITS: tuple[str, ...] = ("e2scrub_reap.service",)

# network-manager brings udev. A lab host's /sys is the controller's and writable: a udevd
# (or its trigger) there would act on the controller's devices, so it never starts in the
# lab. What udev does on a Spark for the cluster ports is stood in for elsewhere (lab/dgxos.py).
UDEV_UNITS: tuple[str, ...] = (
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
)
# DGX OS: systemd-networkd installed, not running (NetworkManager renders netplan).
NETWORKD_UNITS: tuple[str, ...] = (
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
)


@dataclass(frozen=True)
class WriteFile:
    """Write ``content`` to ``path`` (absolute inside the image)."""

    path: str
    content: str
    mode: int = 0o644


@dataclass(frozen=True)
class RemoveFiles:
    """Delete the files matching ``pattern`` (a glob, absolute inside the image)."""

    pattern: str


@dataclass(frozen=True)
class Chroot:
    """Run ``argv`` chrooted into the image."""

    argv: tuple[str, ...]


@dataclass(frozen=True)
class Systemctl:
    """Run ``systemctl --root=IMAGE`` with ``argv``."""

    argv: tuple[str, ...]


Step = WriteFile | RemoveFiles | Chroot | Systemctl


def recipe_steps(flavour: Flavour, mirror: str) -> tuple[Step, ...]:
    """How a freshly debootstrapped tree becomes a lab image."""
    steps: list[Step] = [Systemctl(("mask", *MASKED_UNITS))]
    if flavour.ssh_service == "ssh.socket":
        steps += [Systemctl(("disable", "ssh.service")), Systemctl(("enable", "ssh.socket"))]
    if flavour.emulated:
        # Under qemu-user, systemd 252 cannot set up a unit's credentials ("Failed to set
        # up credentials: Invalid argument") nor its private network namespace: the units
        # that ask for them fail at boot. The credentials they load are optional; the
        # namespaced e2scrub_reap has nothing to do on the lab's file system.
        steps += [
            WriteFile(
                f"/etc/systemd/system/{unit}.d/sparkrig-lab-emulation.conf",
                "# sparkrig lab: qemu-user cannot set up credentials (lab/image.py)\n[Service]\nLoadCredential=\n",
            )
            for unit in EMULATION_NO_CREDENTIALS
        ]
        steps.append(Systemctl(("mask", *EMULATION_MASKED_UNITS)))
    if flavour.netplan_nm:
        steps += [Systemctl(("mask", *UDEV_UNITS)), Systemctl(("disable", *NETWORKD_UNITS))]
    steps += [
        # Empty: every host gets its own machine-id when it is made.
        WriteFile("/etc/machine-id", "", 0o444),
        RemoveFiles("/var/lib/dbus/machine-id"),
        # Host keys are made per host, never shared through the image.
        RemoveFiles("/etc/ssh/ssh_host_*"),
        # pam_env warns at every login without it.
        WriteFile("/etc/default/locale", "LANG=C.UTF-8\n"),
        WriteFile(
            "/etc/apt/sources.list",
            f"deb {mirror} {flavour.suite} main\ndeb {mirror} {flavour.suite}-updates main\n",
        ),
    ]
    steps += [
        Chroot(
            (
                "useradd",
                "--create-home",
                "--uid",
                str(SSH_UID),
                "--user-group",
                "--shell",
                "/bin/bash",
                SSH_USER,
            )
        ),
        # '*' is no valid password (no password login) yet not "locked" for sshd.
        Chroot(("usermod", "--password", "*", SSH_USER)),
        WriteFile(f"/etc/sudoers.d/{SSH_USER}", f"{SSH_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n", 0o440),
        Chroot(("visudo", "--check", "--file", f"/etc/sudoers.d/{SSH_USER}")),
        Chroot(("apt-get", "clean")),
    ]
    return tuple(steps)


def image_key(flavour: Flavour, mirror: str, steps: Sequence[Step]) -> str:
    """A short hash of everything that makes up an image."""
    recipe = {
        "suite": flavour.suite,
        "packages": list(PACKAGES) + list(flavour.extra_packages),
        "mirror": mirror,
        "recipe_version": RECIPE_VERSION,
        "steps": [repr(step) for step in steps],
    }
    if flavour.emulated:
        recipe["arch"] = flavour.arch
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def image_path(name: str, cache_dir: Path, mirror: str) -> Path:
    """Where flavour ``name``'s image is cached (flavours that share an image share it)."""
    flavour = FLAVOURS[name]
    key = image_key(flavour, mirror, recipe_steps(flavour, mirror))
    return cache_dir / "images" / f"{flavour.image_name}-{key}"


def missing_images(flavours: Sequence[str], cache_dir: Path, mirror: str) -> list[str]:
    """The images not built yet (``up`` builds them first), by name."""
    return sorted(
        {
            image_path(name, cache_dir, mirror).name.rsplit("-", 1)[0]
            for name in set(flavours)
            if not image_path(name, cache_dir, mirror).is_dir()
        }
    )


def ensure_images(flavours: Sequence[str], cache_dir: Path, mirror: str, hosts_dir: Path) -> dict[str, Path]:
    """The image of each flavour, building the missing ones in parallel."""
    wanted = {}
    for name in sorted(set(flavours)):
        flavour = FLAVOURS[name]
        wanted[name] = (flavour, recipe_steps(flavour, mirror), image_path(name, cache_dir, mirror))
    with _cache_lock(cache_dir):
        _remove_unfinished_builds(cache_dir, hosts_dir)
        # Flavours that share an image build it once.
        missing = {path: (flavour, steps, path) for flavour, steps, path in wanted.values() if not path.is_dir()}
        if missing:
            with ThreadPoolExecutor(max_workers=len(missing)) as pool:
                futures = [pool.submit(_build, *build, cache_dir, mirror, hosts_dir) for build in missing.values()]
                errors = [str(future.exception()) for future in futures if future.exception()]
            if errors:
                raise LabError("image build failed:\n" + "\n".join(errors))
    return {name: path for name, (_, _, path) in wanted.items()}


@contextlib.contextmanager
def _cache_lock(cache_dir: Path) -> Iterator[None]:
    """The image cache to this lab alone while it clears unfinished builds and builds: every lab
    (SPARKRIG_LAB_ID) shares the cache, and one lab's clean-up removed another's build in progress."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "build.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another lab's image build (%s)", cache_dir / "build.lock")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _remove_unfinished_builds(cache_dir: Path, hosts_dir: Path) -> None:
    tmp = cache_dir / "tmp"
    if tmp.is_dir():
        for leftover in tmp.iterdir():
            log.info("removing unfinished image build %s", leftover)
            remove_tree(leftover, hosts_dir)


def _build(
    flavour: Flavour,
    steps: Sequence[Step],
    final: Path,
    cache_dir: Path,
    mirror: str,
    hosts_dir: Path,
) -> None:
    (cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
    (cache_dir / "images").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cache_dir / "tmp", prefix=f"{final.name}."))
    root = work / "rootfs"
    log_path = cache_dir / f"build-{flavour.image_name}.log"
    log.info("building image %s (debootstrap %s %s, log %s)", final.name, flavour.suite, flavour.arch, log_path)
    started = time.monotonic()
    try:
        _debootstrap(flavour, root, mirror, log_path)
        for step in steps:
            _apply(step, root)
        root.rename(final)
    finally:
        remove_tree(work, hosts_dir)
    _prune_old_images(final, hosts_dir)
    log.info("image %s ready after %.0f s", final.name, time.monotonic() - started)


def _debootstrap(flavour: Flavour, root: Path, mirror: str, log_path: Path) -> None:
    suite = flavour.suite
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--arch={flavour.arch}",
        f"--include={','.join(PACKAGES + flavour.extra_packages)}",
        suite,
        str(root),
        mirror,
    ]
    with open(log_path, "w") as log_file:
        try:
            result = subprocess.run(argv, stdout=log_file, stderr=subprocess.STDOUT, timeout=DEBOOTSTRAP_TIMEOUT_S)
        except subprocess.TimeoutExpired as error:
            raise LabError(f"debootstrap {suite} timed out; see {log_path}") from error
    if result.returncode != 0:
        raise LabError(
            f"debootstrap {suite} failed (exit {result.returncode}); end of {log_path}:\n" + tail(log_path, 25)
        )


def _apply(step: Step, root: Path) -> None:
    try:
        if isinstance(step, WriteFile):
            target = root / step.path.lstrip("/")
            if target.is_symlink():
                target.unlink()
            write_file(target, step.content, step.mode)
        elif isinstance(step, RemoveFiles):
            for path in root.glob(step.pattern.lstrip("/")):
                path.unlink()
        elif isinstance(step, Chroot):
            run(["chroot", root, *step.argv])
        else:
            run(["systemctl", f"--root={root}", *step.argv])
    except (OSError, LabError) as error:
        raise LabError(f"image step {step} failed: {error}") from error


def _prune_old_images(current: Path, hosts_dir: Path) -> None:
    image = current.name.rsplit("-", 1)[0]
    for other in current.parent.glob(f"{image}-*"):
        if other != current and other.name.rsplit("-", 1)[0] == image:
            log.info("removing outdated image %s", other.name)
            remove_tree(other, hosts_dir)


def copy_image(image: Path, rootfs: Path) -> None:
    """Copy an image to a host's rootfs (a reflink where the file system can)."""
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    if rootfs.exists():
        raise LabError(f"{rootfs} exists already")
    run(["cp", "-a", "--reflink=auto", image, rootfs], timeout=600)
