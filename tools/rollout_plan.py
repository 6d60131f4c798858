"""
The rollout's plan and record, apart from running anything: batch sizes and the failure
budget as Ansible's ``serial`` and ``max_fail_percentage`` read them, the state file a
rollout resumes from, and the table it ends with. :mod:`sparkrig.tools.rollout` runs the batches.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparkrig.tools import private

# A batch or canary size: hosts (1 or more), or a share of the rollout's hosts (1% to 100%).
_SIZE = re.compile(r"(?P<count>[1-9][0-9]{0,5})|(?P<percent>[1-9][0-9]?|100)%")
# A failure budget: hosts (0 or more), or a share of a batch (0% to 100%).
_BUDGET = re.compile(r"(?P<count>0|[1-9][0-9]{0,5})|(?P<percent>0|[1-9][0-9]?|100)%")

STATE_VERSION = 1


@dataclass(frozen=True)
class Amount:
    """A number of hosts, or a percentage."""

    count: int | None = None
    percent: int | None = None

    def __str__(self) -> str:
        return f"{self.percent}%" if self.percent is not None else str(self.count)

    def hosts_of(self, total: int) -> int:
        """As Ansible's serial: a share of ``total`` rounded down, at least 1."""
        if self.percent is None:
            return self.count or 0
        return max(1, self.percent * total // 100)


def parse_amount(text: str, option: str, budget: bool = False) -> Amount:
    """``--batch``/``--canary`` (``budget`` False) or ``--max-fail`` (True); ValueError names
    the option, the value and what is allowed."""
    match = (_BUDGET if budget else _SIZE).fullmatch(text.strip())
    if match is None:
        allowed = (
            "a number of hosts (0 or more) or a share of a batch (0% to 100%)"
            if budget
            else "a number of hosts (1 or more) or a share of the hosts (1% to 100%)"
        )
        raise ValueError(f"{option} {text!r}: expected {allowed}, e.g. {'1 or 10%' if budget else '2 or 25%'}")
    if match["percent"] is not None:
        return Amount(percent=int(match["percent"]))
    return Amount(count=int(match["count"]))


def plan(hosts: Sequence[str], batch: Amount, canary: Amount | None = None) -> list[list[str]]:
    """``hosts`` in consecutive batches: the canary first (when given), then batches of
    ``batch``; shares are of all ``hosts`` (Ansible's ``serial: [1, "50%"]``); the last batch
    holds what is left."""
    size, first = batch.hosts_of(len(hosts)), canary.hosts_of(len(hosts)) if canary else None
    batches, rest = [], list(hosts)
    if first is not None and rest:
        batches.append(rest[:first])
        rest = rest[first:]
    batches += [rest[i : i + size] for i in range(0, len(rest), size)]
    return batches


def over_budget(failed: int, size: int, budget: Amount) -> bool:
    """Whether a batch of ``size`` hosts with ``failed`` failed ones stops the rollout: more
    failed hosts than the budget (a count, or a share of the batch compared exactly, never
    rounded: 1 of 4 is 25%, over a budget of 24%, within 25%), or every host of the batch
    failed (Ansible's rule: a canary that fails stops the rollout whatever the budget)."""
    if failed == 0:
        return False
    if failed >= size:
        return True
    if budget.percent is not None:
        return failed * 100 > budget.percent * size
    return failed > (budget.count or 0)


# --- the state file ---------------------------------------------------------------------

PENDING, CONVERGED, PROVEN, FAILED = "not started", "converged", "proven", "failed"


@dataclass
class HostState:
    status: str = PENDING
    converged: bool = False
    why: str = ""
    # Where its reboot got (tools/rollout_reboot.py: draining, rebooting, rebooted,
    # drained-out, reboot failed); "" when it was not rebooted.
    reboot: str = ""


@dataclass
class State:
    """A rollout's record: what it was asked (inventory, hosts, options), its batches, each
    host's settings digest (no setting itself: the file may not hold secrets) and how far
    each host got."""

    inventory: str
    options: dict[str, str]
    batches: list[list[str]]
    digests: dict[str, str]
    hosts: dict[str, HostState] = field(default_factory=dict)
    stopped: str = ""

    @classmethod
    def new(
        cls, inventory: str, options: Mapping[str, str], batches: list[list[str]], digests: Mapping[str, str]
    ) -> State:
        return cls(inventory, dict(options), batches, dict(digests), {h: HostState() for b in batches for h in b})

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "version": STATE_VERSION,
                    "inventory": self.inventory,
                    "options": self.options,
                    "batches": self.batches,
                    "digests": self.digests,
                    "stopped": self.stopped,
                    "hosts": {h: vars(s) for h, s in self.hosts.items()},
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str, path: Path) -> State:
        try:
            data = json.loads(text)
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, not {STATE_VERSION}")
            return cls(
                data["inventory"],
                data["options"],
                data["batches"],
                data["digests"],
                {h: HostState(**s) for h, s in data["hosts"].items()},
                data.get("stopped", ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"{path} is not a rollout state this version reads ({error}): start afresh without --resume"
            ) from None

    def refuse_mismatch(
        self, inventory: str, hosts: Sequence[str], digests: Mapping[str, str], options: Mapping[str, str | None]
    ) -> None:
        """Raises ValueError, one line, when this state is not the rollout asked for: another
        inventory, other hosts, other options given, or a proven host whose settings changed
        since (it is proven for the old ones). Hosts not yet proven may change: that is how
        a failed host is fixed."""
        resume = "start afresh without --resume (or name its file with --state)"
        if self.inventory != inventory:
            raise ValueError(f"the saved rollout is of {self.inventory}, not {inventory}: {resume}")
        planned = [h for b in self.batches for h in b]
        if planned != list(hosts):
            gone, new = sorted(set(planned) - set(hosts)), sorted(set(hosts) - set(planned))
            what = (
                "; ".join(
                    part
                    for part in (
                        f"left out now: {', '.join(gone)}" if gone else "",
                        f"new: {', '.join(new)}" if new else "",
                    )
                    if part
                )
                or "their order changed"
            )
            raise ValueError(f"the saved rollout has other hosts ({what}): {resume}")
        for key, given in options.items():
            if given is not None and self.options.get(key) != given:
                raise ValueError(
                    f"the saved rollout ran with --{key.replace('_', '-')} {self.options.get(key)}, "
                    f"not {given}: resume with the same options, or {resume}"
                )
        changed = [h for h in planned if self.hosts[h].status == PROVEN and self.digests.get(h) != digests.get(h)]
        if changed:
            raise ValueError(
                f"the settings of proven hosts changed since the saved rollout ({', '.join(changed)}): {resume}"
            )


def host_digest(data: object) -> str:
    """A host's settings as one digest (its data as pyinfra merges it)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def state_home() -> Path:
    """The caller's own state directory ($XDG_STATE_HOME, else ~/.local/state)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    return Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"


def default_state_path(inventory: str) -> Path:
    """One state file per inventory, under the caller's own state directory."""
    name = Path(inventory).stem
    return state_home() / "sparkrig" / "rollouts" / f"{name}-{hashlib.sha256(inventory.encode()).hexdigest()[:12]}.json"


def private_directory(path: Path) -> Path:
    """``path`` made (mode 0700) where missing; refused unless the caller owns it and no one
    else may write it, as a state file others can replace would steer the next --resume."""
    try:
        return private.private_directory(path, "a rollout's state")
    except ValueError as error:
        raise ValueError(f"{error}: choose another with --state") from None


def save(state: State, path: Path) -> None:
    """Write the state atomically: a new file beside it, flushed to disk, renamed over it;
    a controller lost mid-write leaves the old state or the new one, never half of one."""
    directory = private_directory(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(state.to_json())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> State:
    private_directory(path.parent)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"--resume: no saved rollout at {path}") from None
    return State.from_json(text, path)


# --- the table --------------------------------------------------------------------------


def table(state: State) -> str:
    """Per batch: its hosts, how many converged, were rebooted, were left out of their reboot by
    a drain that timed out, were proven, failed, were not started; then each failed host with
    why, and the hosts not started."""
    rows = [("batch", "hosts", "converged", "rebooted", "drained-out", "proven", "failed", "not started")]
    failed, waiting = [], []
    for number, batch in enumerate(state.batches, start=1):
        hosts = [state.hosts[h] for h in batch]
        label = f"{number} (canary)" if number == 1 and state.options.get("canary") else str(number)
        rows.append(
            (
                label,
                str(len(batch)),
                *(
                    str(n)
                    for n in (
                        sum(h.converged for h in hosts),
                        sum(h.reboot == "rebooted" for h in hosts),
                        sum(h.reboot == "drained-out" for h in hosts),
                        sum(h.status == PROVEN for h in hosts),
                        sum(h.status == FAILED for h in hosts),
                        sum(h.status == PENDING for h in hosts),
                    )
                ),
            )
        )
        failed += [
            f"  {name} (batch {number}): {state.hosts[name].why}"
            for name in batch
            if state.hosts[name].status == FAILED
        ]
        waiting += [
            name + (f" ({state.hosts[name].why})" if state.hosts[name].why else "")
            for name in batch
            if state.hosts[name].status == PENDING
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    if failed:
        lines += ["failed:", *failed]
    if waiting:
        lines.append(f"not started: {', '.join(waiting)}")
    return "\n".join(lines)
