"""Updates: firmware through fwupd. The Firmware fact's parser against fwupdmgr's JSON (files
under data/fwupd/: recorded from the real fwupd in a lab container, or HAND-WRITTEN, as their
names and data/fwupd/README.md say: no real device's output is recorded), its script run for
real (against a STAND-IN fwupdmgr: fwupd has no device to show here), and the plan."""

from __future__ import annotations

import base64
import os
import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig import rendering
from sparkrig.operations import updates as up
from sparkrig.operations.updates import boots
from sparkrig.operations.updates import facts as up_facts
from sparkrig.operations.updates import operations as up_operations
from sparkrig.operations.updates import settings as up_settings
from sparkrig.settings import problems
from sparkrig.tools import fleet_page, report
from tests.unit.operations.test_updates import SHIPPED_PINS, _host
from tests.unit.operations.test_updates import SPARK as SPARK_VERSIONS
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state

DATA = Path(__file__).parent / "data" / "fwupd"
# Recorded: `LC_ALL=C apt-cache policy fwupd` on a Debian 12 box (sparkrig's development machine).
APT_POLICY = (DATA / "apt-cache-policy-fwupd-debian12.txt").read_text()
LAB = (DATA / "get-devices-lab-container-fwupd-2.0.20.json").read_text()  # recorded, real fwupd
NO_DAEMON = (DATA / "get-devices-error-no-daemon-fwupd-2.0.20.json").read_text()  # recorded, real fwupd
SPARK = (DATA / "get-devices-spark-HAND-WRITTEN.json").read_text()  # hand-written
SPARK_UPDATES = (DATA / "get-updates-spark-HAND-WRITTEN.json").read_text()  # hand-written


def line(text: str, what: str = "get-devices", status: int = 0, limit: int = 45) -> str:
    """The script's line for fwupdmgr WHAT's output ``text``."""
    return f"fwupd {what} {status} {limit} {base64.b64encode(text.encode()).decode()}"


def firmware(*lines: str) -> dict:
    return up_facts.Firmware().process(list(lines))


# The parser -------------------------------------------------------------------------------


def test_the_lab_containers_real_fwupd_reports_no_firmware_device():
    """Recorded: fwupd 2.0.20 lists the container's CPU, without a version: no firmware."""
    found = firmware(line(LAB))
    assert found == {"fwupd": "read", "error": "", "devices": [], "updates": [], "reboot": ""}


def test_a_sparks_devices_read_as_name_id_guids_version_vendor():
    """HAND-WRITTEN sample of a Spark (no real Spark's output was at hand)."""
    found = firmware(line(SPARK))
    assert found["fwupd"] == "read"
    assert [(d["name"], d["version"], d["vendor"]) for d in found["devices"]] == [
        ("System Firmware", "2.91", "NVIDIA"),
        ("Embedded Controller", "1.4.2", "NVIDIA"),
        ("ConnectX-7", "28.45.1200", "Mellanox Technologies"),
        ("Samsung SSD 990 PRO 4TB", "4B2QJXD7", "Samsung"),
    ]  # the CPU (no version) is no firmware to keep alike
    system = found["devices"][0]
    assert system["id"] == "a45df35ac0e948ee180fe216a5f703f32dda163f"
    assert system["guids"] == ["6f2e8b9a-1c3d-4e5f-8a7b-9c0d1e2f3a4b"] and "updatable" in system["flags"]
    # The EC's update awaits a reboot (its UpdateState); the needs-reboot flag alone says nothing.
    assert found["reboot"] == "fwupd: firmware awaits a reboot: Embedded Controller (needs-reboot)"


@pytest.mark.parametrize(
    ("state", "name"), [(1, "pending"), (4, "needs-reboot"), (2, "success"), ("pending", "pending")]
)
def test_update_state_as_a_number_or_a_name(state, name):
    text = SPARK.replace('"UpdateState" : "needs-reboot"', f'"UpdateState" : {state!r}'.replace("'", '"'))
    found = firmware(line(text))
    assert found["devices"][1]["update_state"] == name
    assert bool(found["reboot"]) == (name in up_facts.AWAITING_REBOOT)


