"""Updates: how each of the host's last boots ended, from the journal kept across boots and the
kernel's crash dumps (pstore), and the journald drop-in that keeps that journal.

Only journal fields no user can set decide: journald fills the fields that start with ``_``
from the sender's credentials. A shutdown is a shutdown target that PID 1 (``_PID=1``,
``_UID=0``) reached; the rollout's mark counts only when root logged it (``_UID=0``); an OOM
kill is a kernel message (``_TRANSPORT=kernel``). A user's ``logger`` lines, whatever they
say, are never read: the queries print no MESSAGE, and their JSON lines cannot be forged.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output, rendering

JOURNALD_DROP_IN = "/etc/systemd/journald.conf.d/90-sparkrig-persistent.conf"
PSTORE_UNIT = "systemd-pstore.service"
PSTORE_DIRS = ("/sys/fs/pstore", "/var/lib/systemd/pstore")
# What the rollout logs (as root, logger -t) just before it reboots a host.
ROLLOUT_MARK = "sparkrig-rollout"
# The mark counts for a reboot that follows it within this long (a mark left by a reboot that
# failed, followed hours later by someone's reboot, does not).
MARK_WINDOW_S = 600
# An unclean end with this many kernel OOM kills in its last OOM_WINDOW_S is an OOM storm.
OOM_STORM_KILLS = 2
OOM_WINDOW_S = 300
# systemd-pstore moves the kernel's dumps early in the next boot: a dump dated up to this long
# after the next boot began is still the previous boot's.
PSTORE_GRACE_S = 600

SHUTDOWN, ROLLOUT_REBOOT, REBOOT = "shutdown", "rollout-reboot", "reboot"
PANIC, OOM, POWER_LOST = "panic", "oom", "power-lost"
ENDS = (SHUTDOWN, ROLLOUT_REBOOT, REBOOT, PANIC, OOM, POWER_LOST)
UNCLEAN = (PANIC, OOM, POWER_LOST)
# How the report and the docs say each end.
END_WORDS = {
    SHUTDOWN: "clean shutdown",
    ROLLOUT_REBOOT: "reboot by sparkrig's rollout",
    REBOOT: "reboot by someone else",
    PANIC: "kernel panic (pstore holds a dump)",
    OOM: "killed in an OOM-killer storm",
    POWER_LOST: "power lost (the journal stops mid-run)",
}
QUERIES = ("last", "target", "mark", "oom")  # templates/updates/boots.sh's, for each boot
_TARGET_END = {"reboot.target": REBOOT, "kexec.target": REBOOT, "poweroff.target": SHUTDOWN, "halt.target": SHUTDOWN}

_SCRIPT = rendering.script("updates/boots.sh")
_BOOT_ID = re.compile(r"[0-9a-f]{32}")
_LIST_LINE = re.compile(
    r" *(-?[0-9]+) ([0-9a-f]{32}) [A-Z][a-z]{2} ([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) UTC"
    r" [A-Z][a-z]{2} [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} UTC"
)
_PSTORE_LINE = re.compile(r"([0-9]{1,12})(\.[0-9]+)? ([A-Za-z0-9._/-]{1,200})")


def render_journald() -> str:
    """The journald drop-in: the journal kept on disk across boots."""
    return rendering.render("updates/journald-persistent.conf.j2")


class BootHistory(FactBase):
    """
    Returns how each of the host's last ``count`` ended boots ended (oldest first; the running
    boot is not among them), the kernel's crash dumps (pstore: /sys/fs/pstore and where
    systemd-pstore keeps them, /var/lib/systemd/pstore) and whether systemd-pstore.service is
    there (its unit-file state, None without it). No journal (no systemd, or a journal kept
    only in memory): no boots.

    .. code:: python

        {"boots": [{"boot_id": "7a22…", "start": 1795895189, "end": 1795895244.9,
                    "ended": "rollout-reboot", "why": "reboot.target reached, the rollout's mark"}],
         "pstore": [{"name": "dmesg-efi-179589", "time": 1795895300}], "pstore_unit": "enabled"}
    """

    reading_timeout_s = 60  # one journalctl per boot and question, on a journal of months

    def command(self, count: int = 5, mark: str = ROLLOUT_MARK, pstore: Sequence[str] = PSTORE_DIRS) -> StringCommand:
        words = [str(int(count)), QuoteString(mark), *map(QuoteString, pstore)]
        return host_output.encoded("sh -c", QuoteString(_SCRIPT), "sparkrig-boots", *words)

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        return parse(host_output.decoded(output))

    @staticmethod
    def default() -> dict:
        return {"boots": [], "pstore": [], "pstore_unit": None}


def _entries(lines: Sequence[str], what: str) -> list[dict]:
    found = []
    for line in lines:
        entry = json.loads(line)
        if not isinstance(entry, dict) or not isinstance(entry.get("__REALTIME_TIMESTAMP"), str):
            raise ValueError(f"{what}: not a journal entry of journalctl's JSON")
        found.append(entry)
    return found


def _time(entry: Mapping[str, Any]) -> float:
    return int(entry["__REALTIME_TIMESTAMP"]) / 1e6


def parse(lines: Sequence[str]) -> dict:
    """The fact's value from the script's lines (templates/updates/boots.sh)."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines:
        if line.startswith("## "):
            current = sections.setdefault(line[3:], [])
        elif line.startswith("# "):
            current.append(line)
        else:
            current.append(line)
    starts: dict[str, float] = {}
    order: list[str] = []
    for line in sections.get("boots", []):
        match = _LIST_LINE.fullmatch(line)
        if not match:
            raise ValueError(f"a line of journalctl --list-boots not understood: {line[:120]!r}")
        stamp = datetime.datetime.strptime(match[3], "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
        starts[match[2]] = stamp.timestamp()
        order.append(match[2])
    dumps = []
    for line in sections.get("pstore", []):
        match = _PSTORE_LINE.fullmatch(line)
        if not match:
            raise ValueError(f"a pstore file not understood: {line[:120]!r}")
        dumps.append({"name": match[3], "time": int(match[1])})
    unit = [line.split()[1] for line in sections.get("pstore-unit", []) if line.split()[:1] == [PSTORE_UNIT]]
    found_of: dict[str, dict[str, list[dict]]] = {}
    for name, body in sections.items():
        if not name.startswith("boot "):
            continue
        boot_id = name[5:]
        if not _BOOT_ID.fullmatch(boot_id) or boot_id not in starts:
            raise ValueError(f"a boot not in the journal's list: {boot_id[:40]!r}")
        queries: dict[str, list[str]] = {}
        for line in body:
            if line.startswith("# "):
                current = queries.setdefault(line[2:], [])
            else:
                current.append(line)
        found_of[boot_id] = {key: _entries(queries.get(key, []), f"boot {boot_id} {key}") for key in QUERIES}
    owned = _owners(order, starts, found_of, dumps)
    boots = []
    for boot_id, found in found_of.items():
        boots.append(classify(boot_id, starts[boot_id], found, owned.get(boot_id, [])))
    boots.sort(key=lambda boot: boot["start"])
    return {"boots": boots, "pstore": dumps, "pstore_unit": unit[0] if unit else None}


def _targets(found: Mapping[str, list[dict]]) -> list[str]:
    """The shutdown targets PID 1 reached (the ``target`` query's entries)."""
    return [
        e["UNIT"]
        for e in found["target"]
        if e.get("JOB_TYPE") == "start" and e.get("JOB_RESULT") == "done" and e.get("UNIT") in _TARGET_END
    ]


def _owners(
    order: Sequence[str], starts: Mapping[str, float], found_of: Mapping[str, Mapping], dumps: Sequence[dict]
) -> dict[str, list[dict]]:
    """Each dump's boot: the one it is dated in, or the one before where it is dated in a boot's
    first PSTORE_GRACE_S and that boot before ended without a shutdown (systemd-pstore moved
    it early in the next boot)."""
    owned: dict[str, list[dict]] = {}
    for dump in dumps:
        before = [boot_id for boot_id in order if starts[boot_id] <= dump["time"]]
        if not before:
            continue
        owner = before[-1]
        previous = order[order.index(owner) - 1] if order.index(owner) > 0 else None
        if dump["time"] < starts[owner] + PSTORE_GRACE_S and previous in found_of and not _targets(found_of[previous]):
            owner = previous
        owned.setdefault(owner, []).append(dump)
    return owned


def classify(boot_id: str, start: float, found: Mapping[str, list[dict]], dumps: Sequence[Mapping]) -> dict:
    """How one boot ended, from its trusted journal entries (``found``: its ``last`` entry, the
    shutdown ``target`` PID 1 reached, the rollout's ``mark`` root logged, the kernel's ``oom``
    kills) and the crash dumps that are its own (:func:`_owners`)."""
    end = _time(found["last"][-1]) if found["last"] else start
    boot = {"boot_id": boot_id, "start": start, "end": end}
    targets = _targets(found)
    if targets:
        ended = _TARGET_END[targets[-1]]
        marks = [e for e in found["mark"] if end - MARK_WINDOW_S <= _time(e) <= end]
        if ended == REBOOT and marks:
            return {**boot, "ended": ROLLOUT_REBOOT, "why": f"{targets[-1]} reached, the rollout's mark before it"}
        return {**boot, "ended": ended, "why": f"{targets[-1]} reached"}
    if dumps:
        names = ", ".join(dump["name"] for dump in dumps[:3])
        return {**boot, "ended": PANIC, "why": f"no shutdown; pstore holds {names}"}
    kills = [e for e in found["oom"] if _time(e) >= end - OOM_WINDOW_S]
    if len(kills) >= OOM_STORM_KILLS:
        return {**boot, "ended": OOM, "why": f"no shutdown; {len(kills)} kernel OOM kills in its last {OOM_WINDOW_S} s"}
    return {**boot, "ended": POWER_LOST, "why": "no shutdown: the journal stops mid-run"}


def unclean(history: Mapping[str, Any]) -> int:
    """How many of the classified boots ended uncleanly (a panic, an OOM storm, power lost)."""
    return sum(boot["ended"] in UNCLEAN for boot in history["boots"])


def summary(history: Mapping[str, Any]) -> str:
    """The boots' ends, oldest first, as the report shows them (``reboot, power-lost``)."""
    return ", ".join(boot["ended"] for boot in history["boots"]) or "-"
