"""Swap off: the fstab editor, systemd's unit names, the facts, the fstab check, the plan."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import shutil
import subprocess

import pytest
from pyinfra.api import State
from pyinfra.api.exceptions import FactProcessError, PyinfraError
from pyinfra.connectors.fake import FakeConnector

from sparkrig.operations import swap as sw
from sparkrig.operations.swap import facts as sw_facts
from sparkrig.operations.swap import operations as sw_operations
from sparkrig.settings import problems, resolve
from tests.unit import pyinfra_fake
from tests.unit.pyinfra_fake import plan

# --- recorded outputs of SwapSources' command -------------------------------------
#
# NSPAWN_SEEDED and NSPAWN_CONVERGED: a Debian 13 (systemd 257, util-linux 2.41)
# systemd-nspawn container booted from the lab's image, run as root. Its fstab was
# seeded with a Spark-like root entry, the stock /swap.img (tab separated) and a swap
# partition by UUID; stand-ins for zram-tools' zramswap.service (enabled, running) and
# systemd-zram-generator's systemd-zram-setup@.service (zram0 running, a config in
# /usr/lib/systemd), and a hand-written /etc/systemd/system/hand.swap. SEEDED is before,
# CONVERGED after `pyinfra -y` ran swap() over SSH (as a sudoer, like the lab). The same
# scenario on Debian 12 (systemd 252, util-linux 2.38) printed byte-identical output.
# A container ignores fstab swap entries (no generated swap units, none in /proc/swaps).
SEEDED_FSTAB = (
    b"# /etc/fstab: static file system information.\n"
    b"UUID=0a3407de-014b-458b-b5c1-848e92a327a3 / ext4 defaults 0 1\n"
    b"/swap.img\tnone\tswap\tsw\t0\t0\n"
    b"UUID=5b1c7c43-64e4-4d2a-9f6e-0b7c2d1e9a10 none swap sw,nofail 0 0\n"
)
SWAPS_HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"
NSPAWN_SEEDED = [
    "## swaps",
    SWAPS_HEADER,
    "## fstab",
    "644 root root",
    base64.b64encode(SEEDED_FSTAB).decode(),
    "## libmount",
    "{",
    '   "filesystems": [',
    "      {",
    '         "source": "/swap.img",',
    '         "fstype": "swap"',
    "      },{",
    '         "source": "UUID=5b1c7c43-64e4-4d2a-9f6e-0b7c2d1e9a10",',
    '         "fstype": "swap"',
    "      }",
    "   ]",
    "}",
    "## container",
    "systemd-nspawn",
    "## systemd",
    "## unit-files",
    "systemd-zram-setup@.service static   -",
    "zramswap.service            enabled  enabled",
    "hand.swap                   disabled enabled",
    "## units",
    "systemd-zram-setup@zram0.service loaded active exited Stand-in for zram-generator's setup of /dev/zram0",
    "zramswap.service                 loaded active exited Stand-in for zram-tools' zramswap",
    "## admin-unit-files",
    "hand.swap",
    "## zram-generator",
    "/usr/lib/systemd/zram-generator.conf",
]
UUID_UNIT = r"dev-disk-by\x2duuid-5b1c7c43\x2d64e4\x2d4d2a\x2d9f6e\x2d0b7c2d1e9a10.swap"
NSPAWN_CONVERGED = [
    "## swaps",
    SWAPS_HEADER,
    "## fstab",
    "644 root root",
    "IyAvZXRjL2ZzdGFiOiBzdGF0aWMgZmlsZSBzeXN0ZW0gaW5mb3JtYXRpb24uClVVSUQ9MGEzNDA3ZGUtMDE0Yi00NThiLWI1"
    "YzEtODQ4ZTkyYTMyN2EzIC8gZXh0NCBkZWZhdWx0cyAwIDEKIyBzcGFya3JpZyBzd2FwIG9mZjogL3N3YXAuaW1nCW5vbmUJ"
    "c3dhcAlzdwkwCTAKIyBzcGFya3JpZyBzd2FwIG9mZjogVVVJRD01YjFjN2M0My02NGU0LTRkMmEtOWY2ZS0wYjdjMmQxZTlh"
    "MTAgbm9uZSBzd2FwIHN3LG5vZmFpbCAwIDAK",
    "## libmount",
    "## container",
    "systemd-nspawn",
    "## systemd",
    "## unit-files",
    "systemd-zram-setup@.service                                               masked enabled",
    "zramswap.service                                                          masked enabled",
    UUID_UNIT + " masked enabled",
    "hand.swap                                                                 masked enabled",
    "swap.img.swap                                                             masked enabled",
    "## units",
    "zramswap.service masked inactive dead zramswap.service",
    "## admin-unit-files",
    "## zram-generator",
    "/usr/lib/systemd/zram-generator.conf",
]
# This machine: Debian 12 in Docker, no systemd as PID 1, no swap.
DOCKER_NO_SYSTEMD = [
    "## swaps",
    SWAPS_HEADER,
    "## fstab",
    "644 root root",
    "IyBVTkNPTkZJR1VSRUQgRlNUQUIgRk9SIEJBU0UgU1lTVEVNCg==",
    "## libmount",
    "## container",
    "docker",
    "## admin-unit-files",
    "## zram-generator",
]
# A stock Spark, assembled (no lent machine has swap and systemd): NSPAWN_SEEDED's fstab
# without the UUID entry, /swap.img active in /proc/swaps in the kernel's format
# (mm/swapfile.c, swap_show), and the unit systemd's fstab-generator makes of it, listed
# the way the recorded listings are.
SPARK_FSTAB = SEEDED_FSTAB.rsplit(b"UUID=5b1c", 1)[0]
SPARK_ACTIVE = [
    "## swaps",
    SWAPS_HEADER,
    "/swap.img                               file\t\t16777212\t0\t\t-2",
    "## fstab",
    "644 root root",
    base64.b64encode(SPARK_FSTAB).decode(),
    "## libmount",
    '{"filesystems": [{"source": "/swap.img", "fstype": "swap"}]}',
    "## container",
    "none",
    "## systemd",
    "## unit-files",
    "swap.img.swap generated -",
    "## units",
    "swap.img.swap loaded active active /swap.img",
    "## admin-unit-files",
    "## zram-generator",
]


def with_fstab(output: list[str], content: bytes) -> list[str]:
    """A recorded output with another fstab in it (libmount's view cleared)."""
    out = list(output)
    out[out.index("## fstab") + 2] = base64.b64encode(content).decode()
    start, end = out.index("## libmount") + 1, out.index("## container")
    return out[:start] + out[end:]


# --- the fact -----------------------------------------------------------------------


def test_fact_parses_a_seeded_container():
    assert sw_facts.SwapSources().parse(NSPAWN_SEEDED) == {
        "active": [],
        "fstab": {"content": SEEDED_FSTAB, "mode": 0o644, "user": "root", "group": "root"},
        "fstab_link": None,
        "libmount_swap_sources": ["/swap.img", "UUID=5b1c7c43-64e4-4d2a-9f6e-0b7c2d1e9a10"],
        "container": "systemd-nspawn",
        "systemd": True,
        "unit_files": {"systemd-zram-setup@.service": "static", "zramswap.service": "enabled", "hand.swap": "disabled"},
        "units": {"systemd-zram-setup@zram0.service": "active", "zramswap.service": "active"},
        "admin_unit_files": ["hand.swap"],
        "zram_generator_configs": ["/usr/lib/systemd/zram-generator.conf"],
    }


def test_fact_parses_a_host_without_systemd():
    found = sw_facts.SwapSources().parse(DOCKER_NO_SYSTEMD)
    assert found["fstab"]["content"] == b"# UNCONFIGURED FSTAB FOR BASE SYSTEM\n"
    assert (found["systemd"], found["unit_files"], found["units"]) == (False, {}, {})
    assert (found["active"], found["container"]) == ([], "docker")


def test_fact_parses_active_swap_in_the_kernels_format():
    found = sw_facts.SwapSources().parse(SPARK_ACTIVE)
    assert found["active"] == [
        {"filename": "/swap.img", "type": "file", "size_kib": 16777212, "used_kib": 0, "priority": -2}
    ]
    assert found["container"] is None
    line = r"/mnt/my\040swap\040file" + "          file\t\t1048572\t\t0\t\t-3"
    (area,) = sw_facts.SwapSources().parse(["## swaps", SWAPS_HEADER, line])["active"]
    assert area["filename"] == "/mnt/my swap file"


@pytest.mark.parametrize(
    ("lines", "container"),
    [(["none"], None), (["systemd-nspawn"], "systemd-nspawn"), (["docker"], "docker"), ([], None)],
    ids=["bare metal or VM", "nspawn", "docker (marker file, no systemd-detect-virt)", "nothing printed"],
)
def test_fact_reads_the_container(lines, container):
    assert sw_facts.SwapSources().parse(["## container", *lines])["container"] == container


def test_fact_without_fstab():
    assert sw_facts.SwapSources().parse(["## swaps", "## fstab", "## libmount"])["fstab"] is None
    assert sw_facts.SwapSources().default()["fstab"] is None


def test_fact_command_run_here_reads_this_machine():
    """The real command here (as whoever runs the tests): the exact fstab bytes come back."""
    result = subprocess.run(
        ["sh", "-c", sw_facts.SwapSources().command().get_raw_value()], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    found = sw_facts.SwapSources().process(result.stdout.splitlines())
    with open("/etc/fstab", "rb") as fstab:
        assert found["fstab"]["content"] == fstab.read()
    with open("/proc/swaps") as swaps:
        assert len(found["active"]) == len(swaps.read().splitlines()) - 1


def test_zram_units_and_configs_are_found_in_a_real_tree_run_here(tmp_path, monkeypatch):
    """The fact's real shell against a real tree (not recorded output): a hand-written
    zram-tools unit in /etc/systemd/system and zram-generator configs, a drop-in among them,
    are found; a masked unit (a link to /dev/null) and a config elsewhere are not."""
    system = tmp_path / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    (system / "zramswap.service").write_text("[Service]\nExecStart=/sbin/zramswap start\n")
    (system / "zram-config.service").symlink_to("/dev/null")  # masked already
    (system / "other.service").write_text("[Service]\n")
    (tmp_path / "usr" / "lib" / "systemd").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "systemd" / "zram-generator.conf").write_text("[zram0]\n")
    dropins = tmp_path / "run" / "systemd" / "zram-generator.conf.d"
    dropins.mkdir(parents=True)
    (dropins / "50-size.conf").write_text("[zram0]\nzram-size = ram / 2\n")
    (tmp_path / "etc" / "zram-generator.conf").write_text("[zram0]\n")  # not a place systemd reads
    monkeypatch.setattr(sw_facts, "UNIT_DIR", str(system))
    monkeypatch.setattr(
        sw_facts, "ZRAM_GENERATOR_CONFIGS", tuple(str(tmp_path) + path for path in sw_facts.ZRAM_GENERATOR_CONFIGS)
    )
    result = subprocess.run(
        ["sh", "-c", sw_facts.SwapSources().command().get_raw_value()], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    found = sw_facts.SwapSources().process(result.stdout.splitlines())
    assert found["admin_unit_files"] == ["zramswap.service"]
    assert found["zram_generator_configs"] == [
        str(dropins / "50-size.conf"),
        str(tmp_path / "usr" / "lib" / "systemd" / "zram-generator.conf"),
    ]
    assert sw_operations.ZRAM_SETUP in sw_operations.units_to_mask(found)


def test_swap_files_fact_finds_only_regular_files_with_a_swap_signature(tmp_path):
    if not shutil.which("mkswap") or not shutil.which("blkid"):
        pytest.skip("mkswap and blkid (util-linux) are needed to make and probe a swap file")
    swapfile, plain, link = tmp_path / "swap file", tmp_path / "plain", tmp_path / "link"
    swapfile.write_bytes(b"\0" * 1024 * 1024)
    swapfile.chmod(0o600)
    subprocess.run(["mkswap", str(swapfile)], check=True, capture_output=True)
    plain.write_bytes(b"\0" * 1024 * 1024)
    link.symlink_to(swapfile)
    paths = [str(swapfile), str(plain), str(link), str(tmp_path), str(tmp_path / "missing")]
    command = sw_facts.SwapFiles().command(paths=paths).get_raw_value()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert sw_facts.SwapFiles().process(result.stdout.splitlines()) == [str(swapfile)]


# --- the fstab editor ----------------------------------------------------------------

D = sw_facts.DISABLED

# (fstab as found, fstab after): many shapes of swap entries and of lines that are not.
SHAPES = {
    "tabs": (b"/swap.img\tnone\tswap\tsw\t0\t0\n", D + b"/swap.img\tnone\tswap\tsw\t0\t0\n"),
    "spaces and options": (
        b"UUID=5b1c7c43-64e4-4d2a-9f6e-0b7c2d1e9a10   none  swap   sw,nofail   0 0\n"
        b"/dev/nvme0n1p3 none swap defaults,pri=5 0 0\n",
        D
        + b"UUID=5b1c7c43-64e4-4d2a-9f6e-0b7c2d1e9a10   none  swap   sw,nofail   0 0\n"
        + D
        + b"/dev/nvme0n1p3 none swap defaults,pri=5 0 0\n",
    ),
    "tags": (
        b"LABEL=swap none swap sw 0 0\nPARTUUID=0a1b2c3d-03 none swap sw 0 0\nPARTLABEL=sw none swap sw\n",
        D
        + b"LABEL=swap none swap sw 0 0\n"
        + D
        + b"PARTUUID=0a1b2c3d-03 none swap sw 0 0\n"
        + D
        + b"PARTLABEL=sw none swap sw\n",
    ),
    "comments, blank lines, already commented entries": (
        b"# <file system> <mount point> <type> <options> <dump> <pass>\n\n   \n"
        b"#/swapfile none swap sw 0 0\n   # UUID=1111 none swap sw 0 0\n\t#/swap.img none swap sw 0 0\n",
        None,
    ),
    "not swap though the name says swap": (
        b"/dev/sdb1 /mnt/swapdata ext4 defaults 0 2\n/swap.d/x.img /srv/swap ext4 loop 0 0\n"
        b"LABEL=swap /data xfs defaults 0 0\nswap /mnt/swap tmpfs size=1G 0 0\n"
        b"/swapfile none SWAP sw 0 0\n/swapfile2 none swap2 sw 0 0\n",
        None,
    ),
    "CRLF line ends": (
        b"UUID=0a34 / ext4 defaults 0 1\r\n/swap.img none swap sw 0 0\r\n/boot/efi /efi vfat umask=0077 0 1\r\n",
        b"UUID=0a34 / ext4 defaults 0 1\r\n" + D + b"/swap.img none swap sw 0 0\r\n"
        b"/boot/efi /efi vfat umask=0077 0 1\r\n",
    ),
    "CRLF on a three-field entry": (b"/swap.img none swap\r\n", D + b"/swap.img none swap\r\n"),
    "no newline at the end": (
        b"UUID=0a34 / ext4 defaults 0 1\n/swapfile none swap sw 0 0",
        b"UUID=0a34 / ext4 defaults 0 1\n" + D + b"/swapfile none swap sw 0 0",
    ),
    "no newline after a non-swap line": (
        b"/swap.img none swap sw 0 0\nproc /proc proc defaults",
        D + b"/swap.img none swap sw 0 0\nproc /proc proc defaults",
    ),
    "escaped spaces": (
        b"/var/swap\\040file none swap sw 0 0\n/mnt/my\\040disk /mnt/my\\040swap ext4 defaults 0 2\n",
        D + b"/var/swap\\040file none swap sw 0 0\n/mnt/my\\040disk /mnt/my\\040swap ext4 defaults 0 2\n",
    ),
    "leading and trailing blanks": (b"  \t/swap.img none swap sw 0 0 \t\n", D + b"  \t/swap.img none swap sw 0 0 \t\n"),
    "type written with an octal escape": (b"/swapfile none sw\\141p sw 0 0\n", D + b"/swapfile none sw\\141p sw 0 0\n"),
    # libmount ignores it (a parse error), systemd 252 (glibc) turns it into a swap unit.
    "pass field not a number": (b"/bad none swap sw 0 x\n", D + b"/bad none swap sw 0 x\n"),
    "empty": (b"", None),
}


def _after(shape: str) -> bytes:
    before, after = SHAPES[shape]
    return before if after is None else after


@pytest.mark.parametrize("shape", SHAPES)
def test_swap_entries_are_commented_and_every_other_byte_kept(shape):
    assert sw_operations.disable_swap_entries(SHAPES[shape][0]) == _after(shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_converged_fstab_is_left_as_it_is(shape):
    assert sw_operations.disable_swap_entries(_after(shape)) == _after(shape)


def test_active_and_disabled_sources():
    fstab = SHAPES["escaped spaces"][0] + SHAPES["tags"][0] + b'UUID="q" none swap sw 0 0\n'
    assert sw_facts.active_swap_sources(fstab) == [
        "/var/swap file",
        "LABEL=swap",
        "PARTUUID=0a1b2c3d-03",
        "PARTLABEL=sw",
        'UUID="q"',
    ]
    assert sw_facts.disabled_swap_sources(fstab) == []
    converged = sw_operations.disable_swap_entries(fstab) + b"#/old none swap sw 0 0\n"
    assert sw_facts.active_swap_sources(converged) == []
    assert sw_facts.disabled_swap_sources(converged) == sw_facts.active_swap_sources(fstab)


def _findmnt(tmp_path, content: bytes) -> list[dict]:
    tab = tmp_path / "fstab"
    tab.write_bytes(content)
    command = ["findmnt", "--tab-file", str(tab), "--json", "--output", "SOURCE,TARGET,FSTYPE,OPTIONS"]
    result = subprocess.run(command, capture_output=True, text=True)
    return json.loads(result.stdout)["filesystems"] if result.stdout else []


@pytest.mark.parametrize("shape", SHAPES)
def test_libmount_agrees(tmp_path, shape):
    """This machine's findmnt: every swap entry it reads is one sparkrig disables, none is
    left afterwards, and every other entry reads the same before and after."""
    if not shutil.which("findmnt"):
        pytest.skip("findmnt (util-linux) is not installed on this machine")
    before = SHAPES[shape][0]
    swap_sources = {fs["source"] for fs in _findmnt(tmp_path, before) if fs["fstype"] == "swap"}
    assert swap_sources <= set(sw_facts.active_swap_sources(before))
    assert [fs for fs in _findmnt(tmp_path, _after(shape)) if fs["fstype"] == "swap"] == []
    others = [fs for fs in _findmnt(tmp_path, before) if fs["fstype"] != "swap"]
    assert _findmnt(tmp_path, _after(shape)) == others


# --- unit names ------------------------------------------------------------------------

# Written by systemd 252's systemd-fstab-generator (run on an fstab holding these
# sources, in a chroot of the lab's Debian 12 image): source as libmount unmangles it
# -> the swap unit it made.
GENERATED = {
    "UUID=0a3407de-014b-458b-b5c1-848e92a327a3": (
        r"dev-disk-by\x2duuid-0a3407de\x2d014b\x2d458b\x2db5c1\x2d848e92a327a3.swap"
    ),
    'UUID="quoted-uuid"': r"dev-disk-by\x2duuid-quoted\x2duuid.swap",
    "LABEL=my swap": r"dev-disk-by\x2dlabel-my\x5cx20swap.swap",
    "PARTUUID=1234-05": r"dev-disk-by\x2dpartuuid-1234\x2d05.swap",
    "PARTLABEL=sw-part": r"dev-disk-by\x2dpartlabel-sw\x2dpart.swap",
    "/swap.img": "swap.img.swap",
    "/swap.img.new": "swap.img.new.swap",
    "/dev/sdb2": "dev-sdb2.swap",
    "/var/swap//file/": "var-swap-file.swap",
    "/esc sp": r"esc\x20sp.swap",
    "ID=nvme-foo": r"ID\x3dnvme\x2dfoo.swap",  # systemd 252 knows no ID= tag
}


@pytest.mark.parametrize(("source", "unit"), GENERATED.items())
def test_swap_unit_names_match_systemds_fstab_generator(source, unit):
    assert sw_operations.swap_unit_name(source) == unit


PATHS = [
    "/swap.img",
    "/",
    "/var//swap/./file/",
    "/.hidden/swap",
    "/a-b_c:d.e",
    "/with space",
    "/back\\slash",
    "/ünïcödé",
    "/dev/disk/by-label/my\\x20swap",
    "/a@b+c=d#e",
    "/-dash",
]


def test_unit_names_match_systemd_escape_run_here():
    if not shutil.which("systemd-escape"):
        pytest.skip("systemd-escape is not installed on this machine")
    expected = subprocess.run(
        ["systemd-escape", "--path", "--suffix=swap", *PATHS], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [sw_operations.unit_name_from_path(path, "swap") for path in PATHS] == expected


def test_udev_escapes_tag_values_like_udev():
    assert sw_operations.udev_node("LABEL=a/b c") == r"/dev/disk/by-label/a\x2fb\x20c"
    assert sw_operations.udev_node("LABEL=ünï") == "/dev/disk/by-label/ünï"
    assert sw_operations.udev_node("LABEL='x'") == "/dev/disk/by-label/x"
    assert sw_operations.udev_node("/path=with/equals") == "/path=with/equals"


# --- the fstab check -----------------------------------------------------------------


def _check(tmp_path, old: bytes, new: bytes | None, env: dict | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "old").write_bytes(old)
    if new is not None:
        (tmp_path / "new").write_bytes(new)
    return subprocess.run(
        ["sh", "-c", sw_operations.fstab_check_script(), "fstab-check", str(tmp_path / "old"), str(tmp_path / "new")],
        capture_output=True,
        text=True,
        env=env,
    )


# A Spark's fstab in a container: the root and swap UUIDs are absent here.
ABSENT = SEEDED_FSTAB
DISABLED_ABSENT = sw_operations.disable_swap_entries(ABSENT)


BROKEN = b"/dev/sda1 /boot\n"  # two fields: a parse error, libmount ignores the line


@pytest.mark.parametrize(
    ("old", "new", "passes"),
    [
        (ABSENT, sw_operations.disable_swap_entries(ABSENT), True),  # fewer errors: absent devices are the host's
        (ABSENT, ABSENT, True),
        (b"proc /proc proc defaults 0 0\n", b"proc /proc proc defaults 0 0\n#x\n", True),  # nothing to report
        (BROKEN + ABSENT, BROKEN + sw_operations.disable_swap_entries(ABSENT), True),  # a parse error was there before
        (ABSENT, sw_operations.disable_swap_entries(ABSENT) + BROKEN, False),  # a new parse error
        (
            ABSENT,
            sw_operations.disable_swap_entries(ABSENT)
            + b"UUID=feed none swap sw 0 0\n"
            + b"UUID=beef none swap sw 0 0\n"
            + b"UUID=cafe none swap sw 0 0\n",
            False,
        ),  # more errors
        (ABSENT, DISABLED_ABSENT.replace(b"defaults 0 1", b"ro 0 1"), False),  # an entry changed
        (ABSENT, DISABLED_ABSENT.replace(b"UUID=0a34", b"#UUID=0a34"), False),  # an entry lost
        (ABSENT, None, False),  # the new file cannot be read
    ],
    ids=[
        "disabled",
        "unchanged",
        "clean",
        "old parse error",
        "new parse error",
        "more errors",
        "entry changed",
        "entry lost",
        "unreadable",
    ],
)
def test_fstab_check_refuses_what_the_edit_broke_not_what_the_host_lacks(tmp_path, old, new, passes):
    if not shutil.which("findmnt"):
        pytest.skip("findmnt (util-linux) is not installed on this machine")
    result = _check(tmp_path, old, new)
    assert (result.returncode == 0) == passes, result.stderr


def test_fstab_check_when_findmnt_crashes_on_the_file_in_use(tmp_path):
    """util-linux 2.41.5 (Debian 13) findmnt dies of SIGSEGV (exit 139) reading any fstab
    that holds a parse error: then the new file must parse, absent devices or not."""
    findmnt = shutil.which("findmnt")
    if not findmnt:
        pytest.skip("findmnt (util-linux) is not installed on this machine")
    shim = tmp_path / "bin" / "findmnt"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\ncase " $* " in *"/old "*) exit 139;; esac\nexec {findmnt} "$@"\n')
    shim.chmod(0o755)
    env = {"PATH": f"{shim.parent}:/usr/bin:/bin"}
    old = b"/bad none swap sw 0 x\n" + ABSENT
    assert _check(tmp_path, old, sw_operations.disable_swap_entries(old), env).returncode == 0
    assert _check(tmp_path, old, sw_operations.disable_swap_entries(old) + BROKEN, env).returncode == 1


def test_findmnt_verify_counts_an_absent_uuid_as_an_error_here(tmp_path):
    """Why the check compares with the old file: plain `findmnt --verify` fails a Spark's
    fstab wherever its disks are absent (a container), before any edit."""
    if not shutil.which("findmnt"):
        pytest.skip("findmnt (util-linux) is not installed on this machine")
    (tmp_path / "fstab").write_bytes(sw_operations.disable_swap_entries(ABSENT))
    result = subprocess.run(
        ["findmnt", "--verify", "--tab-file", str(tmp_path / "fstab")],
        capture_output=True,
        text=True,
        env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    assert "[E] unreachable on boot required source: UUID=0a3407de" in result.stdout


def test_fstab_check_script_is_valid_sh():
    subprocess.run(["sh", "-n", "-c", sw_operations.fstab_check_script()], check=True)


# --- the plan ------------------------------------------------------------------------


def _digest(content: bytes) -> list[str]:
    return ["644 root root", f"{hashlib.sha256(content).hexdigest()}  /etc/fstab"]


def _responses(output: list[str]) -> dict:
    """Fake answers: SwapSources' recorded output, and atomic.file's digest of its fstab."""
    content = sw_facts.SwapSources().parse(output)["fstab"]["content"]
    return {"## swaps": output, "sha256sum /etc/fstab": _digest(content)}


@pytest.fixture
def remote_commands(monkeypatch):
    """Every command the fake host ran (the facts), with plan() working like `pyinfra -y`:
    no change detection pass, each operation's generator runs once."""
    ran: list[str] = []
    run = FakeConnector.run_shell_command

    def recording(self, command, *args, **kwargs):
        ran.append(str(command))
        return run(self, command, *args, **kwargs)

    monkeypatch.setattr(FakeConnector, "run_shell_command", recording)
    monkeypatch.setattr(pyinfra_fake, "State", functools.partial(State, check_for_changes=False))
    return ran


def test_a_spark_with_active_swap(remote_commands):
    ops = plan(sw.swap, responses=_responses(SPARK_ACTIVE))
    assert [op.name for op in ops] == ["Swap off | Swap off now and at every boot (fstab entries, swap and zram units)"]
    (op,) = ops
    assert op.uploads == {"/etc/.fstab.sparkrig-new": sw_operations.disable_swap_entries(SPARK_FSTAB)}
    write, reload, units, swapoff = op.commands
    assert write.startswith(
        "chown root:root /etc/.fstab.sparkrig-new && chmod 644 /etc/.fstab.sparkrig-new && { sh -c "
    )
    assert write.endswith(
        " fstab-check /etc/fstab /etc/.fstab.sparkrig-new || { rm -f /etc/.fstab.sparkrig-new ; false; }; }"
        " && cp -p /etc/fstab /etc/fstab.sparkrig.bak && mv -f /etc/.fstab.sparkrig-new /etc/fstab"
    )
    assert (reload, units, swapoff) == (
        "systemctl daemon-reload",
        "systemctl mask -- swap.img.swap && systemctl stop -- swap.img.swap",
        "swapoff -a",
    )
    assert len(remote_commands) == 2  # SwapSources, then atomic.file's digest of the fstab


def test_the_seeded_container_gets_what_the_recorded_run_did():
    (op,) = plan(sw.swap, responses=_responses(NSPAWN_SEEDED))
    assert op.uploads == {"/etc/.fstab.sparkrig-new": sw_operations.disable_swap_entries(SEEDED_FSTAB)}
    assert op.commands[1:] == [
        "systemctl daemon-reload",
        "mv -f /etc/systemd/system/hand.swap /etc/systemd/system/hand.swap.sparkrig-disabled"
        f" && systemctl mask -- '{UUID_UNIT}' hand.swap swap.img.swap"
        " systemd-zram-setup@.service zramswap.service"
        " && systemctl stop -- systemd-zram-setup@zram0.service zramswap.service",
    ]
    converged = sw_facts.SwapSources().parse(NSPAWN_CONVERGED)["fstab"]["content"]
    assert converged == sw_operations.disable_swap_entries(SEEDED_FSTAB)


def test_a_converged_host_costs_one_command_and_changes_nothing(remote_commands):
    ops = plan(sw.swap, responses=_responses(NSPAWN_CONVERGED))
    assert [(op.commands, op.uploads) for op in ops] == [([], {})]
    assert len(remote_commands) == 1 and "## swaps" in remote_commands[0]


def test_swap_disable_false_leaves_the_host_alone(remote_commands):
    assert plan(sw.swap, data={"swap_disable": False}, responses=_responses(SPARK_ACTIVE)) == []
    assert remote_commands == []


def test_a_container_does_not_try_to_turn_off_its_hosts_swap():
    output = [*NSPAWN_CONVERGED]
    output.insert(2, "/swapfile                               file\t\t4194300\t\t0\t\t-2")
    (op,) = plan(sw.swap, responses=_responses(output))
    assert op.commands == []


def test_without_systemd_only_the_fstab_changes():
    output = with_fstab(DOCKER_NO_SYSTEMD, SPARK_FSTAB)
    (op,) = plan(sw.swap, responses=_responses(output))
    assert list(op.uploads) == ["/etc/.fstab.sparkrig-new"]
    assert len(op.commands) == 1 and op.commands[0].endswith("mv -f /etc/.fstab.sparkrig-new /etc/fstab")


def test_a_newly_added_entry_is_disabled_and_its_unit_masked():
    converged = sw_facts.SwapSources().parse(NSPAWN_CONVERGED)["fstab"]["content"]
    content = converged + b"LABEL=spare\tnone swap sw 0 0\r\n"
    (op,) = plan(sw.swap, responses=_responses(with_fstab(NSPAWN_CONVERGED, content)))
    assert op.uploads["/etc/.fstab.sparkrig-new"] == content.replace(b"LABEL=", D + b"LABEL=")
    assert op.commands[1:] == ["systemctl daemon-reload", r"systemctl mask -- 'dev-disk-by\x2dlabel-spare.swap'"]


def test_swap_files_are_removed_only_when_asked_and_only_swap_files():
    output = with_fstab(
        NSPAWN_CONVERGED,
        SEEDED_FSTAB.replace(b"/swap.img\t", D + b"/swap.img\t") + b"/swap\\040file none swap sw 0 0\n",
    )
    responses = {**_responses(output), "blkid -p": ["/swap.img"]}
    (op,) = plan(sw.swap, data={"swap_remove_files": True}, responses=responses)
    assert op.commands[-1] == "rm -f -- /swap.img"
    (op,) = plan(sw.swap, responses=responses)
    assert not any(command.startswith("rm ") for command in op.commands)


def test_the_swap_files_fact_is_asked_about_file_entries_only(remote_commands):
    converged = sw_facts.SwapSources().parse(NSPAWN_CONVERGED)
    assert sw_operations.swap_file_candidates(converged) == ["/swap.img"]
    plan(sw.swap, data={"swap_remove_files": True}, responses=_responses(NSPAWN_CONVERGED))
    (files,) = [command for command in remote_commands if "blkid" in command]
    assert "/swap.img" in files and "UUID" not in files


def test_a_libmount_swap_entry_the_parser_missed_stops_the_change():
    output = [*NSPAWN_CONVERGED]
    missed = '{"filesystems": [{"source": "/elsewhere", "fstype": "swap"}]}'
    output.insert(output.index("## libmount") + 1, missed)
    (op,) = plan(sw.swap, responses=_responses(output))
    assert "/elsewhere" in op.commands[0] and op.commands[0].endswith(">&2; exit 1")
    assert not op.uploads


# --- a hostile host: output the fact cannot take at face value -------------------------------


def test_a_swap_file_name_that_is_not_utf8_is_still_turned_off():
    """/proc/swaps naming /swap\\xff.img: pyinfra would stop reading at that byte and see
    no swap; the fact's output travels base64-encoded, so swapoff is planned."""
    name = "/swap\udcff.img"  # the byte 0xff, as os.fsdecode keeps it
    output = [
        "## swaps",
        SWAPS_HEADER,
        f"{name}  file  16777212  0  -2",
        "## fstab",
        "## libmount",
        "## container",
        "none",
    ]
    (op,) = plan(sw.swap, responses={"## swaps": output})
    assert op.commands == ["swapoff -a"]
    encoded = pyinfra_fake.encode(output)
    assert all(line.isascii() for line in encoded)
    assert sw_facts.SwapSources().process(encoded)["active"][0]["filename"] == name


def test_a_fstab_only_entry_that_is_not_utf8_is_disabled(tmp_path):
    """A swap entry only in fstab whose source is not UTF-8: findmnt's JSON carries the raw
    byte; it is read, the entry disabled, not a JSONDecodeError for the whole fleet."""
    fstab = b"/swap\xff.img none swap sw 0 0\n"
    libmount = '{"filesystems": [{"source": "/swap\udcff.img", "fstype": "swap"}]}'
    output = [
        "## swaps",
        SWAPS_HEADER,
        "## fstab",
        "644 root root",
        base64.b64encode(fstab).decode(),
        "## libmount",
        libmount,
        "## container",
        "none",
    ]
    found = sw_facts.SwapSources().process(pyinfra_fake.encode(output))
    assert found["libmount_swap_sources"] == ["/swap\udcff.img"] == sw_facts.active_swap_sources(fstab)
    assert sw_operations.disable_swap_entries(fstab) == sw_facts.DISABLED + fstab


@pytest.mark.parametrize(
    "output",
    [
        [],  # nothing at all
        ["IyMgc3dhcHMK"],  # cut short: no end line (as when pyinfra stopped reading)
        ["not base64!", "sparkrig-end"],
        [base64.b64encode(b"## libmount\n" + b"[" * 5000 + b"\n").decode(), "sparkrig-end"],  # 5000 deep
        [base64.b64encode(b"## swaps\nFilename\n/x file many 0 -2\n").decode(), "sparkrig-end"],
        [base64.b64encode(b"## fstab\n644 root\nAAAA\n").decode(), "sparkrig-end"],
    ],
)
def test_output_the_fact_cannot_read_fails_that_host_with_a_message(output):
    """Forged or truncated output: pyinfra's FactProcessError (this host fails, with the
    reason), never another exception that would stop the run for every host."""
    with pytest.raises(FactProcessError, match="SwapSources: cannot read the host's output"):
        sw_facts.SwapSources().process(output)
    if output:  # pyinfra hands no empty output to a fact (its default, nothing found, instead)
        # pyinfra fails the host, and this fake inventory has no other host to go on with.
        with pytest.raises(PyinfraError, match="No hosts remaining"):
            plan(sw.swap, responses={"## swaps": {"as_sent": output}})


def test_a_symlinked_fstab_is_refused_not_replaced():
    """/etc/fstab a link (stat without -L said 777): sparkrig neither replaces the link with a
    0777 file nor writes through it; the host fails with a message naming the target."""
    output = [*SPARK_ACTIVE]
    output.insert(output.index("## libmount"), "## fstab-link")
    output.insert(output.index("## libmount"), "/etc/fstab.d/real")
    ops = plan(sw.swap, responses=_responses(output))
    (op,) = ops
    assert not op.uploads
    assert "is a symbolic link to /etc/fstab.d/real" in op.commands[0] and op.commands[0].endswith("exit 1")


def test_the_fstab_mode_is_read_through_a_link(tmp_path):
    """The fact's real command against a scratch root: a link's mode is its target's."""
    real = tmp_path / "fstab.real"
    real.write_text("/swap.img none swap sw 0 0\n")
    real.chmod(0o640)
    link = tmp_path / "fstab"
    link.symlink_to(real)
    command = sw_facts.SwapSources().command().get_raw_value().replace(sw_facts.FSTAB, str(link))
    result = subprocess.run(["sh", "-c", command], capture_output=True, check=True)
    found = sw_facts.SwapSources().process(result.stdout.decode("ascii").splitlines())
    assert found["fstab"]["mode"] == 0o640 and found["fstab_link"] == str(real)


def test_units_to_mask():
    assert sw_operations.units_to_mask(sw_facts.SwapSources().parse(NSPAWN_SEEDED)) == [
        UUID_UNIT,
        "hand.swap",
        "swap.img.swap",
        "systemd-zram-setup@.service",
        "zramswap.service",
    ]
    assert sw_operations.units_to_mask(sw_facts.SwapSources().parse(DOCKER_NO_SYSTEMD)) == []


# --- settings ------------------------------------------------------------------------


def test_swap_settings_defaults_and_checks():
    assert resolve(sw.SETTINGS, {}) == {"swap_disable": True, "swap_remove_files": False}
    assert problems(sw.SETTINGS, {}) == []
    assert problems(sw.SETTINGS, {"swap_disable": "no", "swap_remove_files": 1}) == [
        "swap_disable = 'no': allowed is True or False",
        "swap_remove_files = 1: allowed is True or False",
    ]
    assert problems(sw.SETTINGS, {"swap_remove_file": True}) == [
        "swap_remove_file: not a sparkrig setting (did you mean swap_remove_files?)"
    ]
    assert sw.swap._inner.deploy_data["swap_disable"] is True
