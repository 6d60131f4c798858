"""Memory watchdog: settings, earlyoom's arguments as sh/systemd read them, the drop-in, the plan."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sparkrig.operations import watchdog as wd
from sparkrig.operations.watchdog import deploy as wd_deploy
from sparkrig.settings import defaults, problems
from tests.unit.pyinfra_fake import HOST_STATE, PlannedOp, execute, host_state, plan

DEFAULTS = defaults(wd.SETTINGS)
DEFAULT_ARGS = wd_deploy.earlyoom_args(
    DEFAULTS["watchdog_min_available_kib"],
    DEFAULTS["watchdog_report_interval_s"],
    DEFAULTS["watchdog_prefer"],
    DEFAULTS["watchdog_avoid"],
)


# Settings --------------------------------------------------------------------


def test_defaults_are_valid():
    assert problems(wd.SETTINGS, {}) == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"watchdog_enabled": "yes"}, "watchdog_enabled = 'yes': allowed is True or False"),
        ({"watchdog_min_available_kib": "4G"}, "allowed is an integer from 65536"),
        ({"watchdog_min_available_kib": 1024}, "allowed is an integer from 65536"),
        ({"watchdog_min_available_kib": True}, "allowed is an integer"),
        ({"watchdog_report_interval_s": -1}, "allowed is an integer from 0 to 86400"),
        ({"watchdog_prefer": "^(python| vllm)$"}, "no spaces or quotes"),
        ({"watchdog_prefer": "^'python'$"}, "no spaces or quotes"),
        ({"watchdog_prefer": '^"python"$'}, "no spaces or quotes"),
        ({"watchdog_prefer": r"^python\d$"}, "no spaces or quotes"),
        ({"watchdog_prefer": "^python$HOME"}, "with '$' only before '|', ')' or at the end"),
        ({"watchdog_prefer": "^(python"}, "missing ), unterminated subpattern"),
        ({"watchdog_avoid": ""}, "watchdog_avoid = '': allowed is a POSIX extended regex"),
        ({"watchdog_avoid": ["sshd"]}, "allowed is a POSIX extended regex"),
        ({"watchdog_prefr": "x"}, "not a sparkrig setting (did you mean watchdog_prefer?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(wd.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


# Process names read on real machines: /proc/PID/comm, at most 15 characters.
PREFERRED = [
    "python",
    "python3",
    "python3.12",
    "pt_main_thread",  # PyTorch renames its main thread; vllm serve shows up like this
    "vllm",  # the vllm console script
    "VLLM::EngineCor",
    "VLLM::Worker_TP",  # vLLM's setproctitle("VLLM::EngineCore"), truncated
    "ray::IDLE",
    "ray::RayWorkerW",
]
OTHERS = ["bash", "earlyoom", "Xorg", "pythonista", "my-python3", "raylet", "vllm-wrapper"]
AVOIDED = [
    "init",
    "systemd",
    "systemd-journal",
    "systemd-logind",
    "systemd-udevd",
    "sshd",
    "sshd-session",
    "sshd-auth",
    "dockerd",
    "containerd",
    "containerd-shim",
    "dbus-daemon",
]


def _grep_e(regex: str, names: list[str]) -> list[str]:
    """The names a POSIX extended regex matches, as glibc's regexec (earlyoom's) sees them."""
    result = subprocess.run(["grep", "-E", "-e", regex], input="\n".join(names) + "\n", capture_output=True, text=True)
    assert result.returncode in (0, 1), result.stderr
    return result.stdout.splitlines()


def test_default_prefer_regex_matches_training_processes_only():
    assert _grep_e(DEFAULTS["watchdog_prefer"], PREFERRED + OTHERS + AVOIDED) == PREFERRED


def test_default_avoid_regex_matches_system_processes_only():
    assert _grep_e(DEFAULTS["watchdog_avoid"], PREFERRED + OTHERS + AVOIDED) == AVOIDED


# /etc/default/earlyoom ---------------------------------------------------------


def test_arguments_are_absolute_threshold_swap_ignored_and_regexes():
    assert DEFAULT_ARGS == [
        "-M",
        "4194304",
        "-s",
        "100",
        "-r",
        "3600",
        "--prefer",
        DEFAULTS["watchdog_prefer"],
        "--avoid",
        DEFAULTS["watchdog_avoid"],
    ]


TRICKY_REGEXES = [
    DEFAULTS["watchdog_prefer"],
    DEFAULTS["watchdog_avoid"],
    "^(a$|b$|c)$",
    "^[[:alpha:]]{2,4}(x|y)*$",
    "python|torch,run/x",
]


@pytest.mark.parametrize("regex", TRICKY_REGEXES)
def test_tricky_regexes_are_allowed(regex):
    assert problems(wd.SETTINGS, {"watchdog_prefer": regex}) == []


def _write_default_file(tmp_path, prefer: str):
    args = wd_deploy.earlyoom_args(4194304, 60, prefer, DEFAULTS["watchdog_avoid"])
    path = tmp_path / "earlyoom"
    path.write_text(wd_deploy.render_default_file(args))
    return path, args


@pytest.mark.parametrize("shell", ["sh", "dash", "bash"])
@pytest.mark.parametrize("regex", TRICKY_REGEXES)
def test_every_reader_gets_back_the_exact_words(tmp_path, shell, regex):
    """sh reads the file (`. file`); systemd then splits $EARLYOOM_ARGS into words, removing
    quotes, as `eval set --` does; Debian's init script runs `bash -c "exec earlyoom
    $EARLYOOM_ARGS"`. Each must hand earlyoom exactly the words of earlyoom_args()."""
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed on this machine")
    path, args = _write_default_file(tmp_path, regex)
    assert subprocess.run([shell, "-n", str(path)]).returncode == 0
    split = f'. "{path}"; eval "set -- $EARLYOOM_ARGS"; printf "%s\\n" "$@"'
    assert subprocess.run([shell, "-c", split], capture_output=True, text=True, check=True).stdout.splitlines() == args
    init_script = f'. "{path}"; bash -c "exec printf \'%s\\n\' $EARLYOOM_ARGS"'
    assert (
        subprocess.run([shell, "-c", init_script], capture_output=True, text=True, check=True).stdout.splitlines()
        == args
    )


