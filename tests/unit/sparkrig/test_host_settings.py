"""One host's settings: built once, read-only, "auto" resolved from the box's reading and never
written back into pyinfra's host data; the reading's planners run in deploy order."""

from __future__ import annotations

import pytest
from pyinfra import host
from pyinfra.api import deploy

from sparkrig import host_settings, reading
from sparkrig.operations import hardware  # noqa: F401 (declares hardware_profile)
from tests.unit.pyinfra_fake import execute

SEEN: list = []


@deploy("A user's own deploy")
def look():
    SEEN.append((host_settings.current(), host_settings.current(), host.data.hardware_profile))


def test_auto_is_resolved_once_from_the_box_and_never_written_back():
    SEEN.clear()
    execute(look, data={"hardware_profile": "auto"}, responses={"uname -m": ["aarch64", "12.1, NVIDIA GB10"]})
    ((first, again, in_data),) = SEEN
    assert first is again  # built once
    assert first.hardware_profile == "gb10" and first.profile["torch_cuda_arch_list"] == "12.1a"
    assert in_data == "auto"  # the host's data says what the inventory said


def test_a_hosts_settings_are_read_only():
    settings = host_settings.HostSettings({"swap_disable": True}, {"arch": "x86_64"})
    with pytest.raises(AttributeError):
        settings.swap_disable = False
    with pytest.raises(TypeError):
        settings["swap_disable"] = False  # type: ignore[index]
    with pytest.raises(TypeError):
        settings.profile["arch"] = "aarch64"  # type: ignore[index]
    assert settings.swap_disable is True and dict(settings) == {"swap_disable": True}


def test_planners_run_in_concerns_order_whatever_the_import_order():
    def late(_settings):
        return []

    def early(_settings):
        return []

    late.__module__ = "sparkrig.operations.cluster.deploy"
    early.__module__ = "sparkrig.operations.hardware.deploy"
    before = list(reading._PLANNERS)
    try:
        reading.planner(late)  # imported first
        reading.planner(early)
        ordered = reading.planners()
        assert ordered.index(early) < ordered.index(late)
    finally:
        reading._PLANNERS[:] = before


def test_a_deploy_of_a_concern_that_knows_no_hardware_gets_its_settings(monkeypatch):
    """A user's deploy of swap() alone (the wheel, install("swap")) declares no hardware_profile:
    its settings come without a profile (building them raised KeyError: the lab's wheel test)."""
    from sparkrig import settings  # noqa: PLC0415 (its registry, narrowed for this test)

    monkeypatch.setattr(settings, "_DECLARED", {k: v for k, v in settings._DECLARED.items() if ".swap." in k})
    SEEN.clear()
    execute(look_alone, data={})
    ((found,),) = SEEN
    assert found.swap_disable is True and found.profile is None


@deploy("A user's deploy of one concern")
def look_alone():
    SEEN.append((host_settings.current(),))
