"""
Swap controls: no swap now, nothing left that turns it on at boot, an fstab that still boots.

Why swap is off: on GB10 the CPU and the GPU share one 128 GB memory and GPU allocations
cannot be swapped out. Under memory pressure swap does not save the job, it only delays
and deepens a freeze of the whole box (SSH included) instead of an OOM kill that ends
the job and keeps the OS (open-gpu-kernel-modules issue 1358, dgx-spark-playbooks issue 97).
Turning swap off is the Spark community's practice, not an NVIDIA statement.

What each control expects is worked out here from the host, independently of the code
that converges (operations/swap/).
"""

from __future__ import annotations

import shlex

import pytest

from .reads import need

FSTAB = "/etc/fstab"
# Swap units, and the services of zram-tools, zram-config, zram-swap and systemd-zram-generator.
UNIT_PATTERNS = (
    "*.swap",
    "zramswap.service",
    "zram-config.service",
    "zram-swap.service",
    "systemd-zram-setup@*.service",
)
RUNNING = ("active", "activating", "reloading")


@pytest.fixture
def swap_off(settings) -> None:
    if not settings["swap_disable"]:
        pytest.skip("swap_disable is False for this host: sparkrig leaves its swap alone")


@need
def state(r) -> dict | None:
    """What the swap controls read of the host (nothing where sparkrig leaves swap alone)."""
    if not r.settings["swap_disable"]:
        return None
    patterns = " ".join(shlex.quote(pattern) for pattern in UNIT_PATTERNS)
    return {
        "swaps": r.file("/proc/swaps"),
        "virt": r.run("systemd-detect-virt --container"),
        "markers": {path: r.path(path) for path in ("/.dockerenv", "/run/.containerenv")},
        "fstab": r.file(FSTAB),
        "findmnt": r.run("findmnt --fstab --types swap --noheadings --raw --output FSTYPE,SOURCE"),
        "verify": r.run("LC_ALL=C findmnt --verify --verbose", sudo=True),
        "systemd": r.path("/run/systemd/system"),
        "units": {
            listing: r.run(f"systemctl {listing} --no-legend --no-pager --full {patterns}")
            for listing in ("list-units --all --plain", "list-unit-files")
        },
    }


@pytest.fixture
def systemd(read, swap_off) -> None:
    if not read(state)["systemd"].is_directory:
        pytest.skip("this host does not run systemd (no /run/systemd/system): it has no units")


def _container(found) -> str | None:
    """The container the host runs in (systemd-detect-virt, else Docker's or Podman's
    marker file), None on real hardware or in a VM."""
    result = found["virt"]
    if result.rc == 0:
        return result.stdout.strip()
    markers = {"/.dockerenv": "docker", "/run/.containerenv": "podman"}
    return next((name for path, name in markers.items() if found["markers"][path].exists), None)


def _systemctl(found, listing: str) -> list[list[str]]:
    # list-unit-files exits 1 when nothing matches: an empty listing, not a failure.
    result = found["units"][listing]
    assert result.rc in (0, 1), result.stderr
    return [line.split() for line in result.stdout.splitlines() if line.strip()]


def test_no_swap_is_active(read, swap_off):
    """Protects against the freeze itself: while a swap area is active, memory pressure on
    GB10 (GPU memory included, which cannot be swapped) turns into swap thrashing that
    hangs the box, SSH included, instead of an OOM kill of the job."""
    found = read(state)
    areas = [line.split()[0] for line in found["swaps"].check().splitlines()[1:]]
    container = _container(found) if areas else None
    if container:
        pytest.skip(
            f"this host is a {container} container: /proc/swaps lists the swap of the machine "
            f"running it ({', '.join(areas)}), which only that machine can turn off"
        )
    assert areas == [], f"swap is active: {', '.join(areas)}"


def test_fstab_has_no_active_swap_entry(read, swap_off):
    """Protects against swap coming back at the next boot: an uncommented fstab entry of
    type swap (UUID=, LABEL=, PARTUUID=, a partition or a swap file such as /swap.img) is
    turned on again by systemd's fstab-generator and by `swapon -a`."""
    active = []
    found = read(state)
    found["fstab"].check()
    for line in found["fstab"].stdout_bytes.split(b"\n"):
        fields = line.removesuffix(b"\r").split()
        if len(fields) >= 3 and not fields[0].startswith(b"#") and fields[2] == b"swap":
            active.append(line.decode(errors="replace"))
    assert active == [], f"uncommented swap entries in {FSTAB}: {active}"
    # libmount's reading (octal escapes decoded, as swapon and systemd >= 254 read it).
    listed = found["findmnt"]
    libmount = [line for line in listed.stdout.splitlines() if line.split(" ")[0] == "swap"]
    assert libmount == [], f"libmount reads swap entries in {FSTAB}: {libmount}"


def test_fstab_passes_findmnt_verify(read, swap_off):
    """Protects against a box that no longer boots: sparkrig rewrote the fstab, and a
    broken one drops systemd into emergency mode, with no SSH to repair it. In a
    container the disks an fstab names are absent by design: there, and only there,
    errors that merely say a source or a mount point is unreachable are accepted."""
    found = read(state)
    result = found["verify"]
    assert result.rc in (0, 1), f"findmnt --verify did not run (exit {result.rc}): {result.stderr}"
    if result.rc == 0:
        return
    report = result.stdout + result.stderr
    assert "\n0 parse errors," in "\n" + result.stderr.strip(), f"findmnt cannot parse {FSTAB}:\n{report}"
    errors = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("[E]")]
    container = _container(found)
    if container:
        errors = [error for error in errors if not error.startswith("[E] unreachable")]
    assert errors == [], f"findmnt --verify fails on {FSTAB} (container: {container}):\n{report}"


def test_no_swap_or_zram_unit_is_active(read, swap_off, systemd):
    """Protects against swap that a unit keeps or brings on: a swap unit (fstab-generated,
    gpt-auto, a hand-written one) or a zram service (zram-tools, zram-config,
    systemd-zram-generator) running now."""
    running = [fields[0] for fields in _systemctl(read(state), "list-units --all --plain") if fields[2] in RUNNING]
    assert running == [], f"swap or zram units running: {running}"


def test_swap_and_zram_unit_files_are_masked(read, swap_off, systemd):
    """Protects against swap revived at the next boot or by a dependency: every swap and
    zram unit file systemd knows is masked (a link to /dev/null), so neither swap.target
    nor another unit nor an administrator's `systemctl start` can start it."""
    unmasked = [
        f"{fields[0]} ({fields[1]})" for fields in _systemctl(read(state), "list-unit-files") if fields[1] != "masked"
    ]
    assert unmasked == [], f"swap or zram unit files not masked: {unmasked}"
