"""Updates: known-bad versions. The list shipped with sparkrig, the owner's entries checked
alike, the apt preferences that keep a listed version from being installed (checked by the
real validator script and apt), what a host runs matched against the list, the deploy's plan,
and the report's and the fleet page's marks."""

from __future__ import annotations

import subprocess

import pytest

from sparkrig import rendering
from sparkrig.operations import updates as up
from sparkrig.operations.updates import known_bad
from sparkrig.operations.updates import settings as up_settings
from sparkrig.settings import problems
from sparkrig.tools import fleet_page, report
from tests.unit.operations.test_updates import SHIPPED_PINS, SPARK, _host
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state

CMA = "gb10-kernel-7.0.0-1019-cma"
OWNER = {
    "name": "lab-standin-kernel-2",
    "kind": "kernel",
    "reason": "STAND-IN: the lab's kernel package 2.0",
    "links": ["https://sparkrig.invalid/known-bad"],
    "packages": {"sparkrig-lab-standin-kernel": "2.0"},
}


def test_the_shipped_list_is_valid_and_holds_the_cma_kernel_with_its_links():
    entries = known_bad.shipped()
    assert known_bad.list_problem(entries) is None
    (cma,) = [e for e in entries if e["name"] == CMA]
    assert (cma["kind"], cma["profiles"], cma["running"]) == ("kernel", ["gb10"], "7.0.0-1019-*")
    assert cma["links"] == [
        "https://github.com/eugr/spark-vllm-docker/issues/389",
        "https://github.com/eugr/spark-vllm-docker/issues/392",
        "https://github.com/NVIDIA/NV-Kernels/pull/590",
        "https://github.com/NVIDIA/NV-Kernels/pull/591",
    ]
    assert "CmaFree above CmaTotal" in cma["reason"] and "kho=off" in cma["reason"]


def test_the_list_ships_in_the_package():
    """Read through importlib.resources, as the wheel has it (tests/repo/test_wheel.py builds it)."""
    assert (known_bad.resources.files(known_bad.__package__) / "known_bad.toml").is_file()


def test_owner_entries_are_accepted():
    assert problems(up.SETTINGS, {"updates_known_bad": [OWNER]}) == []


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ({"name": "x"}, "not a list"),
        ([{**OWNER, "name": CMA}], "a name twice"),
        ([OWNER, OWNER], "a name twice"),
        ([{**OWNER, "kind": "bios"}], "bad kind"),
        ([{**OWNER, "name": "Bad Name"}], "bad name"),
        ([{**OWNER, "reason": "line\nforged"}], "bad reason"),
        ([{**OWNER, "reason": "\x1b[2Jcleared"}], "bad reason"),
        ([{**OWNER, "links": ["http://insecure.example"]}], "bad links"),
        ([{**OWNER, "links": []}], "bad links"),
        ([{**OWNER, "packages": {"pkg\nPin-Priority: 1000": "2.0"}}], "bad packages"),
        ([{**OWNER, "packages": {"pkg": "2.0\nPin-Priority: 1000"}}], "bad packages"),
        ([{**OWNER, "running": "7.0 ; reboot"}], "bad running"),
        ([{**OWNER, "kind": "firmware"}], "bad device"),
        ([{**OWNER, "device": "System Firmware"}], "bad device"),
        ([{k: v for k, v in OWNER.items() if k != "packages"}], "bad running or packages"),
        ([{**OWNER, "extra": 1}], "bad entry"),
        ([{**OWNER, "profiles": ["gb10", "no spaces"]}], "bad profiles"),
    ],
)
def test_a_bad_entry_is_one_error_naming_key_and_what_is_allowed(entries, expected):
    found = problems(up.SETTINGS, {"updates_known_bad": entries})
    assert len(found) == 1 and "updates_known_bad" in found[0] and expected in found[0], found
    assert "kind (kernel, driver or firmware)" in found[0]


def test_entries_apply_to_their_profiles_and_the_owners_to_every_host():
    assert [e["name"] for e in known_bad.applicable({"hardware_profile": "gb10"})] == [CMA]
    assert known_bad.applicable({"hardware_profile": "hopper"}) == []
    assert [e["name"] for e in known_bad.applicable({"hardware_profile": "hopper", "updates_known_bad": [OWNER]})] == [
        OWNER["name"]
    ]


def test_pins_put_each_listed_version_below_every_other():
    text = known_bad.render_pins([OWNER])
    assert text.endswith(
        "Explanation: known-bad lab-standin-kernel-2\n"
        "Package: sparkrig-lab-standin-kernel\nPin: version 2.0\nPin-Priority: -1\n"
    )
    assert known_bad.render_pins([{**OWNER, "packages": {}, "running": "2.0"}]) is None


