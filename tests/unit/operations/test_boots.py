"""How every boot ended: the fact's own script run on a real journal recorded from a lab host (its
rollout reboot, a reboot by hand, a kill from outside, a poweroff, and a user's forged lines),
the classifier's every decision, the journald drop-in's validator, the deploy's plan, the
collector's gauges, the rollout's mark and the report's column."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkrig.operations import metrics as _metrics  # noqa: F401 - declares the metrics settings
from sparkrig.operations import updates as up
from sparkrig.operations.metrics import deploy as md
from sparkrig.operations.updates import boots
from sparkrig.operations.updates import operations as up_operations
from sparkrig.settings import all_settings, problems
from sparkrig.tools import fleet_page, report
from sparkrig.tools.rollout_reboot import PyinfraHosts
from tests.compliance import test_updates as updates_control
from tests.unit.operations.test_updates import _host
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state

DATA = Path(__file__).parent / "data" / "boots"
JOURNALCTL = shutil.which("journalctl")

# The lab host's boots, oldest first (data/boots/README.md says how each was made).
ROLLOUT = "7a22835ddf42406a922400c33972cb42"  # rollout's mark (root) then a reboot; a user's forged mark too
BY_HAND = "026f59154d0b41ca98672e85ec466d3d"  # systemctl reboot by root, no mark
KILLED = "6bb04cb8cdee4ff0b405ec8f9493a0d9"  # the nspawn killed with SIGKILL
FORGED = "f8ad8188e99c4f50866f6ca6846c039a"  # a user forged a reboot target, a mark, OOM lines; then killed
POWEROFF = "ad14bbea302643be8a99d75f33272caf"  # systemctl poweroff
FORGED_MARK = "1d75409f69ac4456b5f4375ffcb309cf"  # a user's forged marks, then root's reboot (not the rollout's)
EXPECTED = {
    ROLLOUT: boots.ROLLOUT_REBOOT,
    BY_HAND: boots.REBOOT,
    KILLED: boots.POWER_LOST,
    FORGED: boots.POWER_LOST,
    POWEROFF: boots.SHUTDOWN,
    FORGED_MARK: boots.REBOOT,
}


def _ends(history: dict) -> dict[str, str]:
    return {boot["boot_id"]: boot["ended"] for boot in history["boots"]}


def test_the_recorded_output_of_the_lab_host_is_classified_right():
    history = boots.parse((DATA / "lab-deb12-boots.txt").read_text().splitlines())
    assert _ends(history) == EXPECTED
    assert history["pstore_unit"] == "enabled" and history["pstore"] == []
    assert [b["boot_id"] for b in history["boots"]] == list(EXPECTED)  # oldest first


def _journal(tmp_path: Path) -> Path:
    with tarfile.open(DATA / "lab-deb12-journal.tar.xz") as archive:
        archive.extractall(tmp_path / "journal", filter="data")
    (machine,) = (tmp_path / "journal").iterdir()
    return machine


def _stand_ins(tmp_path: Path, journal: Path, unit_state: str = "enabled") -> dict:
    """journalctl reading the recorded journal (the real program), systemctl answering the unit."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text(f'#!/bin/sh\nexec {JOURNALCTL} --directory={journal} "$@"\n')
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho '{boots.PSTORE_UNIT} {unit_state} enabled'\n")
    for name in ("journalctl", "systemctl"):
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _run_fact(env: dict, count: int = 10, pstore: tuple[str, ...] = ()) -> dict:
    command = boots.BootHistory().command(count=count, pstore=pstore).get_raw_value()
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True, env=env, timeout=60)
    return boots.BootHistory().process(result.stdout.splitlines())


def _need_journalctl():
    if not JOURNALCTL:
        if os.environ.get("CI") == "true":
            pytest.fail("journalctl is missing (Debian's systemd package)")
        pytest.skip("needs journalctl (Debian's systemd package) to read the recorded journal")


