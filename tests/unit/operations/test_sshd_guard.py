"""SSH guard: finding the unit that runs sshd, the drop-ins, and the restart discipline."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from sparkrig import rendering
from sparkrig.operations import sshd_guard as sg
from sparkrig.operations.sshd_guard import facts as sg_facts
from sparkrig.operations.sshd_guard import operations as sg_operations
from sparkrig.operations.sshd_guard import settings as sg_settings
from sparkrig.settings import all_settings, problems
from tests.compliance.test_sshd_guard import test_a_fresh_ssh_session_is_killable as control
from tests.unit.pyinfra_fake import HOST_STATE, host_state, plan

FACT = "systemctl show -p Id,LoadState"

# `systemctl show ...` recorded on the lab hosts (2026-11-22).
DEBIAN12 = """Accept=no
Id=ssh.socket
Triggers=ssh.service
LoadState=loaded
ActiveState=inactive
UnitFileState=disabled

MainPID=580
Id=ssh.service
Triggers=
LoadState=loaded
ActiveState=active
UnitFileState=enabled

MainPID=580
Id=ssh.service
Triggers=
LoadState=loaded
ActiveState=active
UnitFileState=enabled""".splitlines()

DEBIAN13_SOCKET = """Accept=no
Id=ssh.socket
Triggers=ssh.service
LoadState=loaded
ActiveState=active
UnitFileState=enabled

MainPID=0
Id=sshd.service
Triggers=
LoadState=not-found
ActiveState=inactive
UnitFileState=