def _validate(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "sparkrig-known-bad"
    path.write_text(text)
    script = rendering.script("updates/known-bad-check.sh")
    return subprocess.run(["sh", "-c", script, "sh", str(path)], capture_output=True, text=True, timeout=60)


def test_the_validator_accepts_the_pins_and_refuses_what_would_raise_a_version(tmp_path):
    """The real script and this machine's apt-cache."""
    assert _validate(tmp_path, SHIPPED_PINS).returncode == 0
    assert _validate(tmp_path, known_bad.render_pins([OWNER])).returncode == 0
    raised = known_bad.render_pins([OWNER]).replace("Pin-Priority: -1", "Pin-Priority: 1000")
    assert _validate(tmp_path, raised).returncode != 0
    unexplained = known_bad.render_pins([OWNER]).replace("Explanation: known-bad lab-standin-kernel-2\n", "")
    assert _validate(tmp_path, unexplained).returncode != 0


def _versions(kernel="6.17.0-1032-nvidia", installed=None, driver="580.95.05") -> dict:
    return {"kernel": kernel, "driver": driver, "packages": {"known_bad": installed or {}}}


def test_a_host_running_or_having_installed_a_listed_version_is_named_with_reason_and_links():
    entries = known_bad.applicable({"hardware_profile": "gb10", "updates_known_bad": [OWNER]})
    assert known_bad.running(entries, _versions()) == []
    (line,) = known_bad.running(entries, _versions(kernel="7.0.0-1019-nvidia"))
    assert line.startswith(f"known-bad {CMA} (kernel): running kernel 7.0.0-1019-nvidia: Multi-node serving breaks")
    assert line.endswith("https://github.com/NVIDIA/NV-Kernels/pull/591)")
    installed = {"linux-image-7.0.0-1019-nvidia": "7.0.0-1019.19", "sparkrig-lab-standin-kernel": "2.0"}
    found = known_bad.running(entries, _versions(installed=installed))
    assert known_bad.names(found) == [CMA, OWNER["name"]]
    assert "installed linux-image-7.0.0-1019-nvidia 7.0.0-1019.19" in found[0]
    assert known_bad.running(entries, _versions(installed={"sparkrig-lab-standin-kernel": "1.0"})) == []


def test_the_versions_fact_reads_the_installed_packages_the_entries_name():
    """The Versions fact's own lines, as its dpkg-query prints them for the known_bad column."""
    from sparkrig.operations.updates import facts as up_facts  # noqa: PLC0415

    found = up_facts.Versions().process(
        [*SPARK, "pkg known_bad ii  linux-image-7.0.0-1019-nvidia 7.0.0-1019.19", "pkg known_bad un  linux-nvidia"]
    )
    assert found["packages"]["known_bad"] == {"linux-image-7.0.0-1019-nvidia": "7.0.0-1019.19"}
    entries = known_bad.applicable({"hardware_profile": "gb10"})
    assert known_bad.names(known_bad.running(entries, found)) == [CMA]
    with pytest.raises(Exception, match="dpkg-query printed"):
        up_facts.Versions().process([*SPARK, "pkg nocolumn ii  linux-nvidia 1"])


def test_driver_and_firmware_entries_match_what_runs():
    driver = {**OWNER, "name": "drv", "kind": "driver", "running": "580.95.*", "packages": {}}
    firmware = {**OWNER, "name": "fw", "kind": "firmware", "device": "System Firmware", "running": "2.91"}
    firmware.pop("packages")
    devices = {"devices": [{"name": "System Firmware", "version": "2.91", "guids": []}]}
    found = known_bad.running([driver, firmware], _versions(), devices)
    assert known_bad.names(found) == ["drv", "fw"]
    assert known_bad.running([driver, firmware], _versions(driver="590.1.1"), {"devices": []}) == []


# The plan ---------------------------------------------------------------------------------


def _plan(data: dict, pins: str | None) -> dict[str, list[str]]:
    responses = _host()
    responses[HOST_STATE] = [
        line for line in responses[HOST_STATE] if not line.endswith(up_settings.KNOWN_BAD_FILE)
    ] + host_state(files={up_settings.KNOWN_BAD_FILE: pins})
    return {
        op.name.removeprefix("Updates | "): op.commands for op in execute(up.updates, data=data, responses=responses)
    }


def test_the_deploy_writes_the_pins_validated_and_atomically_then_changes_nothing():
    ops = _plan({"updates_known_bad": [OWNER]}, SHIPPED_PINS)
    name = "Known-bad versions never installed (/etc/apt/preferences.d/sparkrig-known-bad)"
    assert list(ops) == [name]
    assert any("Pin-Priority: -1" in c for c in ops[name]) and any(
        "known-bad-check" in c or "awk" in c for c in ops[name]
    )
    assert (
        _plan({"updates_known_bad": [OWNER]}, SHIPPED_PINS + "\n" + known_bad.render_pins([OWNER]).split("\n", 1)[1])
        == {}
    )
    # No entry for this host: the file goes.
    assert list(_plan({"hardware_profile": "hopper"}, SHIPPED_PINS)) == [
        "No known-bad pins (/etc/apt/preferences.d/sparkrig-known-bad)"
    ]


# The report and the fleet page --------------------------------------------------------------


def test_the_report_and_the_page_mark_a_host_running_a_known_bad_version(tmp_path):
    from sparkrig.operations.updates import facts as up_facts  # noqa: PLC0415

    versions = up_facts.Versions().process(SPARK)
    bad = known_bad.running(
        known_bad.applicable({"hardware_profile": "gb10"}), {**versions, "kernel": "7.0.0-1019-nvidia"}
    )
    facts = {
        "spark-1": {"versions": versions, "firmware": None, "profile": "gb10", "known_bad": []},
        "spark-2": {"versions": versions, "firmware": None, "profile": "gb10", "known_bad": bad},
    }
    found = report.build(facts, {}, "2026-11-28T16:00:00+00:00")
    assert found["hosts"]["spark-2"]["versions"]["known_bad"] == CMA
    assert found["hosts"]["spark-2"]["differs"] == ["known_bad"] and found["hosts"]["spark-1"]["differs"] == []
    assert found["hosts"]["spark-2"]["known_bad"] == bad
    text = report.table({n: h["versions"] for n, h in found["hosts"].items()}, {}, None, {"spark-2": bad})
    assert f"{CMA} *" in text and f"spark-2: known-bad {CMA} (kernel): running kernel 7.0.0-1019-nvidia" in text
    page = fleet_page.render(report.page_hosts(found), columns=report.COLUMNS)
    assert f'<td class="differs" title="runs or has installed a known-bad version (sparkrig report)">{CMA}</td>' in page
