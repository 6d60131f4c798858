"""The lab's source-build project: a small real C extension in a git repository.

Source builds (operations/source_builds/) fetch a project with git at a pinned
ref, compile it into a wheel on one host and hand the wheel to the others. The lab
hosts reach neither GitHub nor a GPU, so the lab serves its own project instead
of Triton, xformers or vLLM: ``sparkrig-lab-ext``, a package with one C module
(``sparkrig_lab_ext._native``, built for the stable ABI, so one wheel fits the
Python of every lab flavour) whose ``answer()`` tells which commit was built.

The repository is made here with fixed authors and dates, so its commit ids are
the same on every machine, and served under ``sources/`` of the lab's repository
site for git's "dumb" HTTP protocol (``git update-server-info``). Its commits,
each tagged:

- ``v1.0``: ``answer()`` is 1, version 1.0.0 (the lab pins this one by commit id);
- ``v2.0``: ``answer()`` is 2, version 2.0.0 (a changed ref);
- ``v3.0-broken``: a C syntax error (a failed build).

``SPARKRIG_LAB_BUILD_SLEEP`` (seconds) in the build's environment makes the
compile step wait first, so a test can cut the deploy's SSH connection while
the build runs.

A second repository, ``sparkrig-lab-prefix``, is the STAND-IN for NCCL and
nccl-tests (prefix builds: make and gcc, no GPU, no MPI): ``lib/`` builds
``libstandin.so.1`` (the NCCL stand-in; ``make install PREFIX=...`` installs it
with its ``libstandin.so`` link and header), ``tests/`` builds ``standin_perf``
(the all_reduce_perf stand-in) against an installed ``lib/`` (``STANDIN_HOME``,
found again at run time by its RUNPATH), which prints the answer the library
gives. Tags ``p1.0`` (answer 1) and ``p2.0`` (answer 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = "sources"
NAME = "sparkrig-lab-ext"
REPOSITORY = f"{ROOT}/{NAME}.git"
PREFIX_NAME = "sparkrig-lab-prefix"
PREFIX_REPOSITORY = f"{ROOT}/{PREFIX_NAME}.git"
DESCRIPTION = f"{ROOT}/sources.json"
RECIPE_VERSION = 2

_SETUP = '''\
"""sparkrig lab project: one C module built for the stable ABI (lab/sourcebuild.py)."""
import os
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class SlowBuildExt(build_ext):
    def run(self):
        time.sleep(float(os.environ.get("SPARKRIG_LAB_BUILD_SLEEP") or 0))
        super().run()


setup(
    name="sparkrig-lab-ext",
    version="{version}",
    packages=["sparkrig_lab_ext"],
    ext_modules=[
        Extension(
            "sparkrig_lab_ext._native",
            ["src/native.c"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x03080000")],
        )
    ],
    cmdclass={{"build_ext": SlowBuildExt}},
    options={{"bdist_wheel": {{"py_limited_api": "cp38"}}}},
)
'''

_NATIVE = """\
#include <Python.h>

static PyObject *answer(PyObject *self, PyObject *unused)
{{
    return PyLong_FromLong({answer}){broken};
}}

static PyMethodDef methods[] = {{
    {{"answer", answer, METH_NOARGS, "Which commit of the lab project was built."}},
    {{NULL, NULL, 0, NULL}},
}};

static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods}};