MainPID=339
Id=ssh.service
Triggers=
LoadState=loaded
ActiveState=active
UnitFileState=disabled""".splitlines()


def _accept_yes(lines):
    return [("Accept=yes" if line == "Accept=no" else line) for line in lines]


NO_SSHD = [
    "Id=ssh.socket",
    "LoadState=not-found",
    "",
    "Id=sshd.service",
    "LoadState=not-found",
    "",
    "Id=ssh.service",
    "LoadState=not-found",
]
# RHEL-like: sshd.service is the real unit, no ssh.service, no socket.
RHEL = [
    "Id=ssh.socket",
    "LoadState=not-found",
    "",
    "MainPID=901",
    "Id=sshd.service",
    "LoadState=loaded",
    "ActiveState=active",
    "UnitFileState=enabled",
    "",
    "Id=ssh.service",
    "LoadState=not-found",
]


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            DEBIAN12,
            {
                "service": "ssh.service",
                "socket": None,
                "per_connection": False,
                "active": True,
                "main_pid": 580,
                "restart_pending": False,
            },
        ),
        (
            DEBIAN13_SOCKET,
            {
                "service": "ssh.service",
                "socket": "ssh.socket",
                "per_connection": False,
                "active": True,
                "main_pid": 339,
                "restart_pending": False,
            },
        ),
        (
            DEBIAN13_SOCKET + ["", "RestartPending=yes"],
            {
                "service": "ssh.service",
                "socket": "ssh.socket",
                "per_connection": False,
                "active": True,
                "main_pid": 339,
                "restart_pending": True,
            },
        ),
        (
            _accept_yes(DEBIAN13_SOCKET),
            {
                "service": "ssh@.service",
                "socket": "ssh.socket",
                "per_connection": True,
                "active": False,
                "main_pid": 0,
                "restart_pending": False,
            },
        ),
        (
            RHEL,
            {
                "service": "sshd.service",
                "socket": None,
                "per_connection": False,
                "active": True,
                "main_pid": 901,
                "restart_pending": False,
            },
        ),
        (NO_SSHD, None),
    ],
)
def test_fact_finds_the_unit_that_runs_sshd(output, expected):
    assert sg_facts.SshdUnit().process(output) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"sshd_guard_memory_min": "128MB"}, "sshd_guard_memory_min = '128MB': allowed is a size"),
        ({"sshd_guard_memory_min": 128}, "sshd_guard_memory_min = 128: allowed is a size"),
        (
            {"sshd_guard_system_slice_memory_min": "64M"},
            "sshd_guard_system_slice_memory_min = '64M': allowed is at least sshd_guard_memory_min (128M)",
        ),
        (
            {"sshd_guard_memory_min": "1G", "sshd_guard_system_slice_memory_min": "512M"},
            "at least sshd_guard_memory_min (1G)",
        ),
    ],
)
def test_bad_sizes_are_refused(data, expected):
    found = problems(all_settings(), data)
    assert len(found) == 1 and expected in found[0], found


def test_size_bytes():
    assert [sg_settings.size_bytes(v) for v in ("512", "1K", "128M", "2G", "1T")] == [
        512,
        1024,
        128 << 20,
        2 << 30,
        1 << 40,
    ]


def test_service_dropin_never_makes_sessions_unkillable():
    text = rendering.render("sshd_guard/service.conf.j2", memory_min="128M")
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert settings == ["[Service]", "OOMScoreAdjust=0", "MemoryMin=128M"]
    assert sg_operations.DROPIN_NAME > "oom.conf"  # read after the guides' drop-in, so it wins


def _digest(text: str) -> list[str]:
    return ["644 root root", f"{hashlib.sha256(text.encode()).hexdigest()}  /x"]


def _converged(extra=()):
    service = rendering.render("sshd_guard/service.conf.j2", memory_min="128M")
    slice_ = rendering.render("sshd_guard/slice.conf.j2", memory_min="512M")
    return {
        FACT: DEBIAN13_SOCKET + list(extra),
        HOST_STATE: host_state(
            files={
                "/etc/systemd/system/ssh.service.d/zz-sparkrig.conf": service,
                "/etc/systemd/system/system.slice.d/zz-sparkrig.conf": slice_,
            }
        ),
        "sha256sum /etc/systemd/system/ssh.service.d/zz-sparkrig.conf": _digest(service),
        "sha256sum /etc/systemd/system/system.slice.d/zz-sparkrig.conf": _digest(slice_),
    }


def _guard_op(responses):
    ops = [op for op in plan(sg.sshd_guard, responses=responses) if op.name.startswith("SSH guard")]
    assert len(ops) == 1
    return ops[0]


def test_first_run_checks_sshd_first_then_writes_verified_dropins_and_restarts():
    op = _guard_op({FACT: DEBIAN13_SOCKET})
    assert op.name == "SSH guard | Reserve memory for sshd, keep its sessions killable"
    commands = op.commands
    assert commands[0].startswith("sh -c ") and "sshd -t" in commands[0] and commands[0].endswith("ssh.service")
    assert commands[1] == "mkdir -p /run/sparkrig && touch /run/sparkrig/sshd-restart-pending"
    assert set(op.uploads) == {
        "/etc/systemd/system/ssh.service.d/.zz-sparkrig.conf.sparkrig-new",
        "/etc/systemd/system/system.slice.d/.zz-sparkrig.conf.sparkrig-new",
    }
    moves = [c for c in commands if "mv -f" in c]
    assert len(moves) == 2 and all("systemd-analyze verify" in c for c in moves)
    assert commands[-4:] == [
        "systemctl daemon-reload",
        "systemctl restart ssh.service",
        "rm -f /run/sparkrig/sshd-restart-pending",
        "python: prove_new_connection",  # a brand-new SSH connection before the deploy goes on
    ]


def test_converged_host_gets_no_operation():
    """Two commands read the unit and both drop-ins; nothing else runs."""
    assert plan(sg.sshd_guard, responses=_converged()) == []


def test_a_restart_left_pending_by_a_failed_run_is_done_without_rewriting():
    op = _guard_op(_converged(["", "RestartPending=yes"]))
    assert op.uploads == {}
    assert op.commands[1:] == [
        "systemctl restart ssh.service",
        "rm -f /run/sparkrig/sshd-restart-pending",
        "python: prove_new_connection",
    ]
    assert "sshd -t" in op.commands[0]


def test_per_connection_sshd_is_left_alone():
    assert [
        op
        for op in plan(sg.sshd_guard, responses={FACT: _accept_yes(DEBIAN13_SOCKET)})
        if op.name.startswith("SSH guard")
    ] == []


def test_inactive_sshd_gets_its_dropins_without_a_restart():
    inactive = [
        line.replace("ActiveState=active", "ActiveState=inactive") if i > 6 else line for i, line in enumerate(DEBIAN12)
    ]
    op = _guard_op({FACT: inactive})
    assert "systemctl restart ssh.service" not in op.commands
    assert not any("sshd -t" in c for c in op.commands)


def _session(can_lower: bool, score: int):
    """STAND-IN for the suite's ``read`` fixture on one SSH session (a container cannot lower
    oom_score_adj, and this machine's sessions are not the ones under test): what the SSH guard's
    need read, whether root may lower oom_score_adj there and the score the session got."""
    found = {
        "can_lower": SimpleNamespace(rc=0 if can_lower else 1),
        "session": SimpleNamespace(check=lambda: str(score)),
    }
    return lambda need: found


def test_the_fresh_session_control_skips_where_it_could_not_fail_and_fails_where_it_can():
    # In a container no session can get a negative score: the control says so, never "passed".
    with pytest.raises(pytest.skip.Exception, match="cannot lower oom_score_adj .* could not fail"):
        control(_session(can_lower=False, score=0))
    with pytest.raises(AssertionError):
        control(_session(can_lower=True, score=-1000))
    control(_session(can_lower=True, score=0))
