"""
SSH guard controls: sshd survives memory pressure, and SSH sessions stay killable.

Expected values come from the settings and from the host; the unit that runs sshd is
found here independently of operations/sshd_guard/.
"""

from __future__ import annotations

import re

import pytest

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)", size).groups()
    return int(number) * _UNITS[unit]


def _show(host, unit: str, *props: str) -> dict[str, str]:
    out = host.check_output("systemctl show %s -p %s", unit, ",".join(props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture
def sshd_unit(host) -> str:
    """ssh.socket's service when the socket starts sshd, else the unit sshd.service names."""
    socket = _show(host, "ssh.socket", "LoadState", "ActiveState", "Accept", "Triggers")
    if socket.get("LoadState") == "loaded" and socket.get("ActiveState") == "active":
        if socket.get("Accept") == "yes":
            pytest.skip("ssh.socket starts one sshd per connection: there is no listener to guard")
        return socket["Triggers"].split()[0]
    for name in ("sshd.service", "ssh.service"):
        shown = _show(host, name, "Id", "LoadState")
        if shown.get("LoadState") == "loaded":
            return shown["Id"]
    pytest.skip("this host runs no sshd unit")


def _can_lower_oom_score_adj(host) -> bool:
    with host.sudo():
        return host.run("sh -c 'echo -1 > /proc/self/oom_score_adj'").rc == 0


def test_sshd_unit_hands_sessions_a_killable_oom_score(host, sshd_unit):
    """Protects against unkillable jobs: with OOMScoreAdjust=-1000 on sshd's unit (as guides
    advise), every SSH session and every training job started from one inherits -1000, and
    the OOM killer takes the rest of the box instead."""
    assert int(_show(host, sshd_unit, "OOMScoreAdjust")["OOMScoreAdjust"]) >= 0


def test_sshd_unit_and_system_slice_reserve_memory(host, settings, sshd_unit):
    """Protects against losing SSH under memory pressure: sshd's memory is reserved
    (MemoryMin), within a reservation on system.slice without which it has no effect."""
    assert int(_show(host, sshd_unit, "MemoryMin")["MemoryMin"]) == _bytes(settings["sshd_guard_memory_min"])
    assert int(_show(host, "system.slice", "MemoryMin")["MemoryMin"]) == _bytes(
        settings["sshd_guard_system_slice_memory_min"])


def test_memory_reservation_reaches_the_cgroup(host, settings, sshd_unit):
    """Protects against a reservation systemd accepted but the kernel never got."""
    group = _show(host, sshd_unit, "ControlGroup")["ControlGroup"]
    memory_min = f"/sys/fs/cgroup{group}/memory.min"
    if not host.file(memory_min).exists:
        pytest.skip(f"the memory controller is not enabled for {group} ({memory_min} is missing), "
                    "as in containers on hosts with cgroup v1 memory")
    assert int(host.file(memory_min).content_string) == _bytes(settings["sshd_guard_memory_min"])


def test_sshd_listener_is_protected_from_the_oom_killer(host, sshd_unit):
    """Protects against losing the only way into a frozen box: sshd's listener runs at
    oom_score_adj -1000 (sshd sets it itself)."""
    if not _can_lower_oom_score_adj(host):
        pytest.skip("this host cannot lower oom_score_adj (no CAP_SYS_RESOURCE, as in containers): "
                    "sshd cannot protect its listener here")
    pid = _show(host, sshd_unit, "MainPID")["MainPID"]
    with host.sudo():
        assert host.file(f"/proc/{pid}/oom_score_adj").content_string.strip() == "-1000"


def test_a_fresh_ssh_session_is_killable(host):
    """Protects against unkillable jobs: what runs in a new SSH session has an OOM score
    that is not negative, so the OOM killer can still stop a runaway job."""
    if not _can_lower_oom_score_adj(host):
        pytest.skip("this host cannot lower oom_score_adj (no CAP_SYS_RESOURCE, as in containers): no session "
                    "can inherit a negative score here, so the control could not fail")
    assert int(host.check_output("cat /proc/self/oom_score_adj")) >= 0


def test_sshd_configuration_is_valid(host):
    """Protects against a lockout at the next restart or reboot: sshd -t passes."""
    with host.sudo():
        result = host.run("sshd -t")
    assert result.rc == 0, result.stderr


# What the read-only controls above ask, read once per host before they run (reads.py).
def reads(plan, settings) -> None:
    plan.run("systemctl show %s -p %s", "ssh.socket", "LoadState,ActiveState,Accept,Triggers")
    for name in ("sshd.service", "ssh.service"):
        plan.run("systemctl show %s -p %s", name, "Id,LoadState")
    plan.run("systemctl show %s -p %s", "system.slice", "MemoryMin")
    plan.run("sh -c 'echo -1 > /proc/self/oom_score_adj'", sudo=True)
    plan.run("cat /proc/self/oom_score_adj")
    plan.run("sshd -t", sudo=True)
    # The unit's properties, once the unit is known (sshd_unit's rule).
    socket = plan.known("systemctl show %s -p %s", "ssh.socket", "LoadState,ActiveState,Accept,Triggers")
    if socket is None:
        return
    shown = dict(line.split("=", 1) for line in socket.splitlines() if "=" in line)
    unit = None
    if shown.get("LoadState") == "loaded" and shown.get("ActiveState") == "active":
        unit = shown["Triggers"].split()[0] if shown.get("Accept") != "yes" and shown.get("Triggers") else None
    else:
        for name in ("sshd.service", "ssh.service"):
            found = plan.known("systemctl show %s -p %s", name, "Id,LoadState") or ""
            found = dict(line.split("=", 1) for line in found.splitlines() if "=" in line)
            if found.get("LoadState") == "loaded":
                unit = found["Id"]
                break
    if unit is None:
        return
    for prop in ("OOMScoreAdjust", "MemoryMin", "ControlGroup", "MainPID"):
        plan.run("systemctl show %s -p %s", unit, prop)
    group = plan.known("systemctl show %s -p %s", unit, "ControlGroup")
    if group is not None and "=" in group:
        memory_min = f"/sys/fs/cgroup{group.strip().split('=', 1)[1]}/memory.min"
        plan.file(memory_min)
    pid = plan.known("systemctl show %s -p %s", unit, "MainPID")
    if pid is not None and "=" in pid:
        plan.run("cat -- %s", f"/proc/{pid.strip().split('=', 1)[1]}/oom_score_adj", sudo=True)
