"""The wheel `uv build` makes installs into a fresh venv outside the checkout (offline, from uv's
cache) and carries what a deploy needs: every concern imports from site-packages, templates and
the Python stack's data are found through importlib.resources, its console script checks the
locks, and none of the repository's tests or lab is in it (tests/converge/test_wheel_lab.py
deploys from such a venv to a lab host). The checkout imports as the wheel does: every name
under sparkrig. that resolves in the checkout's editable install resolves in the wheel, and a
folder linked into the package cannot be imported by a second name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sparkrig.operations import CONCERNS

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import importlib, sys
from importlib import resources
import sparkrig
from sparkrig.operations import CONCERNS, load
from sparkrig.resources import GROUP_DATA, TEMPLATES
assert not any(p.startswith(sys.argv[1]) for p in sparkrig.__path__), sparkrig.__path__
load()
for name in CONCERNS:
    module = importlib.import_module(f"sparkrig.operations.{name}")
    assert "site-packages" in module.__file__, module.__file__
assert TEMPLATES == resources.files("sparkrig") / "templates", TEMPLATES
assert (TEMPLATES / "swap" / "fstab-check.sh").is_file()
assert (GROUP_DATA / "python_stack.yml").is_file() and (GROUP_DATA / "source_builds.yml").is_file()
assert any((GROUP_DATA / "python_stack.locks").glob("*.txt"))
print("ok", len(CONCERNS))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH (.ci/install puts it there)")
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return next(out.glob("sparkrig-*.whl"))


def test_the_wheel_holds_the_package_alone(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"sparkrig", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    for name in CONCERNS:
        assert f"sparkrig/operations/{name}/__init__.py" in names, name
    assert not [n for n in names if n.endswith((".pyc", "__pycache__/"))]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv outside the checkout holding the wheel, installed offline: its dependencies
    as uv.lock pins them, from uv's cache where the checkout's own `uv sync` put them (a resolving
    `uv pip install --offline` would need the index's pages, which a sync never fetches), then
    the wheel alone. Its bin/ directory."""
    uv = shutil.which("uv")
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run(
        [
            uv,
            "sync",
            "--locked",
            "--offline",
            "--no-dev",
            "--no-install-project",
            "--quiet",
            "--python",
            sys.executable,
        ],
        cwd=REPO,
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)},
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--offline",
            "--no-deps",
            "--quiet",
            "--python",
            str(venv / "bin" / "python"),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return venv / "bin"


def test_the_wheel_installs_and_every_concern_imports_outside_the_checkout(installed, tmp_path):
    result = subprocess.run(
        [str(installed / "python"), "-I", "-c", CHECK, str(REPO)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr


# Every name importable under sparkrig.: each package imported, each entry of its __path__
# listed (a module, a package, a folder that is a namespace package), as the import system
# finds them; a __path__ joined to another folder, as the checkout once had, lists that too.
NAMES = """
import importlib, json, sys
from pathlib import Path

def names(package):
    found = {package}
    for entry in importlib.import_module(package).__path__:
        for child in sorted(Path(entry).iterdir()):
            if child.suffix == ".py" and child.stem.isidentifier() and child.stem != "__init__":
                found.add(f"{package}.{child.stem}")
            elif child.is_dir() and child.name.isidentifier() and child.name != "__pycache__":
                found |= names(f"{package}.{child.name}")
    return found

print(json.dumps(sorted(names("sparkrig"))))
"""


def importable(python: Path, cwd: Path) -> set[str]:
    result = subprocess.run([str(python), "-c", NAMES], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout))


def test_every_name_under_sparkrig_in_the_checkout_is_in_the_wheel(installed, tmp_path):
    """The checkout's editable install (uv sync), from the repository's root as pytest and
    pyinfra run there, against the installed wheel: the same names, the concerns and tools
    among them."""
    checkout = importable(Path(sys.executable), REPO)
    wheel = importable(installed / "python", tmp_path)
    assert checkout - wheel == set() and wheel - checkout == set(), checkout ^ wheel
    assert {"sparkrig.operations.swap.deploy", "sparkrig.tools.python_lock", "sparkrig.templates.swap"} <= checkout


def test_the_checkouts_own_files_are_no_module_of_sparkrig():
    """config.py, lab/ and tests/ sit beside sparkrig/ and are not in the wheel: no name of
    sparkrig reaches them (importing sparkrig.config once ran the checkout's config.py)."""
    for name in ("sparkrig.config", "sparkrig.lab", "sparkrig.tests", "sparkrig.deploy", "sparkrig.inventory"):
        result = subprocess.run(
            [sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 1 and f"No module named '{name}'" in result.stderr, (name, result.stderr)


def test_a_folder_linked_into_sparkrig_is_one_module():
    """The repository's root is on the path (the editable install, pytest's rootdir), so each
    folder sparkrig/ links to could be imported by its own name too, one file two modules
    (``sparkrig.tools is tools`` False): importing it so fails, naming the one name."""
    linked = sorted(
        p.name for p in (REPO / "sparkrig").iterdir() if p.is_symlink() and (p.resolve() / "__init__.py").is_file()
    )
    assert linked == ["operations", "tools"], linked
    for name in linked:
        result = subprocess.run(
            [sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 1 and f"{name!r} is sparkrig.{name}: import it by that name" in result.stderr, (
            result.stderr
        )


def test_sparkrig_lock_checks_the_locks_from_the_checkout_and_from_the_wheel(installed, tmp_path):
    """`uv run sparkrig lock --check` in the checkout, and the wheel's console script on the
    locks it ships (resolving each pin against PyPI, as hosts would install it)."""
    uv = shutil.which("uv")
    checkout = subprocess.run(
        [uv, "run", "--locked", "sparkrig", "lock", "--check"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    wheel = subprocess.run(
        [str(installed / "sparkrig"), "lock", "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}"},
    )
    for result in (checkout, wheel):
        assert result.returncode == 0 and "every lock is fresh" in result.stderr, result.stderr[-3000:]


def test_the_wheels_rollout_and_reference_say_they_need_a_checkout(installed, tmp_path):
    for command in ("rollout", "reference"):
        result = subprocess.run(
            [str(installed / "sparkrig"), command, "--check"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2 and f"run `uv run sparkrig {command}` in a clone" in result.stderr, result.stderr


def test_every_command_the_packages_messages_name_is_the_wheels():
    """A message of the package (the wheel's files) that tells the user to run a Python module
    of the checkout would send a wheel's user to nothing: each names a `sparkrig` command."""
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for folder in ("sparkrig", "operations", "tools", "templates")
        for path in sorted((REPO / folder).rglob("*"))
        if path.is_file() and path.suffix != ".pyc"
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if "python -m tools" in line
    ]
    assert found == []
