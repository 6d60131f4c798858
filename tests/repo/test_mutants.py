"""The mutation check (tests/mutants.py) is not run by CI (minutes); what keeps it true is that
each mutant still applies to the tree: its line is there exactly once, its tests exist. A
change that moves or rewords a mechanism updates its mutant in the same commit."""

from __future__ import annotations

from tests import mutants


def test_every_mutant_applies_to_the_tree_once():
    assert {m.name: why for m in mutants.MUTANTS if (why := mutants.applies(m))} == {}


def test_mutant_names_are_unique_and_each_changes_its_line():
    names = [m.name for m in mutants.MUTANTS]
    assert len(names) == len(set(names))
    assert all(m.old != m.new and "\n" not in m.old + m.new for m in mutants.MUTANTS)