def test_updates_on_offer_are_read_with_the_newest_release():
    found = firmware(line(SPARK), line(SPARK_UPDATES, "get-updates"))
    assert found["updates"] == [
        {
            "name": "System Firmware",
            "id": "a45df35ac0e948ee180fe216a5f703f32dda163f",
            "version": "2.91",
            "available": "2.92",
        },
        {
            "name": "Embedded Controller",
            "id": "0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c",
            "version": "1.4.2",
            "available": "1.4.3",
        },
    ]
    recorded = (DATA / "get-updates-lab-container-fwupd-2.0.20.json").read_text()  # recorded, real fwupd
    assert firmware(line(LAB), line(recorded, "get-updates"))["updates"] == []
    nothing = firmware(line(SPARK), line('{"Error": {"Message": "No updatable devices"}}', "get-updates", 2))
    assert nothing["updates"] == []


def test_fwupd_that_cannot_answer_is_said_in_its_words_and_fails_no_host():
    """Recorded: the daemon cannot start (a container without the lab's drop-in)."""
    found = firmware(line(NO_DAEMON, status=1))
    assert found["fwupd"] == "error" and found["devices"] == []
    assert found["error"] == (
        "fwupdmgr get-devices exited 1: Failed to connect to daemon: Error calling "
        "StartServiceByName for org.freedesktop.fwupd: Timeout was reached"
    )
    assert firmware(line("", status=124, limit=45))["error"] == "fwupdmgr get-devices did not answer in 45 s: stopped"
    assert firmware("absent") == up_facts.Firmware.default()


@pytest.mark.parametrize(
    "bad",
    [
        line("not json"),
        line('["Devices"]'),
        line('{"Devices": {"Name": "x"}}'),
        line(SPARK.replace("a45df35ac0e948ee180fe216a5f703f32dda163f", "../../etc/passwd")),
        line(SPARK.replace("6f2e8b9a-1c3d-4e5f-8a7b-9c0d1e2f3a4b", "6f2e8b9a; rm -rf /")),
        line(SPARK.replace('"Version" : "2.91"', '"Version" : ["2.91"]')),
        line(SPARK.replace('"Version" : "2.91"', f'"Version" : "{"9" * 300}"')),
        line(SPARK.replace('"UpdateState" : "needs-reboot"', '"UpdateState" : 99')),
        "fwupd get-devices 0 45 !!notbase64",
        "fwupd get-devices x 45 e30=",
        "fwupd rm-rf 0 45 e30=",
        "kernel 6.1.0",
    ],
)
def test_bytes_the_parser_cannot_read_fail_that_host(bad):
    with pytest.raises(FactProcessError, match="Firmware: cannot read the host's output"):
        firmware(bad)


# The script, run for real (fwupdmgr is a STAND-IN: no fwupd device on this machine) ---------


