"""What is generated stays generated and current, and deploy.py, the registry of concerns and
the docs name the same concerns in the same order (tools/reference.py writes the docs)."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

from sparkrig.operations import CONCERNS, concern
from sparkrig.tools import reference

REPO = Path(__file__).resolve().parents[2]


def test_every_generated_file_is_current():
    stale = [name for name, text in reference.generated().items() if (REPO / name).read_text() != text]
    assert stale == [], f"stale, run `uv run sparkrig reference`: {stale}"


def test_deploy_py_calls_every_concern_of_the_registry_once_in_its_order():
    assert [name for name, _ in reference.deploy_lines((REPO / "deploy.py").read_text())] == list(CONCERNS)


def test_deploy_py_imports_each_concern_from_its_own_module():
    imported = {
        alias.name: node.module
        for node in ast.parse((REPO / "deploy.py").read_text()).body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for name in CONCERNS:
        assert imported.get(name) == f"sparkrig.operations.{name}", name


@pytest.mark.parametrize("name", CONCERNS)
def test_each_concern_has_its_deploy_doc_page_and_controls(name):
    module = concern(name)
    assert getattr(module, name).deploy_name, f"{name}: no @deploy named {name}"
    assert (REPO / reference.doc_page(name)).is_file(), reference.doc_page(name)
    assert (REPO / "tests" / "compliance" / f"test_{name}.py").is_file(), f"{name}: no controls"


def test_every_compliance_control_says_what_it_protects_against():
    for path in sorted((REPO / "tests" / "compliance").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                assert (ast.get_docstring(node) or "").startswith(reference.PROTECTS), f"{path.name}::{node.name}"


def test_every_module_file_the_repository_names_exists():
    """A comment or page naming ``operations/<concern>.py`` after the concern became the package
    ``operations/jobs/`` sends its reader nowhere: each such path of the code's folders exists."""
    named = re.compile(r"(?<![/\w.\-])((?:operations|sparkrig|tools|lab|benchmarks)/[\w/]*\.py)\b")
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    missing = sorted(
        f"{name}: {path}"
        for name in files
        if (REPO / name).is_file() and not (REPO / name).is_symlink()
        for path in named.findall((REPO / name).read_text(errors="replace"))
        if not (REPO / path).is_file()
    )
    assert missing == []
