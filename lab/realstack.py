"""The real Python stack in the lab, opt-in (tests/converge/test_real_stack_lab.py, marker
``real_stack``): the real manifest (group_data/python_stack.yml) locked for the lab's Python
(Debian 12's 3.11: DGX OS's 3.12 is not installable here) and installed by python_stack()
with ``python_offline`` on, so the controller downloads each wheel once into
:data:`WHEELS`, kept between runs.

The inventory (inventory/lab.py) takes this stack instead of its stand-in one when
:data:`ENV` holds the run's choice as JSON: ``{"profiles": [...], "builds": {HOST: {BUILD:
SOURCE}}}``, SOURCE ``"standin"`` or ``"real"`` for the catalogue's ``xformers``:

- ``standin``: ``sparkrig-lab-standin-xformers``, a STAND-IN for xformers named as such
  (distribution ``xformers``, version ``0.0.33+sparkrig.labstandin``, one small C module),
  for the emulated aarch64 host: compiling the real xformers under qemu-user takes hours.
  It goes through the catalogue entry's own build, share and install path.
- ``real``: xformers v0.0.33's own sources (PyPI's sdist, sha256 pinned, which carries
  its third_party trees), committed into a git repository with a fixed date and tagged
  ``v0.0.33``, for a native x86_64 host. There is no CUDA in the lab: it builds the CPU
  parts only.

Both are served under ``sources/`` of the lab's repository site (lab hosts reach neither
GitHub nor the files host), as lab/sourcebuild.py serves the lab's own project.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import yaml

from sparkrig import atomic
from sparkrig.operations.source_builds.settings import load_catalogue
from sparkrig.stack_locks import load_manifest

from .config import CACHE_DIR, LAB_DIR, WHEEL_CACHE
from .sourcebuild import _git
from .system import LabError

REPO = Path(__file__).resolve().parents[1]
ENV = "SPARKRIG_LAB_REAL_STACK"
PYTHON = "3.11"  # Debian 12's, on both lab architectures
# The controller's offline cache of the real stack's wheels: several GB, kept between runs.
WHEELS = CACHE_DIR / "python-wheels"
STACK = LAB_DIR / "python_stack"
MANIFEST = STACK / "real.yml"
LOCKS = STACK / "real-locks"
SOURCES = CACHE_DIR / "realstack-sources"  # the bare repositories, made once
FIGURES = LAB_DIR / "real-stack-figures.json"

XFORMERS_TAG = "v0.0.33"
XFORMERS_SDIST = (
    "https://files.pythonhosted.org/packages/e1/25/711c9bc1814adbafbb0c1e300a474303fb0c1edb931a18b20a8b448fe443/"
    "xformers-0.0.33.tar.gz",
    "6e524e0c3fe9d573631060d7cbb31906cb5b030802b1d414906619b5eb67f34c",
)
STANDIN = "sparkrig-lab-standin-xformers"
STANDIN_VERSION = "0.0.33+sparkrig.labstandin"
_DATE = "2026-01-01T12:00:00+00:00"

_STANDIN_FILES = {
    "pyproject.toml": (
        '[build-system]\nrequires = ["setuptools>=64", "wheel"]\nbuild-backend = "setuptools.build_meta"\n'
    ),
    "setup.py": (
        '"""STAND-IN for xformers in the sparkrig lab (lab/realstack.py): not xformers."""\n'
        "from setuptools import Extension, setup\n\n"
        f'setup(name="xformers", version="{STANDIN_VERSION}", packages=["xformers"],\n'
        '      ext_modules=[Extension("xformers._standin", ["src/standin.c"])])\n'
    ),
    "xformers/__init__.py": (
        '"""STAND-IN for xformers in the sparkrig lab (lab/realstack.py): it proves the source\n'
        'build\'s path onto an emulated aarch64 host (build, share, install), nothing of xformers."""\n'
        f'__version__ = "{STANDIN_VERSION}"\n'
        "STANDIN = True\n"
        "from ._standin import answer\n"
    ),
    "src/standin.c": (
        "#include <Python.h>\n"
        "static PyObject *answer(PyObject *self, PyObject *unused) { return PyLong_FromLong(33); }\n"
        'static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "The stand-in\'s answer."}, '
        "{NULL, NULL, 0, NULL}};\n"
        'static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_standin", NULL, -1, methods};\n'
        "PyMODINIT_FUNC PyInit__standin(void) { return PyModule_Create(&module); }\n"
    ),
}


def manifest() -> dict:
    """The real manifest for the lab's Python, locked for both architectures, base and unsloth."""
    real = load_manifest()
    real["python"] = PYTHON
    real["locks"] = {"architectures": ["aarch64", "x86_64"], "profiles": [[], ["unsloth"]]}
    return real


