"""
Where the files sparkrig ships are found: ``templates/`` and the data of ``group_data/`` (the
Python stack's manifest and locks, the source-build catalogue), inside the package
(``sparkrig/templates``, ``sparkrig/group_data``: in a checkout, links to the repository's),
found through :mod:`importlib.resources`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_PACKAGE = Path(str(resources.files(__package__)))

TEMPLATES = _PACKAGE / "templates"
GROUP_DATA = _PACKAGE / "group_data"
