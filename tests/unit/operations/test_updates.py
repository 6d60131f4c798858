"""Updates: settings, the Versions fact (parsed, and its command run for real), apt's own
checks of the files, the plan, and the fleet report's table."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys

import pytest
from pyinfra.api.exceptions import FactProcessError, PyinfraError

from sparkrig import atomic
from sparkrig.operations import updates as up
from sparkrig.operations.updates import boots, known_bad
from sparkrig.operations.updates import deploy as up_deploy
from sparkrig.operations.updates import facts as up_facts
from sparkrig.operations.updates import operations as up_operations
from sparkrig.operations.updates import settings as up_settings
from sparkrig.settings import all_settings, defaults, problems
from sparkrig.tools import report
from sparkrig.tools.rollout import REPO
from tests.unit.pyinfra_fake import HOST_STATE, PlannedOp, execute, host_state

DEFAULTS = defaults(all_settings())


# Settings --------------------------------------------------------------------


def test_defaults_are_valid():
    assert problems(up.SETTINGS, {}) == []


def test_holds_and_expectations_accept_what_a_fleet_writes():
    data = {
        "updates_hold": ["linux-image-*", "nvidia-driver-580-open=580.95.05-0ubuntu1", "libnvidia-*=580.95.*"],
        "updates_unattended": "security",
        "updates_expected_kernel": "6.17.0-1007-nvidia",
        "updates_expected_driver": "580.95.05",
    }
    assert problems(up.SETTINGS, data) == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"updates_hold": "linux-image-*"}, "allowed is a list of package names or globs"),
        ({"updates_hold": ["Linux"]}, "(bad entry: 'Linux')"),
        ({"updates_hold": ["linux; rm -rf /"]}, "bad entry"),
        ({"updates_hold": ["nvidia-driver="]}, "(bad entry: 'nvidia-driver=')"),
        ({"updates_hold": ["nvidia-driver=1.0 x"]}, "bad entry"),
        ({"updates_hold": ["a", "a=1"]}, "(a name given twice)"),
        ({"updates_unattended": "yes"}, "allowed is one of 'off', 'security', 'on'"),
        ({"updates_unattended": False}, "allowed is one of 'off', 'security', 'on'"),
        ({"updates_expected_kernel": "6.17 x"}, 'allowed is "" (no expectation) or a kernel release'),
        ({"updates_expected_driver": "580"}, 'allowed is "" (no expectation) or a driver version'),
        ({"updates_stop_on_unexpected": "yes"}, "allowed is True or False"),
        ({"updates_systemd_oomd": "on"}, "allowed is one of 'auto', 'off', 'keep'"),
        ({"updates_packages": {"kernel": ["linux-image-*"]}}, "a mapping of each of kernel, driver"),
        ({"updates_packages": {**up_settings.DEFAULT_PACKAGES, "docker": "docker.io"}}, "(bad docker: 'docker.io')"),
        ({"updates_hodl": []}, "not a sparkrig setting (did you mean updates_hold?)"),
        ({"updates_reboot": "always"}, "allowed is one of 'never', 'when-required'"),
        ({"updates_reboot": True}, "allowed is one of 'never', 'when-required'"),
        ({"updates_drain_timeout": 59}, "allowed is an integer from 60 to 604800 (seconds)"),
        ({"updates_drain_timeout": "3600"}, "allowed is an integer from 60 to 604800 (seconds)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(up.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


# The fact ----------------------------------------------------------------------


# As a DGX Spark after DGX OS 7.4.0's over-the-air update prints it (versions as reported
# on NVIDIA's forum; the lines are the fact's own tags).
def python_line(name: str, version: str, venv: str = "/opt/sparkrig/venv") -> str:
    """The fact's line for a distribution, its fields base64-encoded as the host sends them."""
    where = f"{venv}/lib/python3.12/site-packages/{name}-{version}.dist-info"
    return f"python {name} {_b64(where)} {_b64(version + chr(10))}"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


