"""
Memory watchdog controls: earlyoom runs, with the configured thresholds and regexes,
and cannot itself be OOM-killed.

What earlyoom must run with is worked out here from the settings, independently of
the code that converges (operations/watchdog/).
"""

from __future__ import annotations

import pytest

from .processes import main_process_command, program_argv
from .reads import need

SERVICE = "earlyoom.service"
CAP_SYS_RESOURCE = 24
CONFIG_FILES = ("/etc/default/earlyoom", "/etc/systemd/system/earlyoom.service.d/50-sparkrig.conf")


@pytest.fixture
def enabled(settings):
    if not settings["watchdog_enabled"]:
        pytest.skip("watchdog_enabled is False for this host: earlyoom is meant to be off")


# The main process's files, read in the same command as its pid.
_OF_MAIN = "$(systemctl show --property MainPID --value %s)"


@need
def state(r) -> dict:
    """What the watchdog controls read of the host."""
    return {
        "package": r.package("earlyoom"),
        "service": r.service("earlyoom"),
        "files": {path: r.path(path) for path in CONFIG_FILES},
        "oom_score_adjust": r.run("systemctl show --property OOMScoreAdjust --value %s", SERVICE),
        "capeff": r.run("grep '^CapEff:' /proc/1/status"),
        "pid": r.run("systemctl show --property MainPID --value %s", SERVICE),
        "process": r.run(main_process_command(SERVICE), sudo=True),
        "oom_score_adj": r.run(f"cat /proc/{_OF_MAIN}/oom_score_adj", SERVICE),
    }


def _main_pid(found) -> int:
    pid = int(found["pid"].check())
    assert pid > 0, f"{SERVICE} has no main process"
    return pid


def _options(found) -> dict[str, str]:
    """earlyoom's options and their values, from its running process (an emulator in front
    of it, qemu-user's binfmt_misc entry, taken off: tests/compliance/processes.py)."""
    process = found["process"]
    words = program_argv(process.stdout, "earlyoom", SERVICE, process.stderr)[1:]
    assert len(words) % 2 == 0, f"every earlyoom option here takes a value: {words}"
    return dict(zip(words[::2], words[1::2]))


def test_earlyoom_is_installed_enabled_and_running(read, enabled):
    """Protects against a host with nothing to act before memory runs out: on GB10 a
    failing GPU allocation can freeze the machine before the kernel's OOM killer acts."""
    found = read(state)
    assert found["package"].is_installed, "earlyoom is not installed"
    service = found["service"]
    assert service.is_enabled, "earlyoom would not start at boot"
    assert service.is_running, f"{SERVICE} is not running (journalctl -u {SERVICE} says why)"


def test_earlyoom_runs_with_the_configured_arguments(read, settings, enabled):
    """Protects against a watchdog that never fires or fires at the wrong victim: an
    absolute threshold (-M, KiB), swap that cannot hold it back (-s 100: earlyoom acts
    only when memory AND swap are low), training processes killed first and sshd,
    systemd and the container daemons last. Read from the running process, so a config
    file changed without a restart is caught too."""
    assert _options(read(state)) == {
        "-M": str(settings["watchdog_min_available_kib"]),
        "-s": "100",
        "-r": str(settings["watchdog_report_interval_s"]),
        "--prefer": settings["watchdog_prefer"],
        "--avoid": settings["watchdog_avoid"],
    }


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_earlyoom_configuration_is_root_owned_and_not_writable_by_others(read, enabled, path):
    """Protects against privilege escalation: earlyoom holds CAP_KILL, so whoever can
    change its arguments or unit chooses which processes die, root's included."""
    f = read(state)["files"][path]
    assert f.is_file, f"{path} is missing"
    assert (f.user, f.group) == ("root", "root")
    assert f.mode & 0o022 == 0, f"{path} has mode {f.mode:o}"


def test_earlyoom_unit_asks_for_oom_score_adjust_minus_1000(read, enabled):
    """Protects against the kernel's OOM killer taking the watchdog itself when memory
    runs out faster than earlyoom can act."""
    value = read(state)["oom_score_adjust"].check()
    assert value == "-1000"


def _cap_sys_resource(found) -> tuple[bool, str]:
    """Whether systemd (PID 1) holds CAP_SYS_RESOURCE, and its CapEff line."""
    line = found["capeff"].check()
    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1), line


def test_earlyoom_process_cannot_be_oom_killed(read, enabled):
    """Protects against a unit setting that never reached the process: the running
    earlyoom's oom_score_adj is -1000."""
    found = read(state)
    allowed, capeff = _cap_sys_resource(found)
    if not allowed:
        pytest.skip(
            "systemd (PID 1) lacks CAP_SYS_RESOURCE on this host "
            f"({capeff.replace(chr(9), ' ')}): the kernel refuses to lower oom_score_adj "
            "and systemd ignores OOMScoreAdjust= ('assuming containerized execution'), as "
            "in the lab's containers; the unit's setting is checked on its own"
        )
    _main_pid(found)
    assert found["oom_score_adj"].check() == "-1000"


def test_earlyoom_is_off_when_disabled(read, settings):
    """Protects against a watchdog the settings turned off (for another OOM daemon)
    still killing processes."""
    if settings["watchdog_enabled"]:
        pytest.skip("watchdog_enabled is True for this host (the other controls check earlyoom)")
    found = read(state)
    if found["package"].is_installed:
        service = found["service"]
        assert not service.is_running, f"{SERVICE} runs though watchdog_enabled is False"
        assert not service.is_enabled, f"{SERVICE} would start at boot though watchdog_enabled is False"
