"""The compliance suite reads a host one way (tests/compliance/reads.py): each read-only
control states what it reads once, as a need, and no control reads a host outside that layer.
(At run time the suite's conftest refuses testinfra's host to a running read-only control, and
tests/unit/tools/test_compliance_suite.py proves it; this checks the source, where a control
or a fixture it uses could still reach the host.)"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

COMPLIANCE = Path(__file__).resolve().parents[2] / "tests" / "compliance"
READING_CALLS = {
    "run",
    "check_output",
    "run_test",
    "run_expect",
    "file",
    "path",
    "user_file",
    "service",
    "package",
    "user",
    "group",
    "sudo",
    "check_output",
}


def _modules() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text()) for path in sorted(COMPLIANCE.glob("*.py"))}


def _is_action(function: ast.FunctionDef) -> bool:
    return any("action" in ast.unparse(d) for d in function.decorator_list)


def _is_fixture(function: ast.FunctionDef) -> bool:
    return any("fixture" in ast.unparse(d) for d in function.decorator_list)


def _functions() -> dict[str, list[tuple[str, ast.FunctionDef]]]:
    """Every function of the suite by name (fixtures and controls), with its module."""
    found = defaultdict(list)
    for module, tree in _modules().items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                found[node.name].append((module, node))
    return found


def _command_argument(call: ast.Call) -> str | None:
    """The source of the command a reading call sends (its first argument), when it is one."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in ("run", "check_output") and call.args:
        return ast.unparse(call.args[0])
    return None


def test_no_module_declares_its_reads_a_second_time():
    """The old shape: each module's ``reads(plan, settings)`` wrote every command again."""
    twice = [
        f"{module}::reads"
        for module, tree in _modules().items()
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "reads"
    ]
    assert twice == []


def test_no_command_is_written_twice():
    """A command's text is written at one place: a second copy (the same text in a need and in
    a control, or in two controls) is a second declaration that drifts from the first."""
    seen = defaultdict(list)
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                command = _command_argument(node)
                if command is not None and (command.startswith(("'", '"', "f'", 'f"'))):
                    seen[command].append(f"{module}:{node.lineno}")
    assert {c: where for c, where in seen.items() if len(where) > 1} == {}


def _host_fixtures(functions) -> set[str]:
    """The fixtures that give testinfra's host itself (``return host``, or another such fixture)."""
    hosts = {"host"}
    changed = True
    while changed:
        changed = False
        for name, defs in functions.items():
            for _module, node in defs:
                if name in hosts or not _is_fixture(node):
                    continue
                returns = {ast.unparse(n.value) for n in ast.walk(node) if isinstance(n, ast.Return) and n.value}
                if returns & hosts:
                    hosts.add(name)
                    changed = True
    return hosts


def _reaches_the_host(node: ast.FunctionDef, hosts: set[str]) -> list[str]:
    """Where ``node`` asks a testinfra host anything (an attribute of it other than its
    ``backend``, or a host handed to a function other than the layer's name of it)."""
    found = []
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in hosts
            and n.attr != "backend"
        ):
            found.append(f"{node.name}:{n.lineno}: {ast.unparse(n)}")
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id == "inventory_name"):
            for arg in n.args:
                if isinstance(arg, ast.Name) and arg.id in hosts and not isinstance(n.func, ast.Attribute):
                    found.append(f"{node.name}:{n.lineno}: {ast.unparse(n)}")
    return found


def test_no_read_only_control_reads_a_host_outside_the_layer():
    """A read-only control, and every fixture it uses (they run before it, unguarded), reach a
    host only through ``read(NEED)``: none takes testinfra's host (or a fixture that is the
    host) to ask it anything; only controls marked action may."""
    functions = _functions()
    hosts = _host_fixtures(functions)
    problems, done = [], set()

    def check(module: str, node: ast.FunctionDef):
        if (module, node.name) in done:
            return
        done.add((module, node.name))
        params = {a.arg for a in node.args.args}
        problems.extend(f"{module}:{p}" for p in _reaches_the_host(node, hosts & params))
        for param in params - {"host"}:
            for fixture_module, fixture in functions.get(param, []):
                if _is_fixture(fixture) and fixture_module in (module, "conftest.py"):
                    check(fixture_module, fixture)

    controls = [(m, n) for name, defs in functions.items() if name.startswith("test_") for m, n in defs]
    for module, control in controls:
        if not _is_action(control):
            params = {a.arg for a in control.args.args}
            problems.extend(f"{module}:{control.name} takes {p}" for p in params & hosts)
            check(module, control)
    assert problems == []
    assert len(controls) > 80  # the suite's controls were found


def test_every_need_a_control_reads_is_registered():
    """``read(NEED)`` answers only functions decorated with ``reads.need`` (it refuses the
    others at run time); here: every name a control or fixture passes to ``read`` is one."""
    needs = {
        node.name
        for tree in _modules().values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d).split("(")[0] in ("need", "reads.need") for d in node.decorator_list)
    }
    asked = {
        ast.unparse(n.args[0])
        for tree in _modules().values()
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "read" and n.args
    }
    assert asked and asked <= needs, asked - needs
