"""The shape of the package: one package per concern under operations/, which imports another
concern only through that concern's settings module, visibly; no import loop, inside a concern or
between concerns (imports inside functions count); the shared layer, sparkrig/, imports no concern;
no module under operations/ over 450 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

OPERATIONS = Path(__file__).resolve().parents[2] / "operations"
MAX_LINES = 450


def concern_imports(path: Path) -> set[str]:
    """What a module under operations/ imports of another concern, anywhere in it, as
    ``concern.module`` (``cuda_env.settings``; a bare ``concern`` for the package itself)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("sparkrig.operations")
        ):
            parts = node.module.split(".")[2:]
            names = [".".join(parts + [alias.name]) for alias in node.names] if len(parts) == 1 else [".".join(parts)]
            if not parts:  # from sparkrig.operations import x, y
                names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:  # from ..other import x
            names = [node.module + "." + alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [
                a.name.removeprefix("sparkrig.operations.")
                for a in node.names
                if a.name.startswith("sparkrig.operations.")
            ]
        found |= set(names)
    return found


def concern_graph(root: Path = OPERATIONS) -> dict[str, dict[str, set[str]]]:
    """Each concern (a package) with what each of its files imports of other concerns:
    {concern: {file: {"jobs.settings", ...}}}."""
    concerns = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    graph: dict[str, dict[str, set[str]]] = {}
    for name in sorted(concerns):
        files = sorted((root / name).rglob("*.py"))
        graph[name] = {
            str(f.relative_to(root)): {i for i in concern_imports(f) if i.split(".")[0] in concerns - {name}}
            for f in files
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import loop, each as the nodes along it (depth-first search)."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_a_concern_imports_another_only_through_its_settings_module():
    """Concerns talk through settings: one that reads another's setting imports that concern's
    settings module (and takes its defaults); never its facts, operations or deploy."""
    wrong = {
        f"{concern}: {file} imports {sorted(i for i in imports if not i.endswith('.settings'))}"
        for concern, files in concern_graph().items()
        for file, imports in files.items()
        if any(not i.endswith(".settings") for i in imports)
    }
    assert wrong == set()


def module_graph(root: Path = OPERATIONS) -> dict[str, set[str]]:
    """Every module under operations/ (``python_stack/deploy``) with the modules of operations/
    it imports, anywhere in it: of its own concern and of others."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        node = str(path.relative_to(root).with_suffix(""))
        package = path.parent.relative_to(root)
        found = set()
        for imported in ast.walk(ast.parse(path.read_text())):
            if isinstance(imported, ast.ImportFrom) and imported.level == 1 and package != Path("."):
                names = [imported.module] if imported.module else [a.name for a in imported.names]
                found |= {str(package / name.split(".")[0]) for name in names}
        found |= {name.replace(".", "/") for name in concern_imports(path)}
        graph[node] = {n if (root / f"{n}.py").is_file() else f"{n}/__init__" for n in found} - {node}
    return graph


def test_no_import_loop_between_modules():
    """No loop through imports (function-level ones included), within a concern or across
    concerns, as no module waits on itself."""
    graph = {k: {n for n in v if not n.endswith("__init__")} for k, v in module_graph().items()}
    assert cycles(graph) == []


def test_the_python_stack_and_the_source_builds_never_import_each_other():
    """What they share (the manifest, its locks, the venv; the wheelhouse the builds fill) is
    the shared layer's (sparkrig/stack_locks.py, sparkrig/wheelhouse.py): neither concern imports
    the other, not even its settings, anywhere in a module (each once imported the other's
    settings, and only the lazy __getattr__ of each package kept that from being a circle)."""
    graph = concern_graph()
    crossing = {
        f"{concern}: {file} imports {sorted(imports)}"
        for concern, other in (("python_stack", "source_builds"), ("source_builds", "python_stack"))
        for file, imports in graph[concern].items()
        if any(name.split(".")[0] == other for name in imports)
    }
    assert crossing == set()


def test_no_import_loop_inside_a_concern():
    for package in sorted(p for p in OPERATIONS.iterdir() if (p / "__init__.py").is_file()):
        graph = {}
        for path in package.glob("*.py"):
            found = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            graph[path.stem] = found - {path.stem}
        assert cycles({k: v for k, v in graph.items() if k != "__init__"}) == [], package.name


def test_the_cycle_finder_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_import_finder_sees_imports_inside_functions(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f():\n    from sparkrig.operations.jobs import deploy\nfrom sparkrig.operations.cuda_env import settings\n"
    )
    assert concern_imports(tmp_path / "m.py") == {"jobs.deploy", "cuda_env.settings"}


def test_no_module_under_operations_is_over_450_lines():
    long = {
        str(p.relative_to(OPERATIONS)): n
        for p in OPERATIONS.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


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


# Trust rules, held by the code's shape -------------------------------------------------

REPO = OPERATIONS.parent
# A Python started by a command: python, python3, python3.12, a venv's bin/python or bin/pip,
# in a command's place (a line's start, after ; & | ( ` then else do exec env -- timeout),
# not followed by -I. Not an option (--python), nor a word in a message or a path.
_PYTHON_RUN = re.compile(
    r"(?:^|[;&|({`]|\b(?:then|else|do|exec|env|timeout(?:\s+-\w+\s+\d+)?(?:\s+\d+)?)|(?<!-)--(?=\s))[ \t]*"
    r"((?:[^\s'\"=;&|]*/)?python3?(?:\.\d+)?|[^\s'\"=;&|]*/pip3?)(?=\s)(?!\s+-I\b)",
    re.MULTILINE,
)
# A path to an interpreter, alone in a string (joined into a command elsewhere).
_PYTHON_PATH = re.compile(r"[^\s'\"]*/bin/(?:python3?(?:\.\d+)?|pip3?)")
# Where a Python runs as someone other than root, or on the controller, and why.
_NOT_ROOT = {
    "templates/source_builds/build.sh.j2": "the build runs as the venv's owner (the unit's User=)",
    "templates/source_builds/build-prefix.sh.j2": "the build runs as the venv's owner (the unit's User=)",
    "templates/ngc/packages.Dockerfile.j2": "runs inside the container image's build",
    "templates/ngc/unsloth.Dockerfile.j2": "runs inside the container image's build",
}
# Interpreter paths in a string of their own, each with how it is run (joined_commands checks
# the command each is joined into).
_INTERPRETER_PATHS = {
    ".sparkrig-new/bin/python": "uv's new tool environment: `-I -m pip install` follows it",
    "/usr/bin/python3": "the serving helper's and its validators' interpreter: `-I` follows it in each",
}
# Texts that name python but are no command, each with what it is.
_MESSAGES = {"python must be a quoted major.minor version such as '3.12'": "the manifest's key, in an error"}
_CONTROLLER_TEXT = re.compile(r"uv run python -m |python -m (tools|lab)\b")


def command_texts() -> list[tuple[str, str]]:
    """Every string the deploy may send a host: the string constants of operations/,
    sparkrig/ and tools/ (docstrings aside) and every template, each with where it is."""
    found = []
    for folder in ("operations", "sparkrig", "tools"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            found += [
                (f"{path.relative_to(REPO)}:{node.lineno}", node.value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            ]
    for path in sorted((REPO / "templates").rglob("*")):
        if path.is_file() and str(path.relative_to(REPO)) not in _NOT_ROOT:
            found.append((str(path.relative_to(REPO)), path.read_text()))
    return found


def _text_of(node, names: dict, depth: int = 0) -> str:
    """What an argument of a command holds, as far as the source says: a string as written,
    an f-string's text, QuoteString(x) as x, a local name as what it was bound to; anything
    else one placeholder word."""
    if depth > 5:
        return "X"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _text_of(v.value if isinstance(v, ast.FormattedValue) else v, names, depth + 1) for v in node.values
        )
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "QuoteString" and node.args:
        return _text_of(node.args[0], names, depth + 1)
    if isinstance(node, ast.Name) and node.id in names:
        return _text_of(names[node.id], names, depth + 1)
    return "X"


def joined_commands() -> list[tuple[str, str]]:
    """Every StringCommand(...) of operations/, sparkrig/ and tools/ as the one text it
    sends (its arguments joined as pyinfra joins them): a Python whose path is a variable
    and whose -I is the next argument (`"&&", python, "-I -m pip install"`) is seen whole."""
    found = []
    for folder in ("operations", "sparkrig", "tools"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
                names = {
                    target.id: node.value
                    for node in ast.walk(scope)
                    if isinstance(node, ast.Assign)
                    for target in node.targets
                    if isinstance(target, ast.Name)
                }
                for node in ast.walk(scope):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "StringCommand":
                        separator = next(
                            (_text_of(k.value, names) for k in node.keywords if k.arg == "_separator"), " "
                        )
                        text = separator.join(_text_of(arg, names) for arg in node.args)
                        found.append((f"{path.relative_to(REPO)}:{node.lineno}", text))
    return found


def pythons_without_isolation(texts: list[tuple[str, str]]) -> list[str]:
    found = []
    for where, text in texts:
        if text in _MESSAGES:
            continue
        text = _CONTROLLER_TEXT.sub("", text)
        found += [
            f"{where}: {m.group(1)!r} in {text[max(0, m.start() - 40) : m.end() + 20]!r}"
            for m in _PYTHON_RUN.finditer(text)
        ]
        if _PYTHON_PATH.fullmatch(text.strip()) and text.strip() not in _INTERPRETER_PATHS:
            found.append(f"{where}: the interpreter path {text!r} (list it with its use, or run it with -I)")
    return found


def test_every_python_a_host_runs_is_isolated():
    """Root's working directory and environment are the login user's until something
    changes them: a Python started without -I imports a json.py, venv.py or ensurepip.py
    planted there. Every Python in a command string or template gets -I."""
    assert pythons_without_isolation(command_texts()) == []
    assert pythons_without_isolation(joined_commands()) == []


def test_the_isolation_scan_finds_a_python_without_dash_i():
    texts = [
        ("a", "python3 -c 'import ensurepip'"),
        ("b", "&& /opt/x/bin/pip install y"),
        ("c", "python3 -I -m venv d"),
        ("d", "uv venv --python 3.12 x"),
        ("e", "/var/lib/python-wheels x"),
    ]
    assert [line.split(":")[0] for line in pythons_without_isolation(texts)] == ["a", "b"]


def test_no_operation_moves_a_command_out_of_slash():
    """Every command starts in / (sparkrig/connection.py sets pyinfra's `_chdir` for every
    host): an operation or fact passing its own `_chdir` would undo that."""
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for folder in ("operations", "sparkrig", "tools")
        for path in sorted((REPO / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.keyword) and node.arg == "_chdir"
    ]
    assert found == []


def test_every_upload_goes_through_a_private_directory():
    """pyinfra's own uploads pass through /tmp/pyinfra-<sha1 of the destination> (0644, a
    name anyone can create first): every upload is sparkrig.atomic.Upload instead."""
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}: "
        f"{node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id}"
        for folder in ("operations", "sparkrig", "tools")
        for path in sorted((REPO / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) in ("FileUploadCommand", "put")
        and not (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "put"
            and getattr(node.func.value, "id", "") != "files"
        )
    ]
    assert found == []


# A user's file read as that user other than through the one reader (sparkrig.user_files).
_READ_AS_USER = re.compile(r"runuser\s+-u\s+\S+\s+--\s+(?:cat|head|tail|sed|dd|cp|grep)\b")


def test_every_read_of_a_users_file_as_that_user_goes_through_the_one_reader():
    """`runuser -u OWNER -- cat FILE` blocks on a FIFO and copies a sparse file or /dev/zero
    without end: a user's file is read through user_files.user_read or copy_out (no link
    on its way, no blocking, size and time caps), whoever reads it."""
    found = [
        f"{where}: {m.group(0)!r}"
        for where, text in command_texts() + joined_commands()
        for m in _READ_AS_USER.finditer(text)
    ]
    assert found == []


def test_the_reader_scan_finds_a_plain_read_as_a_user():
    assert _READ_AS_USER.search("install -m 600 /dev/null x && runuser -u X -- cat -- X/prefix.tar.gz > x")
    assert not _READ_AS_USER.search("runuser -u spark -- timeout -k 1 10 sh -c 'x' sparkrig-read f 10")
