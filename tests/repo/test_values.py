"""How values move at run time: no module writes into pyinfra's host data (a host's settings
are sparkrig.host_settings' read-only object, built once; the "auto" profile is resolved
there, never written back), and no shipped module uses a private attribute of pyinfra's
(an operation's ``_inner``: a module's operation that writes a file as one of its steps
yields from ``atomic.file_commands``)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("operations", "sparkrig", "tools")
TOP = ("deploy.py", "config.py")


def _modules():
    for folder in SHIPPED:
        yield from sorted((REPO / folder).rglob("*.py"))
    for name in TOP:
        yield REPO / name


def _is_data(node: ast.AST) -> bool:
    """``<anything>.data``, or an attribute or item below it (host.data.x, other.data["x"])."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr in ("data", "override_datas", "override_data"):
            return True
        node = node.value
    return False


def data_writes(source: str) -> list[int]:
    """The lines of ``source`` that write into a host's data: an assignment, augmented
    assignment or deletion of an attribute or item of ``X.data``, or setattr/delattr on it,
    or a call of its ``set``/``update``/``__setattr__``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call):
            func = node.func
            target = node.args[0] if node.args else None
            if (
                isinstance(func, ast.Name)
                and func.id in ("setattr", "delattr")
                and target is not None
                and (_is_data(target) or isinstance(target, ast.Attribute) and target.attr == "data")
            ):
                found.append(node.lineno)
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in ("set", "update", "__setattr__", "setdefault")
                and _is_data(func.value)
            ):
                found.append(node.lineno)
            continue
        found += [
            node.lineno
            for target in targets
            if isinstance(target, (ast.Attribute, ast.Subscript))
            and _is_data(target.value)
            or isinstance(target, ast.Attribute)
            and target.attr == "data"
        ]
    return found


def private_attributes(source: str) -> list[str]:
    """Each ``X._name`` of ``source`` (one underscore) where X is not ``self`` or ``cls`` and
    the name is not sparkrig's own (``_sparkrig_*``, kept on pyinfra's Host)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not node.attr.startswith("_sparkrig")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_no_module_writes_into_host_data():
    found = [f"{path.relative_to(REPO)}:{line}" for path in _modules() for line in data_writes(path.read_text())]
    assert found == []


def test_the_data_scan_finds_every_kind_of_write():
    source = "\n".join(
        [
            "host.data.hardware_profile = 'gb10'",  # 1
            "host.data._chdir = '/'",  # 2
            "setattr(host.data, 'x', 1)",  # 3
            "other.data['x'] = 1",  # 4
            "inventory.get_override_data()",  # 5: a read
            "host.data.override_datas['x'] = 1",  # 6
            "host.data.x += 1",  # 7
            "x = host.data.x",  # 8: a read
            "host.data = {}",  # 9
        ]
    )
    assert sorted(data_writes(source)) == [1, 2, 3, 4, 6, 7, 9]


def test_no_shipped_module_uses_a_private_attribute_of_pyinfras():
    found = [f"{path.relative_to(REPO)}:{hit}" for path in _modules() for hit in private_attributes(path.read_text())]
    assert found == []


def test_the_private_scan_finds_inner_and_leaves_own_names():
    source = "yield from atomic.file._inner(dest=d)\nself._values\nhost._sparkrig_settings\nx.__name__\n"
    assert private_attributes(source) == ["1: ._inner"]


def test_deploy_py_is_one_plain_call_per_concern_in_order():
    """deploy.py wires nothing: each concern is called with no argument, in CONCERNS order
    (python_stack and source_builds share the wheelhouse through sparkrig/wheelhouse.py)."""
    from sparkrig.operations import CONCERNS  # noqa: PLC0415

    calls = [
        node.value
        for node in ast.parse((REPO / "deploy.py").read_text()).body
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    ]
    assert [call.func.id for call in calls] == list(CONCERNS)
    assert [call for call in calls if call.args or call.keywords] == []


def test_python_stack_imports_nothing_of_source_builds():
    """The venv's owner knows the builds only through the shared contract."""
    from tests.repo.test_architecture import concern_imports  # noqa: PLC0415

    found = {
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / "operations" / "python_stack").glob("*.py"))
        for name in concern_imports(path)
        if name.startswith("source_builds")
    }
    assert found == set()
