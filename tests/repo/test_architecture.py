"""The shape of operations/: concerns talk through settings and a small shared API, and no
two modules import each other, directly or around a loop (imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

OPERATIONS = Path(__file__).resolve().parents[2] / "operations"


def import_graph(package: Path = OPERATIONS) -> dict[str, set[str]]:
    """Each module of the package with the modules of the package it imports, anywhere in it."""
    modules = {path.stem for path in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:  # from .x import y
                    found.add(node.module.split(".")[0])
                else:  # from . import x, y
                    found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkrig.operations."):
                found.add(node.module.split(".")[2])
        graph[path.stem] = (found & modules) - {path.stem}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import loop, each as the modules along it (depth-first search)."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_no_import_cycle_under_operations():
    graph = {name: deps for name, deps in import_graph().items() if name != "__init__"}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_loop_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .c import x\n")
    (tmp_path / "c.py").write_text("from sparkrig.operations.a import y\n")
    assert cycles(import_graph(tmp_path)) == [["a", "b", "c", "a"]]


def test_no_concern_imports_another():
    """Concerns talk through settings (every @deploy has every default) and sparkrig/; what
    several share (the venv's places, the hardware profile, unit names) lives there."""
    graph = {name: deps for name, deps in import_graph().items() if name != "__init__"}
    assert {name: deps for name, deps in graph.items() if deps} == {}


def _imported_names(tree: ast.AST) -> list[str]:
    """Every module name an import anywhere in ``tree`` names (functions' imports included)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names += [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_shared_layer_imports_no_concern_anywhere():
    """sparkrig/ is what concerns build on: it learns them from what they declare as they are
    imported (sparkrig.settings.declare), never by importing one, not even inside a function."""
    root = OPERATIONS.parent
    for path in sorted((root / "sparkrig").glob("*.py")):
        for name in _imported_names(ast.parse(path.read_text())):
            assert not (name == "operations" or name.startswith(("operations.", "sparkrig.operations"))), (path, name)


def test_the_old_top_level_import_names_are_gone():
    """Every import name lives under sparkrig. (the wheel has no top-level operations)."""
    root = OPERATIONS.parent
    for folder in ("sparkrig", "operations", "tools", "tests", "lab", "benchmarks", "inventory", "group_data"):
        for path in sorted((root / folder).rglob("*.py")):
            for name in _imported_names(ast.parse(path.read_text())):
                assert not (name == "operations" or name.startswith("operations.")), (path, name)
    for path in (root / "deploy.py", root / "config.py"):
        assert not any(n.startswith("operations") for n in _imported_names(ast.parse(path.read_text()))), path