SPARK = [
    'os PRETTY_NAME="Ubuntu 24.04.3 LTS"',
    'os VERSION_ID="24.04"',
    "os ID=ubuntu",
    'dgx DGX_SWBUILD_VERSION="7.2.3"',
    'dgx DGX_OTA_VERSION="7.3.1"',
    'dgx DGX_OTA_VERSION="7.4.0"',
    "kernel 6.17.0-1007-nvidia",
    "boot 6.17.0-1007-nvidia",
    "boot 6.17.0-1008-nvidia",
    "reboot",
    "pkg kernel ii  linux-image-6.17.0-1007-nvidia 6.17.0-1007.7",
    "pkg kernel ii  linux-image-6.17.0-1008-nvidia 6.17.0-1008.8",
    "pkg kernel un  linux-image-generic ",
    "pkg driver hi  nvidia-driver-580-open 580.95.05-0ubuntu1",
    "pkg driver ii  libnvidia-compute-580 580.95.05-0ubuntu1",
    "pkg docker ii  docker-ce 5:28.5.1-1~ubuntu.24.04~noble",
    "pkg toolkit ii  nvidia-container-toolkit 1.18.0-1",
    "pkg hold hi  nvidia-driver-580-open 580.95.05-0ubuntu1",
    "held nvidia-driver-580-open",
    "record nvidia-driver-580-open",
    "nvproc NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:45:29 UTC 2025",
    "cudadir /usr/local/cuda-13.0",
    "cudajson {",
    'cudajson    "cuda" : {',
    'cudajson       "name" : "CUDA SDK",',
    'cudajson       "version" : "13.0.2"',
    "cudajson    },",
    'cudajson    "cuda_cccl" : { "name" : "CUDA C++ Core Compute Libraries", "version" : "13.0.85" }',
    "cudajson }",
    python_line("torch", "2.11.0"),
    python_line("vllm", "0.20.2"),
]


def test_a_spark_reads_as_its_versions():
    facts = up_facts.Versions().process(SPARK)
    assert facts["os"] == {"PRETTY_NAME": "Ubuntu 24.04.3 LTS", "VERSION_ID": "24.04", "ID": "ubuntu"}
    assert facts["dgx"] == {"DGX_SWBUILD_VERSION": "7.2.3", "DGX_OTA_VERSION": "7.4.0"}
    assert facts["kernel"] == "6.17.0-1007-nvidia"
    assert facts["packages"]["kernel"] == {
        "linux-image-6.17.0-1007-nvidia": "6.17.0-1007.7",
        "linux-image-6.17.0-1008-nvidia": "6.17.0-1008.8",
    }
    assert facts["packages"]["driver"]["nvidia-driver-580-open"] == "580.95.05-0ubuntu1"
    assert facts["hold_matches"] == {"nvidia-driver-580-open": "580.95.05-0ubuntu1"}
    assert (facts["held"], facts["record"]) == (["nvidia-driver-580-open"], ["nvidia-driver-580-open"])
    assert (facts["driver"], facts["cuda"]) == ("580.95.05", "13.0.2")
    assert facts["python"] == {"torch": "2.11.0", "vllm": "0.20.2"}
    assert up_facts.pending_reboot(facts) == "kernel 6.17.0-1008-nvidia is installed, 6.17.0-1007-nvidia is running"


def test_driver_from_nvidia_smi_and_cuda_from_the_directory_name():
    facts = up_facts.Versions().process(["kernel 6.8.0-45-generic", "nvsmi 580.159.04", "cudadir /usr/local/cuda-13.1"])
    assert (facts["driver"], facts["cuda"]) == ("580.159.04", "13.1")
    older = "nvproc NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023"
    assert up_facts.Versions().process([older])["driver"] == "535.129.03"


def test_a_host_with_nothing_reads_as_nothing():
    facts = up_facts.Versions().process(["os ID=debian", "kernel 6.1.0-26-amd64"])
    assert (facts["driver"], facts["cuda"], facts["python"]) == (None, None, {})
    assert up_facts.pending_reboot(facts) is None


