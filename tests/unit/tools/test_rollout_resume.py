"""--resume runs again only the hosts of a batch not yet proven, and the failure budget is
counted over those (tools/rollout.py): the hosts proven before, left alone, are not counted
as successes that would let a share of failures pass (tests/mutants.py changes it)."""

from __future__ import annotations

from sparkrig.tools.rollout import run_batches
from sparkrig.tools.rollout_plan import FAILED, PENDING, PROVEN, load
from tests.unit.tools.test_rollout import Fleet, _state

BATCHES = [["s1"], ["s2", "s3", "s4", "s5"], ["s6", "s7"]]


def test_on_resume_the_budget_counts_the_hosts_run_now(tmp_path):
    path = tmp_path / "r.json"
    first = Fleet(
        deploy_fails={"s2": "deploy: Swap off: sparkrig: boom"},
        control_fails={"s3": "control t.py::t[ssh://s3]: x"},
    )
    state = _state(BATCHES, max_fail="40%")
    assert run_batches(state, path, first.steps()) == 1
    assert state.stopped == "stopped after batch 2: 2 of its 4 hosts failed, over --max-fail 40%"
    # s2 is fixed, s3 still fails: one of the two run now, 50% of them, over 40%.
    again = load(path)
    fleet = Fleet(control_fails={"s3": "control t.py::t[ssh://s3]: x"})
    assert run_batches(again, path, fleet.steps()) == 1
    assert fleet.converged == [["s2", "s3"]]
    assert again.stopped == "stopped after batch 2: 1 of its 2 hosts failed, over --max-fail 40%"
    assert [again.hosts[h].status for h in ("s2", "s3", "s4", "s5", "s6")] == [PROVEN, FAILED, PROVEN, PROVEN, PENDING]


def test_on_resume_a_batch_whose_every_host_run_now_fails_stops(tmp_path):
    """The one host left of a batch fails again: every host run now failed, whatever the budget."""
    path = tmp_path / "r.json"
    state = _state(BATCHES, max_fail="50%")
    assert run_batches(state, path, Fleet(control_fails={"s2": "c", "s3": "c", "s4": "c"}).steps()) == 1
    again = load(path)
    fleet = Fleet(control_fails={"s3": "c"})
    assert run_batches(again, path, fleet.steps()) == 1
    assert fleet.converged == [["s2", "s3", "s4"], ["s6", "s7"]]  # 1 of 3 failed, within 50%
    third = load(path)
    fleet = Fleet(control_fails={"s3": "c"})
    assert run_batches(third, path, fleet.steps()) == 1
    assert fleet.converged == [["s3"]]
    assert third.stopped.startswith("stopped after batch 2: 1 of its 1 hosts failed, over --max-fail 50%")