PyMODINIT_FUNC PyInit__native(void)
{{
    return PyModule_Create(&module);
}}
"""

_FILES = {
    "pyproject.toml": (
        '[build-system]\nrequires = ["setuptools>=61", "wheel"]\nbuild-backend = "setuptools.build_meta"\n'
    ),
    "sparkrig_lab_ext/__init__.py": (
        '"""sparkrig lab project (not a real package): answer() tells which commit was built."""\n'
        "from ._native import answer\n"
    ),
}

# (tag, version, answer, broken)
COMMITS = (("v1.0", "1.0.0", 1, False), ("v2.0", "2.0.0", 2, False), ("v3.0-broken", "3.0.0", 3, True))

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "sparkrig lab",
    "GIT_AUTHOR_EMAIL": "sparkrig-lab@localhost.invalid",
    "GIT_COMMITTER_NAME": "sparkrig lab",
    "GIT_COMMITTER_EMAIL": "sparkrig-lab@localhost.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


_PREFIX_FILES = {
    "README": "sparkrig lab: a STAND-IN for NCCL (lib/) and nccl-tests (tests/), built with make and gcc.\n",
    "lib/standin.h": "int standin_answer(void);\n",
    "lib/Makefile": (
        "# STAND-IN for NCCL's makefiles: make, then make install PREFIX=...\n"
        "PREFIX ?= /usr/local\n"
        "all: libstandin.so.1\n"
        "libstandin.so.1: standin.c standin.h\n"
        "\t$(CC) -O2 -fPIC -shared -Wl,-soname,libstandin.so.1 -o $@ standin.c\n"
        "install: libstandin.so.1\n"
        "\tmkdir -p $(PREFIX)/lib $(PREFIX)/include\n"
        "\tcp libstandin.so.1 standin.h $(PREFIX)/lib/\n"
        "\tmv $(PREFIX)/lib/standin.h $(PREFIX)/include/\n"
        "\tln -sf libstandin.so.1 $(PREFIX)/lib/libstandin.so\n"
    ),
    "tests/Makefile": (
        "# STAND-IN for nccl-tests' makefiles: built against an installed lib/ (STANDIN_HOME)\n"
        "standin_perf: perf.c\n"
        "\t$(CC) -O2 -I$(STANDIN_HOME)/include -o $@ perf.c -L$(STANDIN_HOME)/lib -lstandin"
        " -Wl,-rpath,$(STANDIN_HOME)/lib\n"
    ),
    "tests/perf.c": (
        '#include <stdio.h>\n#include "standin.h"\n'
        "int main(void)\n{\n"
        '    printf("standin_perf (a STAND-IN for all_reduce_perf): libstandin answers %d\\n", standin_answer());\n'
        "    return 0;\n}\n"
    ),
}

# (tag, answer) of the prefix stand-in
PREFIX_COMMITS = (("p1.0", 1), ("p2.0", 2))


def prefix_files(answer: int) -> dict[str, str]:
    """The prefix stand-in's files at one commit."""
    return {**_PREFIX_FILES, "lib/standin.c": f"int standin_answer(void) {{ return {answer}; }}\n"}


def files(version: str, answer: int, broken: bool) -> dict[str, str]:
    """The project's files at one commit."""
    return {
        **_FILES,
        "setup.py": _SETUP.format(version=version),
        "src/native.c": _NATIVE.format(answer=answer, broken=" +" if broken else ""),
    }


def _git(cwd: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, **_GIT_ENV}
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _repository(site: Path, repository: str, commits: list[tuple[str, str, dict[str, str], dict]]) -> dict:
    """A bare repository at ``site/repository`` of ``commits`` (tag, message, files, what the
    description says of it), each tagged; its refs as the description lists them."""
    with tempfile.TemporaryDirectory() as temp:
        work = Path(temp) / "work"
        work.mkdir()
        _git(work, "init", "--quiet", "--initial-branch=main")
        refs = {}
        for number, (tag, message, texts, described) in enumerate(commits):
            for name, text in texts.items():
                (work / name).parent.mkdir(parents=True, exist_ok=True)
                (work / name).write_text(text)
            _git(work, "add", "--all")
            date = f"2026-01-0{number + 1}T12:00:00+00:00"
            _git(work, "commit", "--quiet", "-m", message, date=date)
            _git(work, "tag", tag)
            refs[tag] = {"commit": _git(work, "rev-parse", "HEAD"), **described}
        bare = site / repository
        bare.parent.mkdir(parents=True, exist_ok=True)
        _git(site, "clone", "--quiet", "--bare", str(work), str(bare))
        _git(bare, "update-server-info")
    return refs


def build(site: Path) -> None:
    """Make the bare repositories and their description below ``site``."""
    refs = _repository(
        site,
        REPOSITORY,
        [
            (
                tag,
                f"sparkrig lab project {version}",
                files(version, answer, broken),
                {"version": version, "answer": answer},
            )
            for tag, version, answer, broken in COMMITS
        ],
    )
    prefix_refs = _repository(
        site,
        PREFIX_REPOSITORY,
        [
            (tag, f"sparkrig lab prefix stand-in {tag}", prefix_files(answer), {"answer": answer})
            for tag, answer in PREFIX_COMMITS
        ],
    )
    (site / DESCRIPTION).write_text(
        json.dumps(
            {
                "name": NAME,
                "path": f"/{REPOSITORY}",
                "refs": refs,
                "prefix": {"name": PREFIX_NAME, "path": f"/{PREFIX_REPOSITORY}", "refs": prefix_refs},
            },
            indent=2,
        )
        + "\n"
    )


def read_description(site: Path) -> dict | None:
    path = site / DESCRIPTION
    return json.loads(path.read_text()) if path.is_file() else None
