"""lab/hostile.py: its attackers' shell parses, each is named once for a concern that exists,
and the hostile host boots with the fleet without joining it."""

from __future__ import annotations

import subprocess

import pytest

from lab import hostile
from lab.model import BOOTED_FLEET, DEFAULT_FLEET, FLAVOURS, HOSTILE_FLEET
from sparkrig.operations import CONCERNS


@pytest.mark.parametrize(
    "script",
    [hostile.PREPARE, hostile.CANARIES, hostile.arm_all(), hostile.proofs(), hostile.DISARM, hostile.leftovers()],
)
def test_every_script_parses(script):
    assert subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True).returncode == 0


def test_each_attack_is_named_once_for_a_concern():
    names = [attack.name for attack in hostile.ATTACKS]
    assert len(set(names)) == len(names)
    assert {attack.concern for attack in hostile.ATTACKS} <= set(CONCERNS)


def test_the_hostile_host_boots_with_the_fleet_and_is_no_member_of_it():
    assert BOOTED_FLEET == DEFAULT_FLEET + HOSTILE_FLEET
    assert all(FLAVOURS[flavour].hostile for _name, flavour in HOSTILE_FLEET)
    assert not any(FLAVOURS[flavour].hostile for _name, flavour in DEFAULT_FLEET)
