"""One line that ends a deploy: how many hosts, and how many changes on how many of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback, State, StateStage


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def summary_line(hosts: int, changes: Mapping[str, int], failed: Sequence[str] = ()) -> str:
    """``N hosts, no changes`` or ``N hosts, M changes on H hosts``, then the failed hosts.

    + hosts: how many hosts the run targeted
    + changes: host name -> operations that changed something on it
    + failed: names of the hosts that failed (an operation's error, or unreachable)
    """
    changed = {name: count for name, count in changes.items() if count}
    line = _count(hosts, "host") + ", "
    if changed:
        line += f"{_count(sum(changed.values()), 'change')} on {_count(len(changed), 'host')}"
    else:
        line += "no changes"
    if failed:
        line += f"; failed on {_count(len(failed), 'host')}: {', '.join(sorted(failed))}"
    return line


class DeploySummary(BaseStateCallback):
    """Log :func:`summary_line` once every host is disconnected after the operations ran
    (pyinfra disconnects after its results table; a dry run ends before and says nothing)."""

    def __init__(self) -> None:
        self.disconnected = 0

    def host_disconnect(self, state: State, host) -> None:  # type: ignore[override]
        if state.current_stage < StateStage.Execute:
            return
        self.disconnected += 1
        if self.disconnected == len(state.activated_hosts):
            logger.info(f"--> {summarise(state)}")


def summarise(state: State) -> str:
    """The summary line of a run, from pyinfra's state once the operations ran."""
    targeted = [host for host in state.inventory if state.is_host_in_limit(host)]
    changes = {}
    for host in state.activated_hosts:
        changes[host.name] = sum(
            1
            for op in state.ops[host].values()
            if op.operation_meta.did_succeed(_raise_if_not_complete=False) and op.operation_meta.did_change()
        )
    return summary_line(len(targeted), changes, [host.name for host in state.failed_hosts])


def report_on(state: State) -> None:
    """Make pyinfra end the run with the summary line (called from config.py, before
    pyinfra initialises the state, which is where its callback handlers start)."""
    init = state.init

    def init_then_report(*args, **kwargs):
        init(*args, **kwargs)
        state.add_callback_handler(DeploySummary())

    state.init = init_then_report