def _run_script(tmp_path, stand_in: str, limit: int = 45, *whats: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "fwupdmgr"  # STAND-IN for fwupd's fwupdmgr
    fake.write_text(f"#!/bin/sh\n{stand_in}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        [
            "sh",
            "-c",
            rendering.script("updates/firmware.sh"),
            "sparkrig-firmware",
            str(limit),
            *(whats or ("get-devices",)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )


def test_the_script_sends_fwupdmgrs_json_which_the_fact_reads(tmp_path):
    (tmp_path / "spark.json").write_text(SPARK)
    result = _run_script(tmp_path, f'[ "$1 $2" = "get-devices --json" ] && cat {tmp_path}/spark.json')
    assert result.returncode == 0, result.stderr
    assert firmware(*result.stdout.splitlines()) == firmware(line(SPARK))


def test_a_fwupdmgr_that_hangs_is_stopped_at_the_limit(tmp_path):
    """fwupdmgr waits on fwupd over D-Bus: a wedged daemon must not hang the reading."""
    result = _run_script(tmp_path, "exec sleep 600", 1)
    found = firmware(*result.stdout.splitlines())
    assert found["fwupd"] == "error" and found["error"] == "fwupdmgr get-devices did not answer in 1 s: stopped"


@pytest.mark.parametrize(
    ("policy", "expected", "error"),
    [
        (APT_POLICY, "absent 2.0.20-1~deb12u2\n", ""),
        ("", "absent (none)\n", up_facts.NOT_INSTALLABLE),  # "Unable to locate package fwupd"
    ],
)
def test_no_fwupdmgr_reads_as_absent_saying_whether_apt_can_install_it(tmp_path, policy, expected, error):
    """A STAND-IN apt-cache prints the recorded policy; the script's real sed and head read it."""
    stand_in = tmp_path / "apt-cache"
    stand_in.write_text(f"#!/bin/sh\ncat <<'EOF'\n{policy}EOF\n")
    stand_in.chmod(0o755)
    for tool in ("sed", "head", "cat"):
        (tmp_path / tool).symlink_to(f"/usr/bin/{tool}")
    script = rendering.script("updates/firmware.sh")
    result = subprocess.run(
        ["/bin/sh", "-c", script, "sparkrig-firmware", "45", "get-devices"],
        env={"PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.stdout == expected
    found = firmware(*result.stdout.splitlines())
    assert (found["fwupd"], found["error"]) == ("absent", error)
    assert report.firmware_summary(found) == "fwupd not installed" + (f": {error}" if error else "")


# Settings -------------------------------------------------------------------------------------


def test_firmware_settings_accept_names_and_guids():
    data = {
        "updates_firmware": "apply",
        "updates_expected_firmware": {"System Firmware": "2.91", "6f2e8b9a-1c3d-4e5f-8a7b-9c0d1e2f3a4b": "1.4.2"},
    }
    assert problems(up.SETTINGS, data) == []
    assert up_settings.SETTINGS  # declared once, in the updates concern


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"updates_firmware": "yes"}, "allowed is one of 'off', 'report', 'apply'"),
        ({"updates_expected_firmware": ["System Firmware"]}, "allowed is a mapping of a device"),
        ({"updates_expected_firmware": {"System Firmware": 2.91}}, "(bad version of 'System Firmware': 2.91)"),
        ({"updates_expected_firmware": {"EC": "1.0; reboot"}}, "(bad version of 'EC': '1.0; reboot')"),
        ({"updates_expected_firmware": {" EC": "1.0"}}, "(bad device: ' EC')"),
        ({"updates_expected_firmware": {"E\nC": "1.0"}}, "bad device"),
    ],
)
def test_bad_firmware_settings_say_key_and_what_is_allowed(data, expected):
    found = problems(up.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


# The plan -------------------------------------------------------------------------------------

FIRMWARE = "sparkrig-firmware"


def _ops(
    data: dict, fwupd: str | None = "2.0.20-1", *lines: str, candidate: str | None = "2.0.20-1"
) -> dict[str, list[str]]:
    """The plan for a converged host with fwupd installed (or not) and fwupdmgr printing ``lines``."""
    responses = _host()
    responses[HOST_STATE] = host_state(
        files={
            up_settings.PIN_FILE: None,
            up_settings.KNOWN_BAD_FILE: SHIPPED_PINS,
            up_operations.APT_CONF: up_operations.render_apt_conf("off", []),
            up_facts.RECORD: None,
            boots.JOURNALD_DROP_IN: boots.render_journald(),
        },
        units={timer: (False, False) for timer in up_operations.TIMERS},
        packages={up_operations.UNATTENDED_PACKAGE: None, up_operations.FWUPD_PACKAGE: fwupd},
    )
    responses[FIRMWARE] = list(lines)
    responses["apt-cache policy"] = APT_POLICY.splitlines() if candidate else []
    return {
        op.name.removeprefix("Updates | "): op.commands for op in execute(up.updates, data=data, responses=responses)
    }


def test_report_installs_fwupd_where_missing_and_asks_it_nothing():
    ops = _ops({}, None)
    assert list(ops) == ["Install fwupd (updates_firmware)"]
    assert "fwupd" in ops["Install fwupd (updates_firmware)"][-1]
    # A failed install (the lists named it, the download failed) fails nothing in "report".
    assert ops["Install fwupd (updates_firmware)"][-1].endswith("the deploy goes on without'")
    assert _ops({}) == {}  # installed: nothing, and fwupd is not asked during a deploy
    assert _ops({"updates_firmware": "off"}, None) == {}


def test_report_where_apt_cannot_install_fwupd_changes_nothing_and_says_so(caplog):
    """An offline box ("Unable to locate package fwupd"): no install tried, the concern goes on."""
    caplog.set_level("INFO")
    assert _ops({}, None, candidate=None) == {}
    assert f"updates: firmware not read: {up_facts.NOT_INSTALLABLE}" in caplog.text


def test_apply_where_apt_cannot_install_fwupd_still_tries_and_may_fail():
    ops = _ops({"updates_firmware": "apply"}, None, candidate=None)
    (command,) = ops["Install fwupd (updates_firmware)"]
    assert "could not be installed" not in command  # "apply" insists: apt's failure fails the host


def test_apply_installs_what_fwupd_offers_and_marks_the_reboot():
    ops = _ops({"updates_firmware": "apply"}, "2.0.20-1", line(SPARK), line(SPARK_UPDATES, "get-updates"))
    # The EC's update already awaits a reboot: only the system firmware is updated.
    (name,) = ops
    assert name == "Firmware updated through fwupd (System Firmware 2.91 -> 2.92), reboot marked"
    (command,) = ops[name]
    assert "fwupdmgr update --assume-yes --no-reboot-check" in command and "/run/reboot-required" in command


def test_apply_with_nothing_on_offer_changes_nothing():
    assert (
        _ops({"updates_firmware": "apply"}, "2.0.20-1", line(SPARK.replace('"UpdateState" : "needs-reboot",', "")))
        == {}
    )
    assert _ops({"updates_firmware": "apply"}, "2.0.20-1", line(NO_DAEMON, status=1)) == {}


# The report and the fleet page --------------------------------------------------------------


def _fleet(**hosts) -> dict:
    """tools.report's JSON report of hosts given as name=(profile, get-devices JSON or None)."""
    versions = up_facts.Versions().process(SPARK_VERSIONS)
    facts = {
        name: {"versions": versions, "profile": profile, "firmware": firmware(line(text)) if text is not None else None}
        for name, (profile, text) in hosts.items()
    }
    return report.build(facts, {}, "2026-11-26T16:00:00+00:00")


SYSTEM = "System Firmware {6f2e8b9a-1c3d-4e5f-8a7b-9c0d1e2f3a4b}"
EC = "Embedded Controller {1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d}"
# The recorded Spark with no update awaiting its reboot (SPARK's EC awaits one).
SETTLED = SPARK.replace('"UpdateState" : "needs-reboot",', "")


def test_drift_is_the_same_device_at_another_version_on_boxes_of_one_profile():
    older = SETTLED.replace('"Version" : "2.91"', '"Version" : "2.90"')
    found = _fleet(
        **{
            "spark-1": ("gb10", SETTLED),
            "spark-2": ("gb10", SETTLED),
            "spark-3": ("gb10", older),
            # another kind of box: its older system firmware is no drift of the Sparks'
            "ws-1": ("rtx50", older),
        }
    )
    hosts = found["hosts"]
    assert hosts["spark-3"]["firmware"]["drift"] == [SYSTEM]
    assert hosts["spark-3"]["firmware"]["devices"][SYSTEM] == "2.90"
    assert [hosts[n]["firmware"]["drift"] for n in ("spark-1", "spark-2", "ws-1")] == [[], [], []]
    assert hosts["spark-3"]["differs"] == ["firmware"] and hosts["spark-1"]["differs"] == []
    assert hosts["spark-1"]["versions"]["firmware"] == "4 devices"


def test_the_report_says_fwupd_reports_no_devices_and_marks_drift(tmp_path):
    older = SETTLED.replace('"Version" : "2.91"', '"Version" : "2.90"')
    found = _fleet(
        **{
            "lab-deb12": ("unmatched", LAB),
            "spark-1": ("gb10", SETTLED),
            "spark-2": ("gb10", older),
            "spark-3": ("gb10", SETTLED),
        }
    )
    assert found["hosts"]["lab-deb12"]["versions"]["firmware"] == "fwupd reports no devices"
    text = report.table(
        {n: v["versions"] for n, v in found["hosts"].items()}, {}, {n: v["firmware"] for n, v in found["hosts"].items()}
    )
    lines = text.splitlines()
    assert any(re.fullmatch(r"lab-deb12\s+unmatched\s+fwupd reports no devices", x) for x in lines), text
    assert any(re.fullmatch(rf"spark-2\s+gb10\s+{re.escape(SYSTEM)}\s+2\.90 \*", x) for x in lines), text
    assert not any(x.startswith("spark-1") and x.endswith("*") for x in lines), text
    assert lines[-1] == "*: firmware differs from most hosts of its hardware profile"
    page = fleet_page.render(report.page_hosts(found), columns=report.COLUMNS)
    section = page[page.index("<h2>Firmware</h2>") :]
    assert "fwupd reports no devices" in section
    assert re.search(
        r'<tr data-host="spark-2" data-status="drift">.*<td class="differs" title="differs from most '
        r'gb10 hosts \(others: 2\.91\)">2\.90</td></tr>',
        section,
    ), section[:3000]
    assert '<tr data-host="spark-1" data-status="ok">' in section


def test_a_hosts_device_name_is_escaped_on_the_page_and_in_the_terminal():
    evil = SPARK.replace('"Name" : "ConnectX-7"', '"Name" : "<script>x</script>\\u001b[2J"')
    found = _fleet(**{"a": ("gb10", evil)})
    page = fleet_page.render(report.page_hosts(found), columns=report.COLUMNS)
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    text = report.table(
        {n: v["versions"] for n, v in found["hosts"].items()}, {}, {n: v["firmware"] for n, v in found["hosts"].items()}
    )
    assert "\x1b" not in text and "\\x1b[2J" in text


# The compliance control, run on fwupdmgr's answers (through the suite's own reads layer) -----


def _control(expected: dict, stdout: str, rc: int = 0) -> str | None:
    """What tests/compliance/test_updates.py's firmware control says of a host whose fwupdmgr
    prints ``stdout`` (None: it passed)."""
    from tests.compliance import reads, test_updates  # noqa: PLC0415 - testinfra, only here

    settings = {"updates_expected_firmware": expected}
    asked = reads.Reader("spark", settings, {})
    test_updates.firmware(asked)
    answers = {command: (rc, stdout.encode(), b"") for command in asked.wanted}
    return _said(test_updates.test_the_firmware_is_the_expected_version, settings, answers)


def _said(control, settings: dict, answers: dict) -> str | None:
    """The first line of what ``control`` fails with, its reads answered from ``answers``
    through the suite's own reads layer (None: it passed)."""
    from tests.compliance import reads  # noqa: PLC0415 - testinfra, only here

    def read(need):
        return need(reads.Reader("spark", settings, answers))

    try:
        control(read, settings)
    except AssertionError as error:
        return str(error).split("\n")[0]
    return None


def test_the_control_passes_when_each_device_has_its_expected_version():
    """HAND-WRITTEN sample: by name, and by GUID (any case)."""
    assert _control({"System Firmware": "2.91", "1A2B3C4D-5E6F-4A7B-8C9D-0E1F2A3B4C5D": "1.4.2"}, SPARK) is None


def test_the_control_fails_naming_device_expected_and_actual():
    assert _control({"System Firmware": "2.92"}, SPARK) == (
        "firmware of System Firmware is 2.91, updates_expected_firmware says 2.92"
    )


def test_the_control_fails_naming_a_device_that_is_not_present():
    assert _control({"ConnectX-8": "1.0"}, SPARK) == (
        "firmware device 'ConnectX-8' is not present (fwupd reports: ConnectX-7, Embedded Controller, "
        "Samsung SSD 990 PRO 4TB, System Firmware)"
    )
    # Recorded: the lab's real fwupd, which lists the container's CPU without a version.
    assert _control({"System Firmware": "2.91"}, LAB) == (
        "firmware device 'System Firmware' is not present (fwupd reports no devices)"
    )


def test_the_control_fails_where_fwupd_does_not_answer():
    assert _control({"System Firmware": "2.91"}, NO_DAEMON, 1).startswith(
        "fwupdmgr get-devices exited 1: Failed to connect to daemon"
    )
    assert _control({"System Firmware": "2.91"}, "", 124) == "fwupdmgr get-devices did not answer in 45 s"


def test_the_controls_fwupdmgr_is_stopped_at_its_limit(tmp_path, monkeypatch):
    """The need's real command, run here as the suite sends it (from /, as root: through sudo
    unless root already), against a STAND-IN fwupdmgr that hangs."""
    from tests.compliance import reads, test_updates  # noqa: PLC0415 - testinfra, only here

    monkeypatch.setattr(test_updates, "FWUPD_TIMEOUT_S", 1)
    if os.getuid() != 0:
        pytest.skip("the need runs fwupdmgr as root (sudo -n): run as root")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fwupdmgr").write_text("#!/bin/sh\nexec sleep 600\n")  # STAND-IN for fwupd's fwupdmgr
    (bin_dir / "fwupdmgr").chmod(0o755)
    asked = reads.Reader("spark", {"updates_expected_firmware": {"System Firmware": "2.91"}}, {})
    test_updates.firmware(asked)
    (command,) = asked.wanted
    result = subprocess.run(
        ["sh", "-c", command],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 124
    assert _control({"System Firmware": "2.91"}, "", result.returncode) == "fwupdmgr get-devices did not answer in 1 s"


def test_firmware_installed_and_awaiting_its_reboot_is_drift_until_then():
    found = _fleet(**{"spark-1": ("gb10", SETTLED), "spark-2": ("gb10", SPARK), "spark-3": ("gb10", SETTLED)})
    hosts = found["hosts"]
    assert hosts["spark-2"]["firmware"]["awaiting_reboot"] == [EC]
    assert hosts["spark-2"]["firmware"]["drift"] == [EC] and hosts["spark-2"]["differs"] == ["firmware"]
    assert [hosts[n]["firmware"]["drift"] for n in ("spark-1", "spark-3")] == [[], []]
    text = report.table({n: v["versions"] for n, v in hosts.items()}, {}, {n: v["firmware"] for n, v in hosts.items()})
    lines = text.splitlines()
    assert any(
        re.fullmatch(rf"spark-2\s+gb10\s+{re.escape(EC)}\s+\S+ \(installed, runs after a reboot\)", x) for x in lines
    ), text
    assert lines[-1] == f"{report.WAITING}: firmware installed by fwupd, running only after a reboot (drift until then)"
    assert "*: firmware differs" not in text


def _unattended(mode: str, dump: str) -> str | None:
    """What tests/compliance/test_updates.py's unattended-upgrades control says of a host whose
    ``apt-config dump`` prints ``dump`` and whose timers are not there (None: it passed)."""
    from tests.compliance import reads, test_updates  # noqa: PLC0415 - testinfra, only here

    settings = {"updates_unattended": mode}
    apt_config = test_updates.state(reads.Reader("spark", settings, {}))["apt_config"].text
    asked = reads.Reader("spark", settings, {})
    test_updates.state(asked)
    answers = {command: (4, b"", b"") for command in asked.wanted}  # systemctl: no such unit
    answers[apt_config] = (0, dump.encode(), b"")
    return _said(test_updates.test_unattended_upgrades_are_as_the_owner_set_them, settings, answers)


def test_the_unattended_control_says_what_apt_says_and_what_it_should():
    """On the lent GPU machine, never converged, it said `updates_unattended is 'off': []`."""
    assert _unattended("off", 'APT::Periodic::Unattended-Upgrade "0";\n') is None
    assert _unattended("off", 'APT::Periodic::Unattended-Upgrade "1";\n') == (
        'updates_unattended is \'off\', so apt-config should say APT::Periodic::Unattended-Upgrade "0"; it says "1"'
    )
    assert _unattended("off", 'APT::Architecture "amd64";\n') == (
        "updates_unattended is 'off', so apt-config should say APT::Periodic::Unattended-Upgrade \"0\"; "
        "it says nothing (no file of apt.conf.d sets it)"
    )
