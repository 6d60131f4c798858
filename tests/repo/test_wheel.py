"""The wheel `uv build` makes installs into a fresh venv outside the checkout and carries what
a deploy needs: every concern imports from site-packages, templates and the Python stack's data
are found through importlib.resources, and none of the repository's own tools, tests or lab is
in it (tests/converge/test_wheel_lab.py deploys from such a venv to a lab host)."""

from __future__ import annotations

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
    subprocess.run([uv, "build", "--wheel", "--out-dir", str(out), str(REPO)], check=True, capture_output=True,
                   text=True, timeout=600)
    return next(out.glob("sparkrig-*.whl"))


def test_the_wheel_holds_the_package_alone(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"sparkrig", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    for name in CONCERNS:
        assert f"sparkrig/operations/{name}/__init__.py" in names or f"sparkrig/operations/{name}.py" in names, name
    assert not [n for n in names if n.endswith((".pyc", "__pycache__/"))]


def test_the_wheel_installs_and_every_concern_imports_outside_the_checkout(wheel, tmp_path):
    uv = shutil.which("uv")
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=600)
    result = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", CHECK, str(REPO)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr
