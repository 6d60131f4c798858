"""The lab's source-build project: a git repository served for git's dumb HTTP protocol,
with the same commit ids on every machine, whose tags build (or fail to build) as documented."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from lab import sourcebuild


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not shutil.which("git"):
        pytest.skip("git is not installed on this machine")
    root = tmp_path_factory.mktemp("site")
    sourcebuild.build(root)
    return root


def test_commit_ids_are_the_same_on_every_build(site, tmp_path):
    sourcebuild.build(tmp_path)
    assert sourcebuild.read_description(tmp_path) == sourcebuild.read_description(site)


def test_the_description_names_every_tag_with_its_commit(site):
    description = sourcebuild.read_description(site)
    assert description["path"] == "/sources/sparkrig-lab-ext.git"
    assert list(description["refs"]) == ["v1.0", "v2.0", "v3.0-broken"]
    for tag, ref in description["refs"].items():
        commit = subprocess.run(
            ["git", "-C", str(site / sourcebuild.REPOSITORY), "rev-parse", f"refs/tags/{tag}^{{commit}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert ref["commit"] == commit


def test_the_repository_is_ready_for_dumb_http(site):
    bare = site / sourcebuild.REPOSITORY
    refs = (bare / "info" / "refs").read_text()
    assert "refs/tags/v1.0" in refs and (bare / "objects" / "info" / "packs").exists()


def test_each_commit_holds_its_version_and_answer():
    good = sourcebuild.files("2.0.0", 2, False)
    assert 'version="2.0.0"' in good["setup.py"] and "PyLong_FromLong(2);" in good["src/native.c"]
    assert "PyLong_FromLong(3) +;" in sourcebuild.files("3.0.0", 3, True)["src/native.c"]


def test_the_setup_script_is_valid_python():
    compile(sourcebuild.files("1.0.0", 1, False)["setup.py"], "setup.py", "exec")


def test_the_prefix_stand_in_is_described_with_its_tags_and_answers(site):
    """The STAND-IN for NCCL and nccl-tests (lab/sourcebuild.py): its own repository, tags p1.0 and
    p2.0 whose library answers differently, the program's makefile linking it by RUNPATH."""
    prefix = sourcebuild.read_description(site)["prefix"]
    assert prefix["path"] == "/sources/sparkrig-lab-prefix.git"
    assert {tag: ref["answer"] for tag, ref in prefix["refs"].items()} == {"p1.0": 1, "p2.0": 2}
    assert prefix["refs"]["p1.0"]["commit"] != prefix["refs"]["p2.0"]["commit"]
    assert "return 2;" in sourcebuild.prefix_files(2)["lib/standin.c"]
    assert "-Wl,-rpath,$(STANDIN_HOME)/lib" in sourcebuild.prefix_files(1)["tests/Makefile"]
