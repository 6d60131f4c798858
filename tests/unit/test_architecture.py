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
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("operations."):
                found.add(node.module.split(".")[1])
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
    (tmp_path / "c.py").write_text("from operations.a import y\n")
    assert cycles(import_graph(tmp_path)) == [["a", "b", "c", "a"]]


def test_no_concern_imports_another():
    """Concerns talk through settings (every @deploy has every default) and sparkrig/; what
    several share (the venv's places, the hardware profile, unit names) lives there."""
    graph = {name: deps for name, deps in import_graph().items() if name != "__init__"}
    assert {name: deps for name, deps in graph.items() if deps} == {}


def test_shared_library_and_tools_import_no_concern_at_module_level():
    """sparkrig/ is what concerns build on: it reaches the concerns only inside functions
    (the list of every setting), never while it is imported."""
    root = OPERATIONS.parent
    for path in sorted((root / "sparkrig").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n == "operations" or n.startswith("operations.") for n in names), path