def test_default_file_is_one_double_quoted_assignment_systemd_reads_literally(tmp_path):
    """systemd's EnvironmentFile= parser unescapes only \\, ", ` and $ after a backslash
    inside double quotes and expands nothing: with none of those characters (nor
    whitespace) inside a word, its value is the text between the quotes."""
    path, args = _write_default_file(tmp_path, DEFAULTS["watchdog_prefer"])
    (line,) = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert line.startswith('EARLYOOM_ARGS="') and line.endswith('"')
    value = line[len('EARLYOOM_ARGS="') : -1]
    assert not any(c in value for c in '\\"`')
    # systemd's split of $EARLYOOM_ARGS: at whitespace, each word's single quotes removed.
    assert [word.strip("'") for word in value.split()] == args


# Drop-in -----------------------------------------------------------------------


def _validate(tmp_path, content: str, validator=wd_deploy.DROP_IN_VALIDATOR) -> subprocess.CompletedProcess:
    path = tmp_path / "unit.conf"
    path.write_text(content)
    return subprocess.run([*validator, str(path)], capture_output=True, text=True)


def test_drop_in_protects_earlyoom_and_passes_its_validation(tmp_path):
    text = wd_deploy.render_drop_in()
    assert "[Service]\nOOMScoreAdjust=-1000\nNice=-20\n" in text
    assert _validate(tmp_path, text).returncode == 0


@pytest.mark.parametrize(
    "bad",
    [
        "[Service]\nOOMScoreAdjust=-1000\nExecStart=/bin/sh\n",
        "[Service]\nOOMScoreAdjust=-900\n",
        "[Unit]\nOOMScoreAdjust=-1000\n",
        "[Service]\n OOMScoreAdjust=-1000\n",
    ],
)
def test_drop_in_validation_refuses_anything_else(tmp_path, bad):
    result = _validate(tmp_path, bad)
    assert result.returncode != 0
    assert result.stdout  # the offending line is shown


def test_validation_fails_on_an_unreadable_file(tmp_path):
    result = subprocess.run([*wd_deploy.DROP_IN_VALIDATOR, str(tmp_path / "missing")], capture_output=True)
    assert result.returncode != 0


# Plans -------------------------------------------------------------------------

STATUS = "--property SubState"
ENABLED = "--property UnitFileState"
INSTALLED = ["ii  earlyoom  1.7-1+b1  amd64  Early OOM Daemon"]
DEBIAN_DEFAULT_FILE = 'EARLYOOM_ARGS="-r 3600"\n'


def _host(installed=True, running=True, enabled=True, args_text=None, drop_in_text=None) -> dict:
    """The host as the concern's one HostState command reads it, and as the facts of the
    operations it adds (apt's DebPackages, systemd's status) read it when they run."""
    return {
        HOST_STATE: host_state(
            files={wd_deploy.DEFAULT_FILE: args_text, wd_deploy.DROP_IN: drop_in_text},
            units={wd_deploy.SERVICE: (running, enabled)},
            packages={wd_deploy.PACKAGE: "1.7-1+b1" if installed else None},
        ),
        "dpkg -l": INSTALLED if installed else [],
        STATUS: ["Id=earlyoom.service", f"SubState={'running' if running else 'dead'}"],
        ENABLED: ["Id=earlyoom.service", f"UnitFileState={'enabled' if enabled else 'disabled'}"],
    }


CONVERGED = _host(args_text=wd_deploy.render_default_file(DEFAULT_ARGS), drop_in_text=wd_deploy.render_drop_in())


def _commands(ops: list[PlannedOp]) -> dict[str, list[str]]:
    return {op.name.removeprefix("Memory watchdog | "): op.commands for op in ops}


