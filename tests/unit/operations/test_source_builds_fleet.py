"""A fleet's source builds: each host learns which hosts share its build (``_peers``) from
the other hosts' settings, resolved once per host per run, not once per pair of hosts
(256 hosts resolved 65,536 settings: most of a no-change run's controller CPU, measured by
benchmarks/fleet_scale.py, docs/performance.md)."""

from __future__ import annotations

from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from sparkrig.operations.source_builds import catalogue as sb_catalogue
from sparkrig.operations.source_builds import deploy as sb_deploy
from tests.unit.operations.test_source_builds import _data

HOSTS = 12


def _fleet(**data) -> tuple[State, Inventory]:
    inventory = Inventory(([(f"@fake/spark-{i}", _data(**data)) for i in range(HOSTS)], {}))
    return State(inventory, Config()), inventory


def test_every_host_finds_its_peers_from_settings_resolved_once_per_host(monkeypatch):
    state, inventory = _fleet()
    resolutions = []
    real = sb_deploy.host_settings.known
    monkeypatch.setattr(sb_deploy.host_settings, "known", lambda other: resolutions.append(1) or real(other))
    key = sb_catalogue.wanted(_data())["lab"]
    with ctx_state.use(state):
        for each in inventory:
            with ctx_host.use(each):
                assert sb_deploy._peers("lab", key) == [h.name for h in inventory]
    assert len(resolutions) == HOSTS  # not HOSTS * HOSTS


def test_a_peer_whose_profile_is_still_auto_is_asked_again_once_read():
    state, inventory = _fleet(hardware_profile="auto")
    first = next(iter(inventory))
    key = sb_catalogue.wanted(_data())["lab"]
    with ctx_state.use(state), ctx_host.use(first):
        assert sb_deploy._peers("lab", key) == []  # no box read yet: no key known
        first.data.hardware_profile = _data()["hardware_profile"]  # as if its box had been read
        assert sb_deploy._peers("lab", key) == [first.name]
