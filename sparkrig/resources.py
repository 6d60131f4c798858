"""
Where the files sparkrig ships are found: ``templates/`` and the data of ``group_data/`` (the
Python stack's manifest and locks, the source-build catalogue).

The wheel puts them inside the package (``sparkrig/templates``, ``sparkrig/group_data``),
found through :mod:`importlib.resources`; a checkout keeps them beside ``sparkrig/``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_PACKAGE = Path(str(resources.files(__package__)))


def shipped(*parts: str) -> Path:
    """The shipped file or folder ``parts`` (e.g. ``shipped("templates")``)."""
    inside = _PACKAGE.joinpath(*parts)
    return inside if inside.exists() else _PACKAGE.parent.joinpath(*parts)


TEMPLATES = shipped("templates")
GROUP_DATA = shipped("group_data")
