"""The wheel `uv build` makes installs into a fresh venv outside the checkout (offline, from uv's
cache) and carries what a deploy needs: every concern imports from site-packages, templates and
the Python stack's data are found through importlib.resources, its console script checks the
locks, and none of the repository's tests or lab is in it (tests/converge/test_wheel_lab.py
deploys from such a venv to a lab host). The checkout imports as the wheel does: every name
under sparkrig. that resolves in the checkout's editable install resolves in the wheel, and a
folder linked into the package cannot be imported by a second name."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sparkrig.operations import CONCERNS
from tests.support import build_wheel, install_wheel

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
    return build_wheel(tmp_path_factory.mktemp("dist"))


def test_the_wheel_holds_the_package_alone(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"sparkrig", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    for name in CONCERNS:
        assert f"sparkrig/operations/{name}/__init__.py" in names, name
    assert "sparkrig/compliance/conftest.py" in names and "sparkrig/tools/check.ini" in names
    assert not [n for n in names if n.endswith((".pyc", "__pycache__/"))]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv outside the checkout holding the wheel (tests.support.install_wheel); its bin/."""
    return install_wheel(wheel, tmp_path_factory.mktemp("wheel-venv") / "venv")


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
    (``sparkrig.tools is tools`` False): importing it so fails, naming the one name. The
    compliance suite is the exception, by its layout: ``pytest tests/compliance`` imports it
    as tests.compliance, ``sparkrig check`` as sparkrig.compliance; its modules import each
    other relatively, so a process holds it under one name only (its state, the reading's
    needs and the per-host table, once)."""
    linked = sorted(
        p.name for p in (REPO / "sparkrig").iterdir() if p.is_symlink() and (p.resolve() / "__init__.py").is_file()
    )
    assert linked == ["compliance", "operations", "tools"], linked
    for name in ("operations", "tools"):
        result = subprocess.run(
            [sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 1 and f"{name!r} is sparkrig.{name}: import it by that name" in result.stderr, (
            result.stderr
        )
    held = (
        "import importlib, sys; importlib.import_module(sys.argv[1]); "
        "print(sorted(m for m in sys.modules if 'compliance' in m))"
    )
    for package, other in (("sparkrig.compliance", "tests.compliance"), ("tests.compliance", "sparkrig.compliance")):
        result = subprocess.run(
            [sys.executable, "-c", held, f"{package}.conftest"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"'{package}.reads'" in result.stdout and f"'{other}." not in result.stdout, result.stdout


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


def sparkrig(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(installed / "sparkrig"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}"},
    )


def test_the_wheels_help_lists_every_command_and_each_says_all_of_itself(installed, tmp_path):
    """`sparkrig --help` lists each command with its line; each command's --help is its module's
    whole docstring (never cut) and the exit statuses."""
    from sparkrig.tools import cli  # noqa: PLC0415 - the checkout's registry, to compare

    commands = cli.discover()
    assert {"check", "rollout", "report", "reference", "metrics-push", "lock"} <= set(commands)
    top = sparkrig(installed, tmp_path, "--help")
    assert top.returncode == 0, top.stderr
    listed = " ".join(top.stdout.split())
    for name, command in commands.items():
        assert f"{name} {command.summary}" in listed, (name, top.stdout)
        own = sparkrig(installed, tmp_path, name, "--help")
        assert own.returncode == 0, own.stderr
        doc = importlib.import_module(command.main.__module__).__doc__.strip()
        assert doc in own.stdout, (name, own.stdout)
        assert "exit status:\n  0   done" in own.stdout and "\n  4   an input file is refused" in own.stdout, own.stdout
    assert sparkrig(installed, tmp_path).returncode == 2
    wrong = sparkrig(installed, tmp_path, "nope")
    assert wrong.returncode == 2 and "invalid choice: 'nope'" in wrong.stderr, wrong.stderr


def test_the_wheels_reference_writes_the_installed_concerns_settings(installed, tmp_path):
    """From the wheel, `sparkrig reference` writes the settings and compliance references of the
    concerns it installed: the checkout's own, as the checkout generates them."""
    result = sparkrig(installed, tmp_path, "reference")
    assert result.returncode == 0, result.stderr
    for name in ("docs/settings.md", "docs/compliance.md"):
        assert (tmp_path / name).read_text() == (REPO / name).read_text(), name
    assert sparkrig(installed, tmp_path, "reference", "--check").returncode == 0
    (tmp_path / "docs" / "settings.md").write_text("old\n")
    stale = sparkrig(installed, tmp_path, "reference", "--check")
    assert stale.returncode == 1 and "docs/settings.md" in stale.stderr, stale.stderr


def test_the_wheels_commands_refuse_bad_input_in_one_line(installed, tmp_path):
    """A missing deploy file is the command line's fault (exit 2); an inventory pyinfra cannot
    load, or whose settings are refused, is a bad input file (exit 4): one line each, no host
    contacted (the inventory's host does not resolve)."""
    (tmp_path / "config.py").write_text("from sparkrig.operations import install\n\ninstall()\n")
    (tmp_path / "bad.py").write_text("oops = [\n")
    (tmp_path / "refused.py").write_text("hosts = [('r1.invalid', {}), ('r4.invalid', {'swap_disable': 'maybe'})]\n")
    no_deploy = sparkrig(installed, tmp_path, "rollout", "refused.py")
    assert no_deploy.returncode == 2 and no_deploy.stderr.count("\n") == 1, no_deploy.stderr
    assert "--deploy ./deploy.py: no such file" in no_deploy.stderr
    (tmp_path / "deploy.py").write_text("")
    for command in ("check", "rollout"):
        for inventory in ("bad.py", "refused.py"):
            result = sparkrig(installed, tmp_path, command, inventory, "--limit", "r4.invalid")
            assert result.returncode == 4 and result.stderr.count("\n") == 1, (command, result.stderr)
            assert result.stderr.startswith(f"{command}: {inventory}: "), result.stderr
        assert "host 'r4.invalid': swap_disable = 'maybe': allowed is True or False" in result.stderr


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