def test_fresh_host_gets_earlyoom_installed_with_fresh_package_lists():
    ops = execute(wd.watchdog, responses=_host(installed=False, running=False, enabled=False))
    commands = _commands(ops)
    assert list(commands) == [
        "Install earlyoom",
        f"earlyoom is never OOM-killed ({wd_deploy.DROP_IN})",
        "Reload systemd: the earlyoom drop-in changed",
        f"earlyoom arguments ({wd_deploy.DEFAULT_FILE})",
        "earlyoom is enabled and running",
        "Restart earlyoom: its arguments or drop-in changed",
    ]
    install = commands["Install earlyoom"]
    assert len(install) == 1 and " update && " in install[0]
    assert install[0].endswith("install --no-install-recommends earlyoom")
    assert commands["Reload systemd: the earlyoom drop-in changed"] == ["systemctl daemon-reload"]
    assert commands["earlyoom is enabled and running"] == [
        "systemctl start earlyoom.service",
        "systemctl enable earlyoom.service",
    ]
    upload = ops[3].uploads["/etc/default/.earlyoom.sparkrig-new"].decode()
    assert upload == wd_deploy.render_default_file(DEFAULT_ARGS)


def test_package_default_config_is_replaced_and_earlyoom_restarted():
    ops = execute(wd.watchdog, responses=_host(args_text=DEBIAN_DEFAULT_FILE, drop_in_text=wd_deploy.render_drop_in()))
    commands = _commands(ops)
    # Installed and running: no apt-get, not even an update; no start.
    assert list(commands) == [
        f"earlyoom arguments ({wd_deploy.DEFAULT_FILE})",
        "Restart earlyoom: its arguments or drop-in changed",
    ]
    assert commands[f"earlyoom arguments ({wd_deploy.DEFAULT_FILE})"][-1].endswith(
        "sh -n /etc/default/.earlyoom.sparkrig-new || { rm -f /etc/default/.earlyoom.sparkrig-new "
        "; false; }; } && mv -f /etc/default/.earlyoom.sparkrig-new /etc/default/earlyoom"
    )
    assert commands["Restart earlyoom: its arguments or drop-in changed"] == ["systemctl restart earlyoom.service"]


def test_converged_host_gets_no_operation():
    """One command reads files, unit and package; nothing else runs."""
    assert execute(wd.watchdog, responses=CONVERGED) == []


def test_new_threshold_rewrites_arguments_and_restarts_without_daemon_reload():
    ops = execute(wd.watchdog, data={"watchdog_min_available_kib": 8388608}, responses=CONVERGED)
    commands = _commands(ops)
    upload = ops[0].uploads["/etc/default/.earlyoom.sparkrig-new"].decode()
    assert 'EARLYOOM_ARGS="-M 8388608 -s 100 ' in upload
    assert "Reload systemd: the earlyoom drop-in changed" not in commands
    assert commands["Restart earlyoom: its arguments or drop-in changed"] == ["systemctl restart earlyoom.service"]


def test_changed_drop_in_reloads_systemd_then_restarts():
    responses = _host(args_text=wd_deploy.render_default_file(DEFAULT_ARGS), drop_in_text="[Service]\n")
    commands = _commands(execute(wd.watchdog, responses=responses))
    assert commands["Reload systemd: the earlyoom drop-in changed"] == ["systemctl daemon-reload"]
    assert commands["Restart earlyoom: its arguments or drop-in changed"] == ["systemctl restart earlyoom.service"]


def test_stopped_earlyoom_is_started_and_not_restarted_when_nothing_changed():
    responses = _host(
        running=False, args_text=wd_deploy.render_default_file(DEFAULT_ARGS), drop_in_text=wd_deploy.render_drop_in()
    )
    commands = _commands(execute(wd.watchdog, responses=responses))
    assert commands == {"earlyoom is enabled and running": ["systemctl start earlyoom.service"]}


def test_restart_is_decided_at_execution_not_at_plan_time():
    """The restart depends on what the file operations did (``_if=``): planning alone
    cannot know it, so a plan lists it; a converged host plans nothing at all."""
    responses = _host(args_text=DEBIAN_DEFAULT_FILE, drop_in_text=wd_deploy.render_drop_in())
    planned = _commands(plan(wd.watchdog, responses=responses))
    assert planned["Restart earlyoom: its arguments or drop-in changed"] == ["systemctl restart earlyoom.service"]
    assert plan(wd.watchdog, responses=CONVERGED) == []


def test_disabled_watchdog_is_stopped_and_disabled_and_nothing_is_written():
    ops = execute(wd.watchdog, data={"watchdog_enabled": False}, responses=CONVERGED)
    assert [op.name for op in ops] == [
        "Memory watchdog | earlyoom.service is stopped and disabled (watchdog_enabled is False)"
    ]
    assert ops[0].commands == ["systemctl stop earlyoom.service", "systemctl disable earlyoom.service"]


def test_disabled_watchdog_on_a_host_without_earlyoom_changes_nothing():
    responses = _host(installed=False, running=False, enabled=False)
    assert execute(wd.watchdog, data={"watchdog_enabled": False}, responses=responses) == []
