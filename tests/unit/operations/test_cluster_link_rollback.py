"""The cluster link's rollback when the host reboots before a new SSH connection confirmed a
change: the timer that rolls back dies with the reboot, so the arming step also leaves a unit
that rolls back at boot, before the network starts, and confirming or rolling back removes it.
(The lab's reboot of a node cut off mid-change: tests/converge/test_cluster_lab.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkrig import rendering
from sparkrig.operations.cluster import link as cl_link

NETWORK = "40-sparkrig-cluster-cx7.network"


def _host(tmp_path: Path) -> dict:
    """A scratch host: its link file changed after the old one was kept, armed for the boot,
    and every command the rollback may call recorded instead of run."""
    d, etc, bin_ = tmp_path / "link", tmp_path / "etc", tmp_path / "bin"
    for directory in (d / "old" / etc.relative_to("/"), etc, bin_):
        directory.mkdir(parents=True)
    (d / "old" / etc.relative_to("/") / NETWORK).write_text("old\n")
    (etc / NETWORK).write_text("new\n")
    boot_files = [tmp_path / "boot.service", tmp_path / "wants" / "boot.service"]
    boot_files[1].parent.mkdir()
    for path in (*boot_files, d / "armed"):
        path.write_text("")
    for tool in ("systemctl", "netplan", "logger", "ip"):
        (bin_ / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >>{tmp_path}/called\n')
        (bin_ / tool).chmod(0o755)
    return {"d": d, "network": etc / NETWORK, "boot_files": boot_files, "bin": bin_, "called": tmp_path / "called"}


def _rollback(host: dict, *args: str, started_networkd: bool = False, netplan: bool = False):
    script = rendering.render(
        "cluster/link-rollback.sh.j2",
        dir=host["d"],
        unit=cl_link.ROLLBACK_UNIT,
        boot_unit=cl_link.BOOT_UNIT,
        boot_files=[str(p) for p in host["boot_files"]],
        paths=[str(host["network"])],
        added=[("cx7", "192.168.77.11/24")],
        started_networkd=started_networkd,
        netplan=netplan,
        networkd=cl_link.NETWORKD,
    )
    (host["d"] / "apply.sh").write_text(f"echo applied >>{host['called']}\n")
    env = {**os.environ, "PATH": f"{host['bin']}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", script, "rollback.sh", *args], env=env, check=True)
    return host["called"].read_text().splitlines() if host["called"].exists() else []


@pytest.mark.parametrize(("started_networkd", "netplan"), [(False, False), (True, True)])
def test_at_boot_the_old_files_come_back_before_the_network_starts_and_the_boot_unit_goes(
    tmp_path, started_networkd, netplan
):
    host = _host(tmp_path)
    called = _rollback(host, "boot", started_networkd=started_networkd, netplan=netplan)
    assert host["network"].read_text() == "old\n"
    assert (host["d"] / "rolled-back").exists()
    assert not (host["d"] / "armed").exists() and not any(p.exists() for p in host["boot_files"])
    # Nothing to apply: the network has not started yet, and starts from the old files
    # (netplan's generator ran from the changed ones: again). The change's address goes.
    assert "applied" not in called and "ip addr del 192.168.77.11/24 dev cx7" in called, called
    assert ("netplan generate" in called) == netplan
    assert ("systemctl --no-reload disable systemd-networkd.service" in called) == started_networkd


@pytest.mark.parametrize("started_networkd", [False, True])
def test_the_timer_rolls_back_a_running_host_and_removes_the_boot_unit_too(tmp_path, started_networkd):
    """The old files are applied to the ports (on DGX OS that gives a port NetworkManager had
    back to it) before a networkd the change started is stopped again."""
    host = _host(tmp_path)
    called = _rollback(host, started_networkd=started_networkd)
    assert host["network"].read_text() == "old\n"
    assert "ip addr del 192.168.77.11/24 dev cx7" in called and "applied" in called
    stopped = "systemctl disable --now systemd-networkd.service"
    assert (stopped in called) == started_networkd
    assert not started_networkd or called.index("applied") < called.index(stopped)
    assert not (host["d"] / "armed").exists() and not any(p.exists() for p in host["boot_files"])


def test_arming_leaves_the_boot_unit_enabled():
    armed = cl_link.arm_rollback(["/etc/systemd/network/" + NETWORK], ["40-sparkrig-cluster-*.network"], "A", "R", 60)
    # The unit, then the mark its condition reads, then the timer: a reboot at any point of
    # the change finds the old files kept and a rollback armed.
    unit, mark, timer = (
        armed.index(s)
        for s in (
            f'mv -f "$t" {cl_link.BOOT_FILES[0]}',
            'touch "$d/armed"',
            "systemd-run --quiet --unit=sparkrig-cluster-rollback ",
        )
    )
    assert armed.index("cp -a") < unit < mark < timer
    assert f"ln -sfn {cl_link.BOOT_FILES[0]} {cl_link.BOOT_FILES[1]}" in armed
    assert cl_link.BOOT_FILES[1].startswith("/etc/systemd/system/sysinit.target.wants/")
    # Confirming removes it: the real confirm script runs on a lab node, both ways
    # (tests/converge/test_cluster_lab.py).


def test_the_boot_unit_is_one_systemd_accepts_and_runs_before_the_network(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed here: the unit file cannot be checked as systemd reads it")
    unit = tmp_path / f"{cl_link.BOOT_UNIT}.service"
    unit.write_text(cl_link.BOOT_SERVICE)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0 and str(unit) not in result.stdout + result.stderr, result.stdout + result.stderr
    assert f"ConditionPathExists={cl_link.LINK_DIR}/armed" in cl_link.BOOT_SERVICE
    assert "Before=network-pre.target systemd-networkd.service NetworkManager.service" in cl_link.BOOT_SERVICE
    assert f"ExecStart=/bin/sh {cl_link.LINK_DIR}/rollback.sh boot" in cl_link.BOOT_SERVICE


class _Host:
    print_prefix = "[node] "


@pytest.mark.parametrize(
    ("answers", "slept_to_the_end"),
    [
        (["rolled-back", "Tue Nov 24"], False),  # the host rolled back already (a reboot, a fast timer)
        ([None, None, None, "ok"], True),  # no new connection: the timer is waited out, then checked
    ],
)
def test_the_controller_waits_out_the_timer_only_when_it_has_not_seen_the_rollback(
    monkeypatch, answers, slept_to_the_end
):
    """When a new connection already sees the rollback done, the deploy says so at once;
    without one, it waits until the host's timer has fired before it checks again."""
    clock = {"now": 0.0}
    slept = []
    monkeypatch.setattr(cl_link.time, "monotonic", lambda: clock["now"])

    def sleep(seconds):
        slept.append(seconds)
        clock["now"] += seconds

    def new_connection(state, host, command, timeout):
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        clock["now"] += 10 if answer is None else 0.1  # a connection that times out takes its 10 s
        return (answer is not None), ([answer] if answer else [])

    monkeypatch.setattr(cl_link.gevent, "sleep", sleep)
    monkeypatch.setattr(cl_link, "run_on_new_connection", new_connection)
    monkeypatch.setattr(cl_link, "_unconfirmed", set())
    assert cl_link._confirm_link(None, _Host(), "lab", 60, []) is False
    assert ("lab" in cl_link._unconfirmed) is True
    assert (clock["now"] >= 60 + 10) is slept_to_the_end, (clock["now"], slept)


