"""The benchmarks' command line of the compliance suite's read-only controls."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tests.compliance import selection


def read_only_suite(
    inventory: Path | str, *, plugins: Sequence[str] = (), marker: str = "read", limit: str | None = None
) -> list[str]:
    """``pytest`` running the suite's ``marker`` controls against ``inventory`` (under ``limit``),
    with ``plugins`` (``-p``) and what ``sparkrig check`` adds to a read-only selection, so a
    benchmark times what a user runs."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        *[arg for plugin in (*plugins, "no:cacheprovider") for arg in ("-p", plugin)],
        "tests/compliance",
        "--inventory",
        str(inventory),
        *(["--limit", limit] if limit else []),
        "-m",
        marker,
        *selection.read_only_options(["-m", marker]),
    ]
