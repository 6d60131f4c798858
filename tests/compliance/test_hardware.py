"""Compliance: the box is the kind of hardware its profile says."""

from __future__ import annotations

from sparkrig.profile import contradiction


def test_the_box_is_the_hardware_its_profile_says(settings, identity, profile):
    """Protects against a box deployed with another box's profile (an RTX workstation with
    gb10's aarch64 wheels and 12.1a arch list, a Spark with a workstation's): its CPU
    architecture and, where a GPU is visible, its compute capability are the profile's."""
    found = contradiction(settings["hardware_profile"], profile, identity)
    assert found is None, found