PORTS = [("cx7", "192.168.100.11/24", 9000, ["192.168.100.12"])]


def test_a_link_that_is_not_up_as_configured_is_not_kept_and_the_run_says_why(monkeypatch):
    """The apply succeeded, but the port lacks its address: the confirmation answers why until
    the host's timer rolls it back, and the run fails for that node naming it. The first node
    changed in a run is not asked to reach a peer; the next one is."""
    clock = {"now": 0.0}
    asked, said = [], []
    monkeypatch.setattr(cl_link.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(cl_link.gevent, "sleep", lambda seconds: clock.update(now=clock["now"] + seconds))
    monkeypatch.setattr(cl_link.logger, "error", said.append)

    def new_connection(state, host, command, timeout):
        asked.append(command)
        clock["now"] += 0.1
        if command.startswith("cat "):
            return True, ["Tue Nov 24"]
        return True, ["link: cx7: no address 192.168.100.11/24"]

    monkeypatch.setattr(cl_link, "run_on_new_connection", new_connection)
    monkeypatch.setattr(cl_link, "_unconfirmed", set())
    monkeypatch.setattr(cl_link, "_confirmed", set())
    assert cl_link._confirm_link(None, _Host(), "lab", 60, PORTS) is False
    assert "the link is not up as configured: cx7: no address 192.168.100.11/24" in said[0], said
    assert "192.168.100.12" not in asked[0]  # the first node: its peer waits for its own change
    cl_link._confirmed.add("lab")
    assert "ping" in cl_link.render_confirm(PORTS, peers=True) and "192.168.100.12" in cl_link.render_confirm(
        PORTS, True
    )


def test_a_node_cut_off_after_it_was_seen_applying_is_reported_as_unreachable(monkeypatch):
    """The first new connection may come while the apply still runs ("waiting"); when the
    change then cuts the controller off, the run says so, not that the apply did not finish."""
    clock = {"now": 0.0}
    said = []
    answers = [(True, ["waiting"]), *[(False, TimeoutError("timed out"))] * 3]
    monkeypatch.setattr(cl_link.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(cl_link.gevent, "sleep", lambda seconds: clock.update(now=clock["now"] + seconds))
    monkeypatch.setattr(cl_link.logger, "error", said.append)

    def new_connection(state, host, command, timeout):
        clock["now"] += 10
        return answers.pop(0) if answers else (False, TimeoutError("timed out"))

    monkeypatch.setattr(cl_link, "run_on_new_connection", new_connection)
    monkeypatch.setattr(cl_link, "_unconfirmed", set())
    assert cl_link._confirm_link(None, _Host(), "lab", 60, PORTS) is False
    assert "the link change was not confirmed (no new SSH connection)" in said[0], said
