"""
SSH guard controls: sshd survives memory pressure, and SSH sessions stay killable.

Expected values come from the settings and from the host; the unit that runs sshd is
found here independently of operations/sshd_guard/.
"""

from __future__ import annotations

import re

import pytest

from .reads import need

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)", size).groups()
    return int(number) * _UNITS[unit]


def _shown(answer) -> dict[str, str]:
    return dict(line.split("=", 1) for line in answer.check().splitlines() if "=" in line)


def _show(r, unit: str, *props: str):
    return r.run("systemctl show %s -p %s", unit, ",".join(props))


def _unit(r) -> tuple[str | None, str]:
    """ssh.socket's service when the socket starts sshd, else the unit sshd.service names
    (None, and why, where there is none to guard)."""
    socket = _show(r, "ssh.socket", "LoadState", "ActiveState", "Accept", "Triggers")
    services = {name: _show(r, name, "Id", "LoadState") for name in ("sshd.service", "ssh.service")}
    socket = _shown(socket)
    if socket.get("LoadState") == "loaded" and socket.get("ActiveState") == "active":
        if socket.get("Accept") == "yes":
            return None, "ssh.socket starts one sshd per connection: there is no listener to guard"
        return socket["Triggers"].split()[0], ""
    for name, answer in services.items():
        shown = _shown(answer)
        if shown.get("LoadState") == "loaded":
            return shown["Id"], ""
    return None, "this host runs no sshd unit"


@need
def guard(r) -> dict:
    """What the SSH guard controls read: the host's own answers first, then those of sshd's unit."""
    found = {
        "system_slice": _show(r, "system.slice", "MemoryMin"),
        "can_lower": r.run("sh -c 'echo -1 > /proc/self/oom_score_adj'", sudo=True),
        "session": r.run("cat /proc/self/oom_score_adj"),
        "sshd_t": r.run("sshd -t", sudo=True),
    }
    unit, why = _unit(r)
    found.update(unit=unit, why=why)
    if unit is not None:
        found.update(
            props=_show(r, unit, "OOMScoreAdjust", "MemoryMin", "ControlGroup", "MainPID"),
            memory_min=r.run(
                'f="/sys/fs/cgroup$(systemctl show %s -p ControlGroup --value)/memory.min"; '
                'if test -e "$f"; then cat -- "$f"; else echo missing; fi',
                unit,
            ),
            listener=r.run("cat -- /proc/$(systemctl show %s -p MainPID --value)/oom_score_adj", unit, sudo=True),
        )
    return found


@pytest.fixture
def sshd_unit(read) -> str:
    """The unit that runs sshd's listener."""
    found = read(guard)
    if found["unit"] is None:
        pytest.skip(found["why"])
    return found["unit"]


def _can_lower_oom_score_adj(found) -> bool:
    return found["can_lower"].rc == 0


def test_sshd_unit_hands_sessions_a_killable_oom_score(read, sshd_unit):
    """Protects against unkillable jobs: with OOMScoreAdjust=-1000 on sshd's unit (as guides
    advise), every SSH session and every training job started from one inherits -1000, and
    the OOM killer takes the rest of the box instead."""
    assert int(_shown(read(guard)["props"])["OOMScoreAdjust"]) >= 0


def test_sshd_unit_and_system_slice_reserve_memory(read, settings, sshd_unit):
    """Protects against losing SSH under memory pressure: sshd's memory is reserved
    (MemoryMin), within a reservation on system.slice without which it has no effect."""
    found = read(guard)
    assert int(_shown(found["props"])["MemoryMin"]) == _bytes(settings["sshd_guard_memory_min"])
    assert int(_shown(found["system_slice"])["MemoryMin"]) == _bytes(settings["sshd_guard_system_slice_memory_min"])


def test_memory_reservation_reaches_the_cgroup(read, settings, sshd_unit):
    """Protects against a reservation systemd accepted but the kernel never got."""
    found = read(guard)
    group = _shown(found["props"])["ControlGroup"]
    memory_min = f"/sys/fs/cgroup{group}/memory.min"
    value = found["memory_min"].check()
    if value == "missing":
        pytest.skip(
            f"the memory controller is not enabled for {group} ({memory_min} is missing), "
            "as in containers on hosts with cgroup v1 memory"
        )
    assert int(value) == _bytes(settings["sshd_guard_memory_min"])


def test_sshd_listener_is_protected_from_the_oom_killer(read, sshd_unit):
    """Protects against losing the only way into a frozen box: sshd's listener runs at
    oom_score_adj -1000 (sshd sets it itself)."""
    found = read(guard)
    if not _can_lower_oom_score_adj(found):
        pytest.skip(
            "this host cannot lower oom_score_adj (no CAP_SYS_RESOURCE, as in containers): "
            "sshd cannot protect its listener here"
        )
    assert found["listener"].check().strip() == "-1000"


def test_a_fresh_ssh_session_is_killable(read):
    """Protects against unkillable jobs: what runs in a new SSH session has an OOM score
    that is not negative, so the OOM killer can still stop a runaway job."""
    found = read(guard)
    if not _can_lower_oom_score_adj(found):
        pytest.skip(
            "this host cannot lower oom_score_adj (no CAP_SYS_RESOURCE, as in containers): no session "
            "can inherit a negative score here, so the control could not fail"
        )
    assert int(found["session"].check()) >= 0


def test_sshd_configuration_is_valid(read):
    """Protects against a lockout at the next restart or reboot: sshd -t passes."""
    result = read(guard)["sshd_t"]
    assert result.rc == 0, result.stderr
