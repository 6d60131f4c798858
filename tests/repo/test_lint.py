"""ruff (pyproject.toml's [tool.ruff]: pyflakes, line length, import order, no import inside a
function without a reason) finds nothing in the repository, and its formatter would change
nothing: the style holds."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:]


def test_ruff_format_would_change_nothing():
    """``ruff format`` was applied to the whole tree once; every change since keeps its layout
    (run ``uv run ruff format .`` to fix one this names)."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