def test_the_facts_script_reads_the_real_journal_and_no_users_line_changes_a_boots_end(tmp_path):
    """The real journalctl on the lab host's real journal: every boot as it ended. The user's
    forged lines (a mark by logger, a reboot target, _PID=1, _UID=0, _TRANSPORT=kernel and OOM
    lines by logger --journald) are in that journal: they change nothing."""
    _need_journalctl()
    journal = _journal(tmp_path)
    history = _run_fact(_stand_ins(tmp_path, journal))
    assert _ends(history) == EXPECTED
    # The user's forged entries really are there: only the filters keep them out.
    raw = subprocess.run(
        [JOURNALCTL, f"--directory={journal}", "-b", FORGED, "-o", "json", "UNIT=reboot.target"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert {json.loads(line)["_UID"] for line in raw} == {"1000"}


def test_the_count_bounds_the_boots_read(tmp_path):
    _need_journalctl()
    history = _run_fact(_stand_ins(tmp_path, _journal(tmp_path)), count=2)
    assert list(_ends(history)) == [POWEROFF, FORGED_MARK]


def test_pstore_dumps_are_read_and_make_an_unclean_end_a_panic(tmp_path):
    """A dump dated within the killed boot (or in the next one's first minutes, where
    systemd-pstore moved it): that boot was a panic. Names as the kernel's backends write them."""
    _need_journalctl()
    env = _stand_ins(tmp_path, _journal(tmp_path))
    kernel, kept = tmp_path / "pstore", tmp_path / "kept"
    (kept / "179589526800001").mkdir(parents=True)
    kernel.mkdir()
    dump = kept / "179589526800001" / "dmesg-efi-179589526800001"
    dump.write_text("Kernel panic - not syncing\n")
    killed = boots.parse((DATA / "lab-deb12-boots.txt").read_text().splitlines())["boots"][2]
    os.utime(dump, (killed["end"] + 1, killed["end"] + 1))
    (kernel / "console-ramoops-0").write_text("old\n")
    os.utime(kernel / "console-ramoops-0", (1_000_000_000, 1_000_000_000))  # long before every boot
    history = _run_fact(env, pstore=(str(kernel), str(kept)))
    assert _ends(history)[KILLED] == boots.PANIC
    assert {d["name"] for d in history["pstore"]} == {"console-ramoops-0", "179589526800001/dmesg-efi-179589526800001"}
    assert _ends(history)[FORGED] == boots.POWER_LOST  # the dump is not its


def test_the_recorded_output_of_a_machine_without_a_journal_is_no_boots():
    history = boots.parse((DATA / "dev-machine-boots.txt").read_text().splitlines())
    assert history == {"boots": [], "pstore": [], "pstore_unit": "enabled"}
    assert boots.summary(history) == "-" and boots.unclean(history) == 0


def test_no_journal_is_no_boots(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("journalctl", "systemctl"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    assert _run_fact(env, pstore=(str(tmp_path / "none"),)) == {"boots": [], "pstore": [], "pstore_unit": None}


# Every decision of the classifier (entries in journalctl's JSON shape, as recorded) -----------

START, NEXT = 1_000_000.0, 2_000_000.0


def _entry(at: float, **fields) -> dict:
    return {"__REALTIME_TIMESTAMP": str(int(at * 1e6)), **fields}


def _target(unit: str, at: float = NEXT - 10, **changes) -> dict:
    return _entry(at, **{"UNIT": unit, "JOB_TYPE": "start", "JOB_RESULT": "done", **changes})


def _classify(last=NEXT - 5, target=(), mark=(), oom=(), dumps=()) -> str:
    found = {"last": [_entry(last)], "target": list(target), "mark": list(mark), "oom": list(oom)}
    return boots.classify("a" * 32, START, found, dumps)["ended"]


@pytest.mark.parametrize(
    ("unit", "ended"),
    [
        ("reboot.target", boots.REBOOT),
        ("kexec.target", boots.REBOOT),
        ("poweroff.target", boots.SHUTDOWN),
        ("halt.target", boots.SHUTDOWN),
        ("multi-user.target", boots.POWER_LOST),
    ],
)
def test_the_shutdown_target_pid1_reached_says_the_end(unit, ended):
    assert _classify(target=[_target(unit)]) == ended


@pytest.mark.parametrize("changes", [{"JOB_TYPE": "stop"}, {"JOB_RESULT": "failed"}])
def test_a_target_not_reached_is_no_shutdown(changes):
    assert _classify(target=[_target("reboot.target", **changes)]) == boots.POWER_LOST


def test_the_rollouts_mark_counts_only_just_before_a_reboot():
    assert _classify(target=[_target("reboot.target")], mark=[_entry(NEXT - 60)]) == boots.ROLLOUT_REBOOT
    # A mark from a reboot that did not happen, hours before someone's reboot.
    assert _classify(target=[_target("reboot.target")], mark=[_entry(NEXT - 7200)]) == boots.REBOOT
    # A poweroff after the mark is a shutdown.
    assert _classify(target=[_target("poweroff.target")], mark=[_entry(NEXT - 60)]) == boots.SHUTDOWN


def _owned(dump_time: float, previous_clean: bool) -> dict[str, list]:
    order, starts = ["a" * 32, "b" * 32], {"a" * 32: START, "b" * 32: NEXT}
    target = [_target("reboot.target")] if previous_clean else []
    found_of = {"a" * 32: {"last": [], "target": target, "mark": [], "oom": []}}
    return {
        boot: [d["time"] for d in dumps]
        for boot, dumps in boots._owners(order, starts, found_of, [{"name": "d", "time": dump_time}]).items()
    }


def test_a_dump_is_the_boot_it_is_dated_in_or_an_unclean_one_before_it():
    assert _owned(NEXT - 30, previous_clean=False) == {"a" * 32: [NEXT - 30]}
    # Moved by systemd-pstore early in the next boot: the unclean boot before's.
    assert _owned(NEXT + boots.PSTORE_GRACE_S - 1, previous_clean=False) == {
        "a" * 32: [NEXT + boots.PSTORE_GRACE_S - 1]
    }
    assert _owned(NEXT + boots.PSTORE_GRACE_S + 1, previous_clean=False) == {
        "b" * 32: [NEXT + boots.PSTORE_GRACE_S + 1]
    }
    # After a clean end, a dump early in the next boot is that boot's own.
    assert _owned(NEXT + 5, previous_clean=True) == {"b" * 32: [NEXT + 5]}
    assert _owned(START - 1, previous_clean=False) == {}


def test_a_dump_makes_an_unclean_end_a_panic_and_only_that():
    dump = {"name": "dmesg-ramoops-0", "time": int(NEXT - 30)}
    assert _classify(dumps=[dump]) == boots.PANIC
    assert _classify() == boots.POWER_LOST
    assert _classify(target=[_target("reboot.target")], dumps=[dump]) == boots.REBOOT


def test_an_oom_storm_is_kills_near_the_end():
    end = NEXT - 5
    near = [_entry(end - 10), _entry(end - boots.OOM_WINDOW_S + 1)]
    assert _classify(last=end, oom=near) == boots.OOM
    assert _classify(last=end, oom=near[:1]) == boots.POWER_LOST  # one kill is no storm
    assert _classify(last=end, oom=[_entry(end - 10), _entry(end - boots.OOM_WINDOW_S - 1)]) == boots.POWER_LOST
    assert _classify(last=end, oom=near, dumps=[{"name": "dmesg-efi-1", "time": int(end)}]) == boots.PANIC


@pytest.mark.parametrize(
    "line",
    [
        "-1 7a22835ddf42406a922400c33972cb42 garbage",
        "## boot 7a22835ddf42406a922400c33972cb4\x1b",
        "## pstore\n1795895200 dmesg\x1b[2J",
    ],
)
def test_output_the_parser_cannot_read_fails_the_host(line):
    with pytest.raises(ValueError):
        boots.parse(["## boots", *line.split("\n")])


def test_a_boot_the_list_does_not_name_fails_the_host():
    with pytest.raises(ValueError, match="not in the journal's list"):
        boots.parse(["## boots", f"## boot {ROLLOUT}", "# last"])


# The journald drop-in, the deploy's plan ------------------------------------------------------


def _validate(text: str, tmp_path: Path) -> int:
    path = tmp_path / "drop-in.conf"
    path.write_text(text)
    return subprocess.run([*up_operations.JOURNALD_VALIDATOR, str(path)], capture_output=True, check=False).returncode


def test_the_validator_takes_the_drop_in_and_refuses_what_journald_would_skip(tmp_path):
    assert _validate(boots.render_journald(), tmp_path) == 0
    assert _validate("[Journal]\nStorage=persistent\nStorage persistent\n", tmp_path) != 0
    assert _validate("Storage=persistent\n", tmp_path) != 0  # no section
    assert _validate("[Journal]\nStorage=persistent\n[Other]\n", tmp_path) != 0
    assert _validate("[Journal]\nStorage=$(reboot)\n", tmp_path) != 0


def _names(data=None, files=None, units=None) -> list[str]:
    responses = _host(files=files)
    responses[HOST_STATE] = [
        line for line in responses[HOST_STATE] if not line.endswith(tuple(units or ()))
    ] + host_state(units=units)
    return [op.name.removeprefix("Updates | ") for op in execute(up.updates, data=data or {}, responses=responses)]


WRITE = f"The journal kept across boots ({boots.JOURNALD_DROP_IN})"


def test_the_drop_in_is_written_journald_restarted_and_a_second_run_changes_nothing():
    assert _names(files={boots.JOURNALD_DROP_IN: None}, units={"systemd-journald.service": (True, True)}) == [
        WRITE,
        "journald takes the drop-in",
    ]
    assert _names(units={"systemd-journald.service": (True, True)}) == []
    assert _names(files={boots.JOURNALD_DROP_IN: "[Journal]\nStorage=volatile\n"}) == [WRITE]


def test_boot_history_off_removes_sparkrigs_drop_in_and_enables_nothing():
    off = {"updates_boot_history": False}
    assert _names(off) == [f"No journald drop-in ({boots.JOURNALD_DROP_IN})"]
    assert _names(off, files={boots.JOURNALD_DROP_IN: None}, units={boots.PSTORE_UNIT: (False, False)}) == []


def test_pstore_is_enabled_only_where_the_host_has_it_disabled():
    assert _names(units={boots.PSTORE_UNIT: (False, False)}) == ["Kernel crash dumps collected (systemd-pstore)"]
    assert _names(units={boots.PSTORE_UNIT: (False, True)}) == []
    assert _names() == []  # no such unit on the host: nothing assumed


@pytest.mark.parametrize(
    ("data", "key"),
    [({"updates_boot_history": "yes"}, "updates_boot_history"), ({"updates_boot_count": 0}, "updates_boot_count")],
)
def test_bad_values_say_key_and_what_is_allowed(data, key):
    (problem,) = problems(all_settings(), data)
    assert key in problem


# The collector's gauges, the rollout's mark, the report -----------------------------------------


def _collector_boots(env: dict, cwd: Path) -> list[str]:
    script = md.render_collector("", 5)
    body = script[script.index("whole() {") : script.index("\nmetric() {")] + "\n"
    body += script[script.index("boots() {") : script.index("\ncompliance() {")]
    program = "WAIT=30\nmetric() { :; }\n" + body + "\nboots\n"
    said = subprocess.run(
        ["sh", "-c", program], capture_output=True, text=True, check=True, env=env, cwd=cwd, timeout=60
    )
    return said.stdout.splitlines()


def test_the_collector_counts_the_unclean_ends_of_the_real_journal_once_per_boot(tmp_path):
    """The collector's boots() on the recorded journal: two boots killed, five read of five
    asked; read again in the same boot, the journal is not asked (its answer kept, per boot)."""
    _need_journalctl()
    env = _stand_ins(tmp_path, _journal(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    expected = ["sparkrig_boots_classified 5", "sparkrig_boots_unclean 2", "sparkrig_boot_previous_unclean 0"]
    assert _collector_boots(env, out) == expected
    (tmp_path / "bin" / "journalctl").write_text("#!/bin/sh\nexit 1\n")  # asked again: no metrics
    assert _collector_boots(env, out) == expected
    (out / ".sparkrig-boots.5").write_text("another-boot 5 0 0\n")  # another boot's: read anew
    assert _collector_boots(env, out) == []
    off = md.render_collector("", 0)
    assert "journalctl --list-boots" not in off


def test_the_rollouts_reboot_logs_its_mark_as_root_first():
    said = []
    remote = PyinfraHosts.__new__(PyinfraHosts)
    remote.root = lambda host, command: said.append(command)
    remote.reboot("spark-01")
    (command,) = said
    assert command.startswith(f"logger -t {boots.ROLLOUT_MARK} ") and command.index("logger") < command.index("reboot")


def test_the_report_shows_the_ends_and_marks_an_unclean_one():
    history = boots.parse((DATA / "lab-deb12-boots.txt").read_text().splitlines())
    assert boots.summary(history) == "rollout-reboot, reboot, power-lost, power-lost, shutdown, reboot"
    assert boots.unclean(history) == 2
    clean = {**history, "boots": [b for b in history["boots"] if b["ended"] not in boots.UNCLEAN]}
    rows = {"a": {"boots": boots.summary(history)}, "b": {"boots": boots.summary(clean)}}
    rows = {name: {**dict.fromkeys(report.COLUMNS, "-"), **cells} for name, cells in rows.items()}
    marks = report.differing(rows, {})
    assert "boots" in marks["a"] and "boots" not in marks["b"]


# The compliance control, through a fake reading ------------------------------------------------


def _control_reads(config: str, pstore: str = "enabled", systemd: bool = True, owner=("root", 0o644)):
    found = {
        "systemd": SimpleNamespace(is_directory=systemd),
        "config": SimpleNamespace(check=lambda: config),
        "drop_in": SimpleNamespace(is_file=owner is not None, user=(owner or ("", 0))[0], mode=(owner or ("", 0))[1]),
        "pstore": SimpleNamespace(said_enabled=pstore),
    }
    return lambda need: found


CAT_CONFIG = (DATA / "lab-deb12-journald-cat-config.txt").read_text()
ON = {"updates_boot_history": True}


def test_the_control_passes_on_the_lab_hosts_journald_configuration():
    updates_control.test_the_journal_is_kept_across_boots_and_crash_dumps_collected(_control_reads(CAT_CONFIG), ON)
    updates_control.test_the_journal_is_kept_across_boots_and_crash_dumps_collected(
        _control_reads(CAT_CONFIG, pstore="not-found"), ON
    )


@pytest.mark.parametrize(
    ("reads", "message"),
    [
        (
            _control_reads(CAT_CONFIG + "\n# /etc/systemd/journald.conf.d/99-x.conf\n[Journal]\nStorage=volatile\n"),
            "volatile",
        ),
        (_control_reads(CAT_CONFIG.replace("Storage=persistent", "")), "auto"),
        (_control_reads(CAT_CONFIG, pstore="disabled"), "systemd-pstore.service is disabled"),
        (_control_reads(CAT_CONFIG, pstore="masked"), "masked"),
        (_control_reads(CAT_CONFIG, owner=None), "missing"),
        (_control_reads(CAT_CONFIG, owner=("spark", 0o644)), "spark"),
        (_control_reads(CAT_CONFIG, owner=("root", 0o664)), "664"),
    ],
)
def test_the_control_fails_naming_what_is_wrong(reads, message):
    with pytest.raises(AssertionError, match=message):
        updates_control.test_the_journal_is_kept_across_boots_and_crash_dumps_collected(reads, ON)


def test_the_control_skips_without_systemd_or_with_the_setting_off():
    with pytest.raises(pytest.skip.Exception, match="systemd does not run here"):
        updates_control.test_the_journal_is_kept_across_boots_and_crash_dumps_collected(
            _control_reads("", systemd=False), ON
        )
    with pytest.raises(pytest.skip.Exception, match="updates_boot_history is False"):
        updates_control.test_the_journal_is_kept_across_boots_and_crash_dumps_collected(
            _control_reads(CAT_CONFIG), {"updates_boot_history": False}
        )


def test_the_fleet_page_shows_the_boots_column_marked_where_one_ended_uncleanly():
    history = boots.parse((DATA / "lab-deb12-boots.txt").read_text().splitlines())
    row = {**dict.fromkeys(report.COLUMNS, "-"), "boots": boots.summary(history)}
    built = {"hosts": {"lab-deb12": {"versions": row, "differs": ["boots"]}}, "errors": {}, "read": "now"}
    page = fleet_page.render(report.page_hosts(built), columns=report.COLUMNS)
    assert "rollout-reboot, reboot, power-lost, power-lost, shutdown, reboot" in page
    assert "a boot ended uncleanly: a panic, an OOM storm or power lost" in page


def test_the_reports_table_marks_the_column_and_says_why():
    row = {**dict.fromkeys((*report.COLUMNS, *report.GPU_COLUMNS), "-"), "boots": "reboot, power-lost"}
    text = report.table({"spark-01": row, "spark-02": {**row, "boots": "reboot, shutdown"}}, {})
    assert "reboot, power-lost *" in text and "reboot, shutdown *" not in text
    assert "boots (oldest first): one ended uncleanly (panic, oom, power-lost)" in text
