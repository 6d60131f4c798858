"""The two shapes every concern shares, run as pyinfra executes them: a file written only where
the reading says it differs (atomic.file_if_changed), and a unit's lifecycle (service.stopped,
service.kept_running): stopped and disabled when off, started when found stopped, restarted or
reloaded only after a write that changed something, nothing at all when converged. (The
systemd operations' own commands are pyinfra's, from facts this fake host does not answer: the
operations are checked by name.)"""

from __future__ import annotations

import hashlib

from pyinfra.api import deploy

from sparkrig import atomic, service
from tests.unit.pyinfra_fake import execute

DEST = "/etc/default/thing"
UNIT = "thing.service"
TEXT = "ARGS=1\n"
SAME = {"sha256": hashlib.sha256(TEXT.encode()).hexdigest(), "mode": 0o644, "user": "root", "group": "root"}


def _run(current, units, fresh=False, reload=False, on=True):
    @deploy("Thing")
    def thing():
        if not on:
            service.stopped(UNIT, units, "thing_enabled is False")
            return
        op = atomic.file_if_changed(
            name="Thing's file", dest=DEST, content=TEXT, current=current, validate=("sh", "-n")
        )
        if reload:
            service.kept_running(UNIT, units, reload_on=[op], fresh=fresh)
        else:
            service.kept_running(UNIT, units, restart_on=[op], fresh=fresh)

    return {op.name.split(" | ", 1)[1]: op.commands for op in execute(thing)}


RUNNING = {UNIT: {"active": "active", "enabled": "enabled"}}


def test_converged_adds_no_operation():
    assert _run(SAME, RUNNING) == {}


def test_a_changed_file_is_written_validated_and_restarts_the_running_unit():
    ops = _run({**SAME, "sha256": "0" * 64}, RUNNING)
    assert list(ops) == ["Thing's file", f"Restart {UNIT}: its files changed"]
    assert any("sh -n" in c and "mv -f" in c for c in ops["Thing's file"])


def test_a_mode_alone_is_changed_in_place():
    ops = _run({**SAME, "mode": 0o666}, RUNNING)
    assert ops["Thing's file"] == [f"chown root:root {DEST} && chmod 644 {DEST}"]


def test_a_reload_instead_of_a_restart():
    assert list(_run(None, RUNNING, reload=True)) == ["Thing's file", f"Reload {UNIT}: its configuration changed"]


def test_a_stopped_unit_starts_with_the_new_files_and_is_not_restarted():
    ops = _run(None, {UNIT: {"active": "inactive", "enabled": "enabled"}})
    assert list(ops) == ["Thing's file", f"{UNIT} is enabled and running"]


def test_a_fresh_package_may_have_started_it_with_its_own_files_so_it_restarts():
    # The reading was taken before the package was installed: the unit read as absent.
    ops = _run(None, {}, fresh=True)
    assert list(ops) == ["Thing's file", f"{UNIT} is enabled and running", f"Restart {UNIT}: its files changed"]


def test_an_enabled_but_stopped_unit_is_enabled_and_started_only():
    ops = _run(SAME, {UNIT: {"active": "active", "enabled": "disabled"}})
    assert list(ops) == [f"{UNIT} is enabled and running"]


def test_off_stops_and_disables_a_running_or_enabled_unit_and_leaves_a_stopped_one():
    name = f"{UNIT} is stopped and disabled (thing_enabled is False)"
    assert list(_run(SAME, RUNNING, on=False)) == [name]
    assert list(_run(SAME, {UNIT: {"active": "inactive", "enabled": "enabled"}}, on=False)) == [name]
    assert _run(SAME, {UNIT: {"active": "inactive", "enabled": "disabled"}}, on=False) == {}


def test_no_content_removes_a_file_found_and_adds_nothing_where_there_is_none():
    def ops(current):
        @deploy("Thing")
        def thing():
            atomic.file_if_changed(
                name="Thing's file", absent="No thing's file", dest=DEST, content=None, current=current
            )

        return [op.name.split(" | ", 1)[1] for op in execute(thing)]

    assert ops(SAME) == ["No thing's file"]
    assert ops(None) == []
