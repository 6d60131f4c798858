"""The README stays the newcomer's map: every setting and every compliance control is in it."""

import ast
import re
from pathlib import Path

import pytest

from operations.settings import all_settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
CONTROLS = [
    node.name
    for path in sorted((REPO / "tests" / "compliance").glob("test_*.py"))
    for node in ast.parse(path.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
]


@pytest.mark.parametrize("key", [s.key for s in all_settings()])
def test_every_setting_is_in_the_readme(key):
    assert f"| `{key}` |" in README


@pytest.mark.parametrize("control", CONTROLS)
def test_every_compliance_control_says_in_the_readme_what_it_protects_against(control):
    assert f"- `{control}`: " in README


def test_the_readme_test_command_is_the_one_ci_runs():
    assert re.search(r"^uv run pytest +# every test$", README, re.MULTILINE)
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("\nuv run pytest")
