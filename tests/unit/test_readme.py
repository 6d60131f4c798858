"""The README stays the newcomer's map: the settings reference and every compliance control."""

import ast
import re
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
CONTROLS = [
    node.name
    for path in sorted((REPO / "tests" / "compliance").glob("test_*.py"))
    for node in ast.parse(path.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
]


def test_the_readme_points_to_the_settings_reference():
    assert "[`docs/settings.md`](docs/settings.md)" in README


@pytest.mark.parametrize("control", CONTROLS)
def test_every_compliance_control_says_in_the_readme_what_it_protects_against(control):
    assert f"- `{control}`: " in README


def test_the_readme_test_command_is_the_one_ci_runs():
    assert re.search(r"^uv run pytest +# every test$", README, re.MULTILINE)
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("\nuv run pytest")
