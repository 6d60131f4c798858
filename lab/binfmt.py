"""Foreign-architecture hosts: the lab's own binfmt_misc entry for qemu-user.

An aarch64 host (the ``gb10`` flavour) runs on an x86_64 controller through
qemu-user emulation: the kernel hands every aarch64 ELF to
``qemu-aarch64-static`` (Debian's ``qemu-user-static``). The lab registers an
entry of its own, ``sparkrig-lab<ID>-aarch64``, rather than relying on
``qemu-user-static``'s, because the lab needs three flags Debian's entry lacks
or may lack:

- ``F`` (fix binary): the interpreter is opened at registration, so it works
  inside the hosts' root file systems, which do not hold it;
- ``C`` (credentials, implies ``O``): setuid programs get the binary's
  credentials, not the interpreter's; without it ``sudo`` in the guest fails
  with "effective uid is not 0";
- ``P`` (preserve argv[0]): dockerd re-executes itself as ``docker-untar`` to
  unpack images, and fails ("dockerd accepts no argument(s)") without it.

The newest entry that matches wins, so an existing ``qemu-aarch64`` entry of
the machine is left alone. ``down`` removes the lab's entry, and only it; the
``binfmt_misc`` file system stays mounted (other users of it may exist).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from .config import LAB_ID
from .system import LabError, run

log = logging.getLogger("sparkrig.lab")

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
INTERPRETER = "qemu-aarch64-static"
ENTRY = f"sparkrig-lab{LAB_ID}-aarch64"
FLAGS = "PCF"
# How the kernel lists those flags (C implies O).
LISTED_FLAGS = "flags: POCF"

# An aarch64 ELF executable or shared object (e_machine 0xb7), as qemu-user-static's
# own entry matches it.
MAGIC = r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"

# The controller architecture's name in Debian, and the foreign ones the lab emulates.
NATIVE = {"x86_64": "amd64", "aarch64": "arm64"}
EMULATED = {"arm64"}


def registration(interpreter: str, name: str = ENTRY) -> str:
    """The line written to ``binfmt_misc/register`` for the lab's entry."""
    return f":{name}:M::{MAGIC}:{MASK}:{interpreter}:{FLAGS}"


def native_arch() -> str:
    """The controller's architecture in Debian's words (``amd64``)."""
    machine = os.uname().machine
    return NATIVE.get(machine, machine)


def needs_emulation(arch: str) -> bool:
    """Whether a host of Debian architecture ``arch`` runs here only through qemu-user."""
    return arch != native_arch()


def missing(arches: set[str]) -> list[str]:
    """Why hosts of these architectures cannot run here (empty when they can)."""
    foreign = {arch for arch in arches if needs_emulation(arch)}
    problems = [f"no emulation of {arch} on {native_arch()} in the lab" for arch in sorted(foreign - EMULATED)]
    if foreign & EMULATED and shutil.which(INTERPRETER) is None:
        problems.append(f"{INTERPRETER} is missing (Debian package qemu-user-static)")
    return problems


def ensure() -> None:
    """Register the lab's aarch64 entry (mounting binfmt_misc first if needed)."""
    interpreter = shutil.which(INTERPRETER)
    if interpreter is None:
        raise LabError(f"{INTERPRETER} is missing (Debian package qemu-user-static)")
    if not (BINFMT_DIR / "register").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT_DIR])
    entry = BINFMT_DIR / ENTRY
    if entry.exists():
        lines = entry.read_text().split("\n")
        if "enabled" in lines and f"interpreter {os.path.realpath(interpreter)}" in lines and LISTED_FLAGS in lines:
            return
        remove()
    log.info("registering binfmt_misc entry %s (%s, flags %s)", ENTRY, interpreter, FLAGS)
    try:
        (BINFMT_DIR / "register").write_text(registration(os.path.realpath(interpreter)))
    except OSError as error:
        raise LabError(f"cannot register binfmt_misc entry {ENTRY}: {error}") from error


def remove() -> None:
    """Remove the lab's entry, if registered."""
    entry = BINFMT_DIR / ENTRY
    if entry.exists():
        log.info("removing binfmt_misc entry %s", ENTRY)
        entry.write_text("-1")