def make_locks() -> str:
    """Write the manifest and lock it with the real command (fresh locks are left alone)."""

    STACK.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(manifest(), sort_keys=False)
    if not MANIFEST.is_file() or MANIFEST.read_text() != text:
        MANIFEST.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "lock", "--manifest", str(MANIFEST), "--locks", str(LOCKS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        raise LabError(f"locking the real stack for Python {PYTHON} failed:\n{result.stderr[-3000:]}")
    return result.stderr


def _commit_tree(tree: Path, bare: Path, tag: str, message: str) -> str:
    _git(tree, "init", "--quiet", "--initial-branch=main")
    _git(tree, "add", "--all", "--force")
    _git(tree, "commit", "--quiet", "-m", message, date=_DATE)
    _git(tree, "tag", tag)
    commit = _git(tree, "rev-parse", "HEAD")
    temp = bare.with_name(f".{bare.name}.new")
    shutil.rmtree(temp, ignore_errors=True)
    _git(tree.parent, "clone", "--quiet", "--bare", str(tree), str(temp))
    _git(temp, "update-server-info")
    temp.rename(bare)
    return commit


def _standin_repository() -> Path:
    bare = SOURCES / f"{STANDIN}.git"
    if not bare.is_dir():
        with tempfile.TemporaryDirectory(dir=CACHE_DIR) as temp:
            tree = Path(temp) / "tree"
            for name, text in _STANDIN_FILES.items():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                (tree / name).write_text(text)
            _commit_tree(tree, bare, XFORMERS_TAG, "sparkrig lab STAND-IN for xformers")
    return bare


def _xformers_repository() -> Path:
    """xformers v0.0.33's sources from PyPI's sdist (sha256 checked), as a tagged repository."""
    bare = SOURCES / "xformers.git"
    if not bare.is_dir():
        url, sha256 = XFORMERS_SDIST
        with tempfile.TemporaryDirectory(dir=CACHE_DIR) as temp:
            sdist = Path(temp) / "xformers.tar.gz"
            with urllib.request.urlopen(url, timeout=300) as response, open(sdist, "wb") as out:
                shutil.copyfileobj(response, out)
            if atomic.file_sha256(sdist) != sha256:
                raise LabError(f"{url}: sha256 differs from the pinned {sha256}")
            with tarfile.open(sdist) as archive:
                archive.extractall(temp, filter="data")
            tree = Path(temp) / "xformers-0.0.33"
            _commit_tree(tree, bare, XFORMERS_TAG, "xformers 0.0.33 (PyPI's sdist, for the sparkrig lab)")
    return bare


def serve_sources(site: Path, real: bool) -> dict:
    """Put the stand-in's (and, with ``real``, xformers') repository under the site's
    ``sources/``; their paths and commits, by source."""
    SOURCES.mkdir(parents=True, exist_ok=True)
    served = {}
    for source, bare in (("standin", _standin_repository()), *((("real", _xformers_repository()),) if real else ())):
        target = site / "sources" / bare.name
        if not target.is_dir():
            shutil.copytree(bare, target)
        commit = _git(bare, "rev-parse", f"refs/tags/{XFORMERS_TAG}^{{commit}}")
        served[source] = {"path": f"/sources/{bare.name}", "commit": commit}
    (STACK / "sources.json").write_text(json.dumps(served, indent=1) + "\n")
    return served


def choice() -> dict | None:
    """The run's choice (:data:`ENV`), or None: the lab's stand-in stack."""
    value = os.environ.get(ENV)
    return json.loads(value) if value else None


def host_data(host: dict, chosen: dict) -> dict:
    """A lab host's settings for the real stack: the real manifest and its locks, offline,
    and the xformers build this run gives the host (the catalogue's entry, its url and ref
    pointed at the lab's served repository)."""
    data = {
        "python_stack": manifest(),
        "python_stack_locks": str(LOCKS),
        "python_stack_profiles": chosen["profiles"],
        "python_venv_python_preference": "only-system",
        "python_offline": True,
        "python_offline_cache": str(WHEELS),
        "source_builds_controller_cache": str(WHEEL_CACHE),
    }
    builds = chosen.get("builds", {}).get(host["name"], {})
    if builds:
        served = json.loads((STACK / "sources.json").read_text())
        catalogue = load_catalogue()
        for build, source in builds.items():
            catalogue[build] = {
                **catalogue[build],
                "url": host["apt_repo_url"] + served[source]["path"],
                "ref": served[source]["commit"],
            }
            if source == "real":
                # No CUDA in the lab: xformers' setup.py builds its CUDA extension (calling nvcc)
                # whenever TORCH_CUDA_ARCH_LIST is set or CUDA_HOME found, so this lab-only step
                # unsets both before the wheel is built: the CPU parts only.
                catalogue[build]["steps"] = ["unset TORCH_CUDA_ARCH_LIST CUDA_HOME", *catalogue[build]["steps"]]
        data.update(source_builds=catalogue, source_builds_enabled=sorted(builds))
    return data