@pytest.mark.parametrize(
    "line",
    [
        "kernel 6.1.0 evil",
        "nvproc NVRM version: something else entirely",
        "nvsmi 580.95.05 575.1.2",
        "nvsmi N/A",
        "pkg kernel ii",
        "record ../../etc/shadow",
        "cudajson {not json",
        "python torch 2.1 extra",
        "surprise",
    ],
)
def test_output_the_fact_cannot_parse_fails_the_host(line):
    with pytest.raises(FactProcessError, match="Versions: cannot read the host's output"):
        up_facts.Versions().process(["kernel 6.1.0-26-amd64", line])


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs dpkg-query (a Debian controller)")
def test_the_command_reads_a_venv_and_this_machine(tmp_path):
    """The fact's own command, run here: the venv's versions come from METADATA (not from a
    directory name, not by running its python); everything else parses."""
    venv = tmp_path / "venv"
    for name, version, said in (("torch", "2.11.0", "2.11.0+cpu"), ("vllm", "0.20.2", "0.20.2")):
        info = venv / "lib" / "python3.12" / "site-packages" / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {said}\n\nVersion: no\n")
    (venv / "lib" / "python3.12" / "site-packages" / "torchaudio-2.11.0.dist-info").mkdir()
    settings = {**DEFAULTS, "python_venv_path": str(venv)}
    part = up_deploy.versions_part(settings)
    command = up_facts.Versions().command(**dict(part.kwargs)).get_raw_value()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    facts = up_facts.Versions().process(result.stdout.splitlines())
    assert facts["python"] == {"torch": "2.11.0+cpu", "vllm": "0.20.2"}
    assert facts["kernel"] == os.uname().release


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs dpkg-query (a Debian controller)")
def test_a_fifo_for_a_venvs_metadata_never_hangs_the_report(tmp_path):
    """The venv's owner makes torch's METADATA a FIFO (no writer ever comes): the fact's own
    command still ends (the deploy and sparkrig report read it), torch's version unknown."""
    info = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "torch-2.11.0.dist-info"
    info.mkdir(parents=True)
    os.mkfifo(info / "METADATA")
    part = up_deploy.versions_part({**DEFAULTS, "python_venv_path": str(tmp_path / "venv")})
    command = up_facts.Versions().command(**dict(part.kwargs)).get_raw_value()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert up_facts.Versions().process(result.stdout.splitlines())["python"] == {"torch": "?"}


def test_the_manifests_vllm_name_is_the_one_read():
    manifest = {**DEFAULTS["python_stack"], "vllm": {"name": "sparkrig-lab-standin-vllm"}}
    assert up_deploy.python_names({**DEFAULTS, "python_stack": manifest}) == ("torch", "sparkrig_lab_standin_vllm")
    assert up_deploy.python_names({**DEFAULTS, "python_stack": {**manifest, "vllm": None}}) == ("torch", "vllm")


def test_unexpected_versions_name_both():
    facts = up_facts.Versions().process(SPARK)
    settings = {**DEFAULTS, "updates_expected_kernel": "6.17.0-1008-nvidia", "updates_expected_driver": "580.95.05"}
    assert up_facts.unexpected(settings, facts) == [
        "kernel 6.17.0-1007-nvidia is running, updates_expected_kernel is 6.17.0-1008-nvidia"
    ]
    settings["updates_expected_driver"] = "590.1.2"
    facts["driver"] = None
    assert up_facts.unexpected(settings, facts)[1] == (
        "NVIDIA driver (none loaded) is loaded, updates_expected_driver is 590.1.2"
    )


# Files, checked by apt itself ---------------------------------------------------------


def _validate(validator, text: str, tmp_path) -> int:
    path = tmp_path / "candidate"
    path.write_text(text)
    return subprocess.run([*validator, str(path)], capture_output=True).returncode


@pytest.mark.skipif(not shutil.which("apt-config"), reason="needs apt-config (a Debian controller)")
@pytest.mark.parametrize("mode", up_settings.MODES)
def test_apt_conf_is_what_apt_reads(mode, tmp_path):
    text = up_operations.render_apt_conf(mode, ["linux-image-*", "nvidia-driver-580-open=580.95.05-0ubuntu1"])
    assert _validate(up_operations.APT_CONF_VALIDATOR, text, tmp_path) == 0
    path = tmp_path / "candidate"
    dump = subprocess.run(["apt-config", "-c", str(path), "dump"], capture_output=True, text=True).stdout
    assert f'APT::Periodic::Unattended-Upgrade "{0 if mode == "off" else 1}";' in dump
    assert 'Unattended-Upgrade::Package-Blacklist:: "^linux-image-.*$";' in dump
    assert 'Unattended-Upgrade::Package-Blacklist:: "^nvidia-driver-580-open$";' in dump
    if mode == "security":
        assert "origin=*" not in dump and "label=Debian-Security" in dump
    assert _validate(up_operations.APT_CONF_VALIDATOR, text + 'APT::Periodic "1\n', tmp_path) != 0


