"""Host-side scripts run here, as root, with STAND-INS (scripts written here that record their
arguments) for the programs they call and their paths in a scratch directory: the firmware
apply's reboot mark (in a private mount namespace whose /run is fresh), the cluster link's
apply handing ports to NetworkManager, and the link's confirmation (its outcome, its proof of
the MTU). The deploy's own render functions make them; only their paths are moved.

tests/mutants.py changes each of these mechanisms by one line; a test here fails for each."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkrig import rendering
from sparkrig.operations.cluster import link as cl_link


def _standins(bindir: Path, calls: Path, tools: dict[str, str]) -> dict[str, str]:
    """STAND-IN programs: each appends "NAME ARGS" to ``calls``, then runs its body."""
    bindir.mkdir(exist_ok=True)
    for name, body in tools.items():
        path = bindir / name
        path.write_text(f'#!/bin/sh\n# STAND-IN {name} ({__name__})\necho "{name} $*" >>{calls}\n{body}\n')
        path.chmod(0o755)
    return {"PATH": f"{bindir}:/usr/bin:/bin", "LC_ALL": "C"}


def _calls(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


# Firmware: an applied update marks the reboot ----------------------------------------------


def _firmware_apply(tmp_path: Path, fwupdmgr: str, before: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """firmware-apply.sh as the deploy runs it, in a private mount namespace with a fresh
    /run (``before``: shell run there first); prints what it left in /run."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the script writes /run/reboot-required: needs root and unshare (a private /run)")
    calls = tmp_path / "calls"
    env = _standins(tmp_path / "bin", calls, {"fwupdmgr": fwupdmgr})
    script = rendering.script("updates/firmware-apply.sh")
    inner = (
        f'mount -t tmpfs tmpfs /run && {before} sh -c "$0" sparkrig-firmware-apply 5; echo "script-exit $?"; '
        'for f in /run/reboot-required /run/reboot-required.pkgs; do [ -e $f ] && echo "has $f" && cat $f; done; true'
    )
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", inner, script], capture_output=True, text=True, timeout=60, env=env
    )
    return result, _calls(calls)


def test_an_applied_firmware_update_marks_the_reboot(tmp_path):
    result, calls = _firmware_apply(tmp_path, "exit 0", before="echo linux-image-x >/run/reboot-required.pkgs &&")
    assert calls == ["fwupdmgr update --assume-yes --no-reboot-check"]
    assert result.stdout.splitlines() == [
        "script-exit 0",
        "has /run/reboot-required",
        "has /run/reboot-required.pkgs",
        "linux-image-x",
        "fwupd",
    ], result.stdout + result.stderr


def test_fwupd_named_once_however_often_it_applies(tmp_path):
    result, _ = _firmware_apply(tmp_path, "exit 0", before="echo fwupd >/run/reboot-required.pkgs &&")
    assert result.stdout.splitlines()[-2:] == ["has /run/reboot-required.pkgs", "fwupd"], result.stdout


@pytest.mark.parametrize(("status", "exit"), [(2, 0), (1, 1)])
def test_nothing_applied_marks_nothing(tmp_path, status, exit):
    """fwupdmgr's 2 is "nothing to do" (the script succeeds); another failure is the script's."""
    result, _ = _firmware_apply(tmp_path, f"exit {status}")
    assert result.stdout.splitlines() == [f"script-exit {exit}"], result.stdout + result.stderr


def test_a_wedged_fwupd_is_stopped_and_marks_nothing(tmp_path):
    """The script's argument is fwupdmgr's time limit (5 s here): timeout's 124 is the script's."""
    result, _ = _firmware_apply(tmp_path, "sleep 60")
    assert result.stdout.splitlines() == ["script-exit 124"], result.stdout + result.stderr


# The cluster link's apply: NetworkManager lets go of the listed ports, and only those --------


def _link_paths(tmp_path: Path, monkeypatch) -> Path:
    d = tmp_path / "link"
    d.mkdir()
    monkeypatch.setattr(cl_link, "LINK_DIR", str(d))
    monkeypatch.setattr(cl_link, "LINK_LOADED", str(tmp_path / "loaded"))
    monkeypatch.setattr(cl_link, "NM_FILE", str(tmp_path / "nm.conf"))
    monkeypatch.setattr(cl_link, "BOOT_FILES", (str(tmp_path / "boot.service"), str(tmp_path / "wants.service")))
    return d


@pytest.mark.parametrize(
    ("listed", "interfaces", "unmanaged"),
    [
        (["cx7a"], ["cx7", "cx7a"], ["cx7a"]),  # cx7 is a prefix of a listed name: not listed
        (["cx7", "cx7b"], ["cx7", "cx7b", "cx7bb"], ["cx7", "cx7b"]),
        ([], ["cx7"], []),  # the file of a rollback to before sparkrig lists none
    ],
)
def test_the_apply_hands_over_exactly_the_ports_networkmanager_must_leave(
    tmp_path, monkeypatch, listed, interfaces, unmanaged
):
    d = _link_paths(tmp_path, monkeypatch)
    if listed:
        Path(cl_link.NM_FILE).write_text(cl_link.render_networkmanager(listed))
    calls = tmp_path / "calls"
    env = _standins(tmp_path / "bin", calls, {"systemctl": "", "nmcli": "", "networkctl": ""})
    script = cl_link.render_link_apply(interfaces, netplan=False, networkmanager=True)
    assert str(d) in script and cl_link.NM_FILE in script
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=30, cwd="/")
    assert (d / "applied").read_text() == "0\n", (d / "apply.log").read_text()
    assert Path(cl_link.LINK_LOADED).exists()
    assert _calls(calls) == [
        "systemctl reload NetworkManager",
        *[f"nmcli device set {i} managed {'no' if i in unmanaged else 'yes'}" for i in interfaces],
        "networkctl reload",
        f"networkctl reconfigure {' '.join(interfaces)}",
        f"networkctl up {' '.join(interfaces)}",
    ]


def test_a_failed_apply_records_its_status_and_stops_there(tmp_path, monkeypatch):
    d = _link_paths(tmp_path, monkeypatch)
    calls = tmp_path / "calls"
    env = _standins(tmp_path / "bin", calls, {"systemctl": "", "nmcli": "", "networkctl": 'echo "no $1" >&2; exit 3'})
    subprocess.run(["sh", "-c", cl_link.render_link_apply(["cx7"], False, True)], env=env, check=True, timeout=30)
    assert (d / "applied").read_text() == "3\n" and "no reload" in (d / "apply.log").read_text()
    assert not Path(cl_link.LINK_LOADED).exists() and _calls(calls)[-1] == "networkctl reload"


# The cluster link's confirmation ------------------------------------------------------------

PORT = ("cx7", "192.168.100.11/24", 9000, ["192.168.100.12"])
LINK_UP = "3: cx7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT qlen 1000"
ADDRESS = "3: cx7    inet 192.168.100.11/24 brd 192.168.100.255 scope global cx7\\       valid_lft forever"


def _confirm(
    tmp_path: Path,
    monkeypatch,
    applied: str | None,
    link: str = LINK_UP,
    ping: str = "exit 0",
    rolled_back: bool = False,
) -> tuple[str, list[str], Path]:
    """confirm-link.sh as a new connection runs it, with STAND-INS for ip (answering ``link``
    and the port's address), ping (``ping``: its body) and systemctl."""
    d = _link_paths(tmp_path, monkeypatch)
    for path in ("armed", *cl_link.BOOT_FILES):
        (d / path if path == "armed" else Path(path)).write_text("")
    if applied is not None:
        (d / "applied").write_text(applied)
        (d / "apply.log").write_text("networkctl: first\nsecond\nthird\n")
    if rolled_back:
        (d / "rolled-back").write_text("")
    calls = tmp_path / "calls"
    ip = (
        f'case "$*" in "-o link show dev cx7") echo "{link}" ;; '
        f'"-o -4 addr show dev cx7") echo "{ADDRESS}" ;; *) exit 1 ;; esac'
    )
    env = _standins(tmp_path / "bin", calls, {"ip": ip, "ping": ping, "systemctl": ""})
    script = cl_link.render_confirm([PORT], peers=True)
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0 or out.stdout, out.stderr
    return out.stdout.strip(), [c for c in _calls(calls) if not c.startswith("ip ")], d


def _kept(d: Path) -> bool:
    """Whether the change was kept: the rollback at boot and the armed mark removed."""
    return not (d / "armed").exists() and not any(Path(p).exists() for p in cl_link.BOOT_FILES)


def test_an_applied_change_on_a_working_link_is_confirmed_and_kept(tmp_path, monkeypatch):
    said, calls, d = _confirm(tmp_path, monkeypatch, "0\n")
    assert said == "confirmed" and _kept(d)
    assert calls == [
        "ping -n -q -c 1 -W 1 -M do -s 8972 -I cx7 192.168.100.12",
        f"systemctl stop {cl_link.ROLLBACK_UNIT}.timer",
    ]


@pytest.mark.parametrize("status", ["1", "2", "124", ""])
def test_a_failed_apply_rolls_back_now(tmp_path, monkeypatch, status):
    said, calls, d = _confirm(tmp_path, monkeypatch, f"{status}\n")
    assert said == "failed: networkctl: first second third", said
    assert calls == [
        f"systemctl start --no-block {cl_link.ROLLBACK_UNIT}.service",
        f"systemctl stop {cl_link.ROLLBACK_UNIT}.timer",
    ]
    assert not _kept(d)


def test_an_apply_still_running_is_waited_for_and_a_rolled_back_one_said(tmp_path, monkeypatch):
    said, calls, d = _confirm(tmp_path, monkeypatch, None)
    assert (said, calls, _kept(d)) == ("waiting", [], False)


def test_a_rolled_back_change_is_said_and_nothing_more_done(tmp_path, monkeypatch):
    said, calls, d = _confirm(tmp_path, monkeypatch, "0\n", rolled_back=True)
    assert (said, calls, _kept(d)) == ("rolled-back", [], False)


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        (LINK_UP.replace("UP,LOWER_UP", "LOWER_UP"), "link: cx7: down"),
        (LINK_UP.replace("mtu 9000", "mtu 1500"), "link: cx7: MTU 1500, not 9000"),
    ],
)
def test_a_link_not_as_configured_is_not_kept(tmp_path, monkeypatch, link, expected):
    said, calls, d = _confirm(tmp_path, monkeypatch, "0\n", link=link)
    assert said == expected and calls == [] and not _kept(d)


def test_a_peer_that_answers_only_small_pings_does_not_prove_the_mtu(tmp_path, monkeypatch):
    """A path whose MTU is below the ports' (a switch at 1500): a full-size ping that may not be
    fragmented gets no answer, a small one does. The change is not kept."""
    small_only = 'case "$*" in *"-M do -s 8972 "*) exit 1 ;; esac; exit 0'
    said, calls, d = _confirm(tmp_path, monkeypatch, "0\n", ping=small_only)
    assert said == "link: cx7: no answer from 192.168.100.12", said
    assert calls == ["ping -n -q -c 1 -W 1 -M do -s 8972 -I cx7 192.168.100.12"] and not _kept(d)