@pytest.mark.skipif(not shutil.which("apt-cache"), reason="needs apt-cache (a Debian controller)")
def test_pin_file_is_what_apt_reads(tmp_path):
    text = up_operations.render_pins(
        ["linux-image-*", "nvidia-driver-580-open=580.95.05-0ubuntu1", "libnvidia-*=580.95.*"]
    )
    assert "Package: nvidia-driver-580-open\nPin: version 580.95.05-0ubuntu1\nPin-Priority: 1000\n" in text
    assert "linux-image" not in text
    assert _validate(up_operations.PIN_VALIDATOR, text, tmp_path) == 0
    assert _validate(up_operations.PIN_VALIDATOR, text + "Pin-Priority: 2000\n", tmp_path) != 0
    assert _validate(up_operations.PIN_VALIDATOR, text + "\nPackage: x\nPin-Priority: 1000\n", tmp_path) != 0  # no pin
    assert (
        _validate(up_operations.PIN_VALIDATOR, text + "\nPackage: x\nPin: release o=x\nPin-Priority: 1000\n", tmp_path)
        != 0
    )
    assert up_operations.render_pins(["linux-image-*"]) is None


def test_glob_regex_matches_what_the_glob_matches():
    regex = re.compile(up_operations.glob_regex("linux-image-6.17*"))
    assert regex.match("linux-image-6.17.0-1008-nvidia")
    assert not regex.match("linux-image-6x17")
    assert not regex.match("xlinux-image-6.17")
    assert "\\" not in up_operations.glob_regex("libstdc++6.*")


# Plans -------------------------------------------------------------------------------

VERSIONS = "sparkrig-python-versions"
# The shipped known-bad list's pins, as a GB10 (the unit tests' host) has them.
SHIPPED_PINS = known_bad.render_pins(known_bad.applicable({"hardware_profile": "gb10"}))
TIMER_STATUS = "--property SubState"
TIMER_ENABLED = "--property UnitFileState"


def _host(versions=(), files=None, timers=(False, False), oomd=None, unattended=None) -> dict:
    """The host as the concern's one reading reads it (Versions, HostState)."""
    units = {timer: timers for timer in up_operations.TIMERS}
    if oomd is not None:
        units[up_operations.OOMD_UNITS[0]] = oomd
    return {
        VERSIONS: ["os ID=debian", "kernel 6.1.0-26-amd64", *versions],
        HOST_STATE: host_state(
            files={
                up_settings.PIN_FILE: None,
                up_settings.KNOWN_BAD_FILE: SHIPPED_PINS,
                up_operations.APT_CONF: up_operations.render_apt_conf("off", []),
                up_facts.RECORD: None,
                boots.JOURNALD_DROP_IN: boots.render_journald(),
                **(files or {}),
            },
            units=units,
            packages={up_operations.UNATTENDED_PACKAGE: unattended, up_operations.FWUPD_PACKAGE: "2.0.20-1"},
        ),
        TIMER_STATUS: ["Id=apt-daily.timer", f"SubState={'waiting' if timers[0] else 'dead'}"],
        TIMER_ENABLED: ["Id=apt-daily.timer", f"UnitFileState={'enabled' if timers[1] else 'disabled'}"],
    }


def _commands(ops: list[PlannedOp]) -> dict[str, list[str]]:
    return {op.name.removeprefix("Updates | "): op.commands for op in ops}


def test_converged_host_gets_no_operation():
    assert execute(up.updates, responses=_host()) == []


def test_a_fresh_host_turns_unattended_upgrades_and_their_timers_off():
    responses = _host(files={up_operations.APT_CONF: None}, timers=(True, True))
    ops = _commands(execute(up.updates, responses=responses))
    assert list(ops) == [
        f"Unattended upgrades as updates_unattended says ({up_operations.APT_CONF})",
        "apt-daily.timer runs as updates_unattended says",
        "apt-daily-upgrade.timer runs as updates_unattended says",
    ]
    assert ops["apt-daily.timer runs as updates_unattended says"] == [
        "systemctl stop apt-daily.timer",
        "systemctl disable apt-daily.timer",
    ]


def test_holds_are_made_recorded_and_pinned():
    holds = ["sparkrig-lab-standin-kernel", "sparkrig-lab-standin-nvidia-driver=1.0"]
    responses = _host(
        versions=["pkg hold ii  sparkrig-lab-standin-kernel 1.0"],
        files={up_operations.APT_CONF: up_operations.render_apt_conf("off", holds)},
    )
    ops = execute(up.updates, data={"updates_hold": holds}, responses=responses)
    commands = _commands(ops)
    assert list(commands) == [
        f"Version pins ({up_settings.PIN_FILE})",
        "Packages held as updates_hold says (apt-mark)",
        f"What sparkrig holds ({up_facts.RECORD})",
    ]
    assert commands["Packages held as updates_hold says (apt-mark)"][0].endswith(
        "&& apt-mark hold sparkrig-lab-standin-kernel"
    )
    uploads = {path: data for op in ops for path, data in op.uploads.items()}
    assert (
        uploads[atomic.temp_path(up_facts.RECORD)]
        == b"sparkrig-lab-standin-kernel\nsparkrig-lab-standin-nvidia-driver\n"
    )
    assert uploads[atomic.temp_path(up_settings.PIN_FILE)].decode() == up_operations.render_pins(holds)

    # Held and recorded: nothing more to do.
    converged = _host(
        versions=[
            "pkg hold hi  sparkrig-lab-standin-kernel 1.0",
            "held sparkrig-lab-standin-kernel",
            "record sparkrig-lab-standin-kernel",
            "record sparkrig-lab-standin-nvidia-driver",
        ],
        files={
            up_operations.APT_CONF: up_operations.render_apt_conf("off", holds),
            up_settings.PIN_FILE: up_operations.render_pins(holds),
            up_facts.RECORD: "sparkrig-lab-standin-kernel\nsparkrig-lab-standin-nvidia-driver\n",
        },
    )
    assert execute(up.updates, data={"updates_hold": holds}, responses=converged) == []


def test_a_hold_made_by_hand_is_never_released():
    responses = _host(versions=["held linux-image-6.1.0-26-amd64"])
    assert execute(up.updates, responses=responses) == []


def test_releasing_holds_unholds_unpins_upgrades_then_forgets():
    responses = _host(
        versions=[
            "held sparkrig-lab-standin-kernel",
            "record sparkrig-lab-standin-kernel",
            "record sparkrig-lab-standin-nvidia-driver",
        ],
        files={
            up_settings.PIN_FILE: up_operations.render_pins(["sparkrig-lab-standin-nvidia-driver=1.0"]),
            up_facts.RECORD: "sparkrig-lab-standin-kernel\nsparkrig-lab-standin-nvidia-driver\n",
        },
    )
    commands = _commands(execute(up.updates, responses=responses))
    assert list(commands) == [
        f"No version pins ({up_settings.PIN_FILE})",
        "Packages held as updates_hold says (apt-mark)",
        "Upgrade what a released hold kept back",
        f"What sparkrig holds ({up_facts.RECORD})",
    ]
    assert commands["Packages held as updates_hold says (apt-mark)"][0].endswith(
        "&& apt-mark unhold sparkrig-lab-standin-kernel"
    )
    upgrade = commands["Upgrade what a released hold kept back"][0]
    assert upgrade.endswith(
        "install --no-install-recommends --only-upgrade sparkrig-lab-standin-kernel sparkrig-lab-standin-nvidia-driver"
    )


def test_an_upgrade_that_failed_is_tried_again():
    """Unheld but still in the record (the upgrade did not go through): upgrade again."""
    responses = _host(
        versions=["record sparkrig-lab-standin-kernel"], files={up_facts.RECORD: "sparkrig-lab-standin-kernel\n"}
    )
    assert list(_commands(execute(up.updates, responses=responses))) == [
        "Upgrade what a released hold kept back",
        f"What sparkrig holds ({up_facts.RECORD})",
    ]


def test_an_unexpected_kernel_refuses_the_host_before_any_change():
    data = {"updates_expected_kernel": "6.17.0-1007-nvidia", "updates_stop_on_unexpected": True}
    responses = _host(files={up_operations.APT_CONF: None}, timers=(True, True))
    commands = _commands(execute(up.updates, data=data, responses=responses))
    assert list(commands) == ["The box runs the expected kernel and driver (updates_stop_on_unexpected)"]
    (refusal,) = commands["The box runs the expected kernel and driver (updates_stop_on_unexpected)"]
    assert "kernel 6.1.0-26-amd64 is running, updates_expected_kernel is 6.17.0-1007-nvidia" in refusal
    # Without the stop, the deploy only says so and goes on.
    data["updates_stop_on_unexpected"] = False
    assert execute(up.updates, data=data, responses=_host()) == []


@pytest.mark.parametrize(
    ("data", "masked"),
    [
        ({}, True),
        ({"watchdog_enabled": False}, False),
        ({"updates_systemd_oomd": "keep"}, False),
        ({"watchdog_enabled": False, "updates_systemd_oomd": "off"}, True),
    ],
)
def test_systemd_oomd_is_masked_where_earlyoom_is_the_watchdog(data, masked):
    ops = _commands(execute(up.updates, data=data, responses=_host(oomd=(True, True))))
    expected = {"systemd-oomd is masked (earlyoom is the watchdog)": ["systemctl mask --now systemd-oomd.service"]}
    assert ops == (expected if masked else {})


def test_the_deploy_has_the_default_of_watchdog_enabled_which_it_reads():
    """Alone in a user's deploy, updates still knows earlyoom is the watchdog by default."""
    assert up_settings.DEFAULTS["watchdog_enabled"] is True
    assert up.updates._inner.deploy_data["watchdog_enabled"] is True


def test_security_upgrades_install_unattended_upgrades_and_run_the_timers():
    data = {"updates_unattended": "security"}
    responses = _host(
        files={up_operations.APT_CONF: up_operations.render_apt_conf("security", [])}, timers=(False, False)
    )
    ops = _commands(execute(up.updates, data=data, responses=responses))
    assert list(ops) == [
        "Install unattended-upgrades",
        "apt-daily.timer runs as updates_unattended says",
        "apt-daily-upgrade.timer runs as updates_unattended says",
    ]


# The report ---------------------------------------------------------------------------


def _row(**changes):
    facts = up_facts.Versions().process(SPARK)
    for key, value in changes.items():
        facts[key] = value
    return report.row(facts)


def test_a_report_row_holds_one_cell_per_column():
    row = _row()
    assert list(row) == [*report.COLUMNS, *report.GPU_COLUMNS]
    assert row == {
        **dict.fromkeys(report.GPU_COLUMNS, "-"),
        **{
            "os": "ubuntu 24.04",
            "dgx_os": "7.4.0",
            "kernel": "6.17.0-1007-nvidia",
            "kernel_pkgs": "6.17.0-1007.7 6.17.0-1008.8",
            "driver": "580.95.05",
            "driver_pkgs": "580.95.05-0ubuntu1",
            "cuda": "13.0.2",
            "docker": "5:28.5.1-1~ubuntu.24.04~noble",
            "toolkit": "1.18.0-1",
            "torch": "2.11.0",
            "vllm": "0.20.2",
            "reboot": "pending",
            "firmware": "-",
            "known_bad": "-",
            "nccl": "-",
            "boots": "-",
        },
    }


def test_the_odd_host_is_marked():
    rows = {"spark-1": _row(), "spark-2": _row(), "spark-3": _row(kernel="6.17.0-1008-nvidia")}
    assert report.differing(rows) == {"spark-1": [], "spark-2": [], "spark-3": ["kernel"]}
    text = report.table(rows, {"spark-4": "could not connect"})
    lines = text.splitlines()
    assert lines[0].split() == ["host", *report.COLUMNS, *report.GPU_COLUMNS]
    assert "6.17.0-1008-nvidia *" in lines[3] and "*" not in lines[1] + lines[2]
    assert lines[-2:] == ["*: differs from most hosts", "spark-4: not read: could not connect"]


def test_a_hosts_control_characters_never_reach_the_terminal():
    """A hostile host's strings (its os-release, a version, its error) can hold escape
    sequences: the table shows them escaped, one line per host."""
    evil = "\x1b]0;owned\x07\x1b[2J\r\n\x9b31m\u202e"
    rows = {"a": _row(kernel=evil, driver="580\x1b[8m"), "b": _row()}
    text = report.table(rows, {"c": f"FactProcessError: {evil}"})
    assert not any(ch in text for ch in "\x1b\x07\r\x9b\u202e"), repr(text)
    assert "\\x1b]0;owned" in text and "580\\x1b[8m" in text
    assert len(text.splitlines()) == 1 + 2 + 1 + 1  # header, two hosts, the legend, one error


def test_with_no_majority_every_differing_cell_is_marked():
    rows = {"a": _row(kernel="1"), "b": _row(kernel="2")}
    assert report.differing(rows) == {"a": ["kernel"], "b": ["kernel"]}


def test_the_report_names_a_host_it_cannot_reach_and_fails(tmp_path):
    """The real command, against a host whose SSH port refuses: one line for it, exit status 1."""
    inventory = tmp_path / "unreachable.py"
    inventory.write_text('hosts = [("nobody-home", {"ssh_hostname": "127.0.0.1", "ssh_port": 1})]\n')
    result = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "report", str(inventory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nobody-home: not read: could not connect" in result.stdout, result.stdout + result.stderr


# A venv owner's METADATA, as root reads it ---------------------------------------------

REFUSAL = "The box runs the expected kernel and driver (updates_stop_on_unexpected)"


def _venv_lines(tmp_path, metadata: str) -> tuple[list[str], str]:
    """What the fact's venv script (its real text, run by dash) prints for a venv whose
    torch METADATA its owner wrote; and that file's path."""
    info = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "torch-2.11.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(metadata)
    run = subprocess.run(
        ["dash", "-c", up_facts._PYTHON_VERSIONS, "sparkrig-python-versions", str(tmp_path / "venv"), "torch"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines(), str(info / "METADATA")


def _changes(data: dict, responses: dict) -> dict[str, list[str]]:
    """The plan's operations; none where the host stopped at its reading (pyinfra, left
    with no host, says so)."""
    try:
        return _commands(execute(up.updates, data=data, responses=responses))
    except PyinfraError as error:
        assert "No hosts remaining" in str(error)
        return {}


def test_a_forged_record_line_in_a_venvs_metadata_never_releases_a_hold_made_by_hand(tmp_path):
    """The venv's owner adds a second Version: line to torch's METADATA, `record PKG`, PKG
    being a package an admin held by hand: before, it became a line of the fact of its own,
    and the plan unheld and upgraded PKG. Now the field is refused and that host stops,
    naming the file."""
    lines, metadata = _venv_lines(
        tmp_path, "Name: torch\nVersion: 2.11.0\nVersion: record linux-image-6.1.0-26-amd64\n\n"
    )
    responses = _host(versions=["held linux-image-6.1.0-26-amd64", *lines])
    changes = _changes({"python_venv_path": str(tmp_path / "venv")}, responses)
    commands = "\n".join(c for op in changes.values() for c in op)
    assert "unhold" not in commands and "--only-upgrade" not in commands, commands
    with pytest.raises(FactProcessError, match=f"{metadata} holds a newline"):
        up_facts.Versions().process(["kernel 6.1.0-26-amd64", *lines])


def test_a_forged_kernel_line_in_a_venvs_metadata_never_bypasses_updates_stop_on_unexpected(tmp_path):
    """The owner's METADATA says `Version: kernel EXPECTED`: before, that line replaced the
    running kernel's and the host was changed although it runs another kernel."""
    lines, metadata = _venv_lines(tmp_path, "Version: 2.11.0\nVersion: kernel 6.17.0-1007-nvidia\n\n")
    data = {
        "updates_expected_kernel": "6.17.0-1007-nvidia",
        "updates_stop_on_unexpected": True,
        "python_venv_path": str(tmp_path / "venv"),
    }
    responses = _host(versions=lines, files={up_operations.APT_CONF: None}, timers=(True, True))
    assert set(_changes(data, responses)) <= {REFUSAL}
    with pytest.raises(FactProcessError, match=f"{metadata} holds a newline"):
        up_facts.Versions().process(["kernel 6.1.0-26-amd64", *lines])


@pytest.mark.parametrize("version", ["2.9.0 x", "2.9.0\udcff", "$(reboot)"])
def test_a_version_that_is_no_version_fails_that_host_naming_the_file(tmp_path, version):
    lines, metadata = _venv_lines(
        tmp_path, f"Version: {version}\n\n".encode("utf-8", "surrogateescape").decode("latin-1")
    )
    with pytest.raises(FactProcessError, match=f"{metadata}: its Version .* is not a version"):
        up_facts.Versions().process(["kernel 6.1.0-26-amd64", *lines])


def test_a_nul_in_a_version_is_refused_as_a_field(tmp_path):
    """The shell would drop a NUL from a variable unseen: the field travels encoded from the
    file itself, and a NUL in it is refused like a newline, naming the file."""
    lines, metadata = _venv_lines(tmp_path, "Version: 2.9.0\0\n\n")
    with pytest.raises(FactProcessError, match=f"{metadata} holds a newline or NUL"):
        up_facts.Versions().process(["kernel 6.1.0-26-amd64", *lines])
