"""The controller's locks, resolved for real: the shipped manifest and every profile for
aarch64 and x86_64 against PyPI (uv's own resolver; its cache keeps it to seconds once warm),
and a named index that serves only its own packages (a local index with a decoy). Without
PyPI (or uv) those tests skip, saying so, and fail under CI=true (tests.support.unavailable).
uv's refusals (its reason kept, a development snapshot refused) against a local index alone."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from lab import wheelhouse
from sparkrig import python_wheels
from sparkrig import stack_locks as ps_locks
from sparkrig.tools import python_lock
from tests.support import REPO, unavailable

MANIFEST = ps_locks.load_manifest()


@functools.cache
def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
        return True
    except OSError:
        return False


@pytest.fixture
def uv() -> str:
    """uv, which resolves the locks; skipped where missing, failed under CI (tests.support.unavailable)."""
    found = shutil.which("uv")
    return found or unavailable("uv is not installed (https://docs.astral.sh/uv/; .ci/install has it)")


@pytest.fixture
def pypi(uv) -> None:
    """uv and PyPI; skipped where out of reach, failed under CI (tests.support.unavailable)."""
    if not _pypi_reachable():
        unavailable("PyPI is out of reach from here (https://pypi.org/simple/pip/ did not answer)")


needs_pypi = pytest.mark.usefixtures("pypi")


@needs_pypi
def test_the_real_manifest_and_every_profile_resolve_for_both_architectures():
    combos = [
        (arch, profiles) for arch in ("aarch64", "x86_64") for profiles in ([], *[[p] for p in MANIFEST["profiles"]])
    ]
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda c: python_lock.compile_lock(MANIFEST, c[1], c[0]), combos))
    for (arch, profiles), text in zip(combos, texts):
        entries = dict(python_wheels.lock_entries(text))
        for name, version in ps_locks.pins(MANIFEST, profiles).items():
            if name != "vllm":
                assert entries[name][0] == f"{name}=={version} \\", (arch, profiles, name)
        assert entries["torch"][0] == "torch==2.11.0 \\" and "    # from https://pypi.org/simple" in entries["torch"]
        assert entries["cuda-toolkit"][0].startswith("cuda-toolkit==13.0.2")  # PyPI's torch is the CUDA 13.0 build
        assert ps_locks.lock_stamp(text) == ps_locks.lock_input(MANIFEST, profiles, arch)
        # unsloth requires xformers: PyPI's wheel on x86_64; on aarch64, none, so a source build's.
        needs_build = arch == "aarch64" and profiles == ["unsloth"]
        assert ("xformers" in entries) == (profiles == ["unsloth"] and not needs_build), (arch, profiles)
        assert ps_locks.lock_from_source(text) == (["xformers"] if needs_build else []), (arch, profiles)


def _committed(arch: str, profiles: list[str]) -> str:
    return ps_locks.read_lock(ps_locks.locks_dir(ps_locks.LOCKS) / ps_locks.lock_name(MANIFEST, profiles, arch))


@needs_pypi
def test_every_committed_lock_is_installable_by_its_hosts():
    """Each pin of each committed lock, resolved as its hosts install it: wheels only, for
    that architecture, the manifest's Python and the lock's glibc floor."""
    combos = [
        (arch, profiles) for arch in MANIFEST["locks"]["architectures"] for profiles in MANIFEST["locks"]["profiles"]
    ]
    with ThreadPoolExecutor(len(combos)) as pool:
        found = list(
            pool.map(lambda c: python_lock.installable_problem(_committed(*c), c[0], MANIFEST["python"]), combos)
        )
    assert found == [None] * len(combos), found


@needs_pypi
def test_a_lock_a_host_could_not_install_is_refused_naming_package_architecture_and_reason():
    lock = (
        "six==1.17.0 \\\n    --hash=sha256:" + "0" * 64 + "\nxformers==0.0.35 \\\n    --hash=sha256:" + "1" * 64 + "\n"
    )
    problem = python_lock.installable_problem(lock, "aarch64", "3.12")
    assert "xformers has no wheel for aarch64 (CPython 3.12, manylinux_2_35)" in problem
    assert "hosts install wheels only" in problem
    assert python_lock.installable_problem(lock, "x86_64", "3.12") is None


@needs_pypi
def test_check_reports_a_committed_lock_a_host_could_not_install(tmp_path, capsys):
    # The aarch64 Unsloth lock as it was committed before: fresh for its manifest, and xformers
    # 0.0.35 (sdist and x86_64 wheels only) in it.
    manifest = {**MANIFEST, "locks": {"architectures": ["aarch64"], "profiles": [["unsloth"]]}}
    (tmp_path / "stack.yml").write_text(yaml.safe_dump(manifest))
    locks = tmp_path / "locks"
    locks.mkdir()
    name = ps_locks.lock_name(manifest, ["unsloth"], "aarch64")
    (locks / name).write_text(
        _committed("aarch64", ["unsloth"]) + "xformers==0.0.35 \\\n    --hash=sha256:" + "1" * 64 + "\n"
    )
    assert python_lock.main(["--manifest", str(tmp_path / "stack.yml"), "--locks", str(locks), "--check"]) == 1
    said = capsys.readouterr().err
    assert f"{name}: a host could not install it: xformers has no wheel for aarch64" in said


@needs_pypi
def test_a_package_without_a_wheel_is_refused_unless_left_to_a_source_build():
    manifest = {
        "python": "3.12",
        "torch": None,
        "vllm": None,
        "packages": {"xformers": "0.0.33"},
        "profiles": {},
        "locks": {"architectures": ["aarch64", "x86_64"], "profiles": [[]]},
    }
    with pytest.raises(RuntimeError) as error:
        python_lock.compile_lock(manifest, [], "aarch64")
    assert "xformers has no wheel for aarch64 (CPython 3.12, manylinux_2_35)" in str(error.value)
    manifest["from_source"] = {"xformers": ["aarch64"]}
    text = python_lock.compile_lock(manifest, [], "aarch64")
    assert "xformers" not in dict(python_wheels.lock_entries(text)) and ps_locks.lock_from_source(text) == ["xformers"]
    # Left out with what it alone needs: a built wheel's requirements come from the rest of the lock.
    assert python_wheels.lock_entries(text) == []
    x86 = python_lock.compile_lock(manifest, [], "x86_64")  # x86_64 has PyPI's wheel
    assert (
        dict(python_wheels.lock_entries(x86))["xformers"][0] == "xformers==0.0.33 \\"
        and ps_locks.lock_from_source(x86) == []
    )


def test_a_development_snapshot_the_manifest_does_not_pin_is_found():
    # What uv takes when no release has a wheel: xformers 0.0.35.dev1147, a py3-none-any wheel.
    lock = "xformers==0.0.35.dev1147 \\\n    --hash=sha256:" + "1" * 64 + "\nsix==1.17.0\n"
    assert python_lock.dev_snapshots(lock, {}) == ["xformers==0.0.35.dev1147"]
    assert python_lock.dev_snapshots(lock, {"xformers": "0.0.35.dev1147"}) == []
    assert python_lock.dev_snapshots("opentelemetry-semantic-conventions==0.66b2\n", {}) == []  # a beta is a release


def _decoy_wheel(name: str, version: str) -> tuple[str, bytes]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        info = f"{name}-{version}.dist-info"
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


@pytest.fixture
def local_index(tmp_path):
    """An index holding the lab's vLLM STAND-IN and a decoy six 99.0 (newer than PyPI's)."""
    root = tmp_path / "site"
    wheels_dir = root / wheelhouse.ROOT
    wheels_dir.mkdir(parents=True)
    files = {}
    for name, data in (wheelhouse.standin_vllm_wheel(), _decoy_wheel("six", "99.0")):
        (wheels_dir / name).write_bytes(data)
        files[name] = hashlib.sha256(data).hexdigest()
    for path, content in wheelhouse.index_files(files).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    handler = partial(SimpleHTTPRequestHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/{wheelhouse.ROOT}/simple"
    server.shutdown()


@needs_pypi
def test_a_named_index_serves_only_the_packages_named_for_it(local_index):
    manifest = {
        "python": "3.12",
        "torch": None,
        "vllm": {"name": wheelhouse.STANDIN_NAME, "version": wheelhouse.STANDIN_VERSION, "index_url": local_index},
        "packages": {"six": "1.17.0"},
        "profiles": {},
        "locks": {"architectures": ["x86_64"], "profiles": [[]]},
    }
    entries = dict(python_wheels.lock_entries(python_lock.compile_lock(manifest, [], "x86_64")))
    assert f"    # from {local_index}" in entries[wheelhouse.STANDIN_NAME]
    # six is pinned from PyPI; the decoy 99.0 on the named index is never looked at.
    assert entries["six"][0] == "six==1.17.0 \\" and "    # from https://pypi.org/simple" in entries["six"]
    manifest["packages"] = {}
    manifest["profiles"] = {"extra": {"six": "99.0"}}
    with pytest.raises(RuntimeError, match="could not resolve"):
        python_lock.compile_lock(manifest, ["extra"], "x86_64")


def test_offline_tags_accept_the_hosts_wheels_only():
    tags = python_wheels.target_tags("aarch64", "3.12")
    assert python_wheels._fits("torch-2.11.0-cp312-cp312-manylinux_2_28_aarch64.whl", tags)
    assert python_wheels._fits("six-1.17.0-py2.py3-none-any.whl", tags)
    assert python_wheels._fits("vllm-0.20.2-cp38-abi3-manylinux_2_35_aarch64.whl", tags)
    # torch's CUDA 13 runtime wheels carry the older manylinux names (found installing the real stack).
    x86 = python_wheels.target_tags("x86_64", "3.11")
    assert python_wheels._fits("nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl", x86)
    assert python_wheels._fits(
        "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl", tags
    )
    assert python_wheels._fits("x-1.0-py3-none-manylinux1_x86_64.whl", x86)
    assert not python_wheels._fits("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", tags)
    assert not python_wheels._fits("torch-2.11.0-cp311-cp311-manylinux_2_28_aarch64.whl", tags)
    assert not python_wheels._fits("x-1.0-cp312-cp312-manylinux_2_39_aarch64.whl", tags)  # newer glibc than the lock's


def test_under_ci_a_test_that_needs_pypi_fails_instead_of_skipping(tmp_path):
    """The lock tests skipped entirely without PyPI, even under CI=true. One of
    them, run as CI runs it with PyPI out of reach (every HTTPS request sent to a closed
    port), fails naming why; outside CI it is skipped, naming why."""
    test = (
        "tests/unit/tools/test_python_lock.py::"
        "test_a_lock_a_host_could_not_install_is_refused_naming_package_architecture_and_reason"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    env.update(https_proxy="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
    said = {}
    for ci in ("true", ""):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", test, "-p", "no:cacheprovider", "-p", "no:xdist", "-rsf"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "CI": ci},
        )
        said[ci] = (result.returncode, result.stdout)
    assert said["true"][0] == 1 and "CI provides it, yet PyPI is out of reach from here" in said["true"][1], said
    assert said[""][0] == 0 and "1 skipped" in said[""][1] and "PyPI is out of reach from here" in said[""][1], said


# --- uv's refusals, against a local index (no PyPI needed) -----------------------------------


def _wheel(name: str, version: str, requires: tuple[str, ...] = ()) -> tuple[str, bytes]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        info = f"{name}-{version}.dist-info"
        wheel.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


@pytest.fixture
def snapshot_index(tmp_path, monkeypatch):
    """A PEP 503 index on 127.0.0.1 (http.server): ``parent`` 1.0 needs ``child``, of which
    only a development snapshot has a wheel (as xformers 0.0.35.dev1147 on aarch64); and
    ``srconly`` 1.0, an sdist alone. uv is kept off the network: no proxy for it, and no
    Python 3.12 downloaded for ``--python-version`` (it tried, and waited out the retries)."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    root = tmp_path / "index"
    projects = {
        "parent": [_wheel("parent", "1.0", ("child",))],
        "child": [_wheel("child", "0.1.dev1")],
        "srconly": [("srconly-1.0.tar.gz", b"an sdist: never built, wheels only")],
    }
    for project, files in projects.items():
        (root / "simple" / project).mkdir(parents=True)
        links = ""
        for name, data in files:
            (root / name).write_bytes(data)
            links += f'<a href="../../{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>\n'
        (root / "simple" / project / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple"
    server.shutdown()
    server.server_close()


def test_a_refusal_keeps_uvs_own_reason(uv, snapshot_index):
    problem = python_lock.installable_problem("srconly==1.0\n", "aarch64", "3.12", snapshot_index)
    assert "srconly has no wheel for aarch64 (CPython 3.12, manylinux_2_35)" in problem
    # uv's whole message follows, as uv said it.
    assert "uv said:\n" in problem and "we can conclude that your requirements are unsatisfiable" in problem


def test_a_development_snapshot_the_manifest_does_not_pin_is_refused(uv, snapshot_index):
    """uv takes a .devN when no release has a wheel: the lock is refused, naming it."""
    manifest = {
        "python": "3.12",
        "torch": None,
        "vllm": None,
        "packages": {"parent": "1.0"},
        "profiles": {},
        "locks": {"architectures": ["aarch64"], "profiles": [[]]},
    }
    with pytest.raises(
        RuntimeError, match=r"child has no usable wheels but the development snapshot child==0\.1\.dev1"
    ):
        python_lock.compile_lock(manifest, [], "aarch64", snapshot_index)
    manifest["packages"]["child"] = "0.1.dev1"  # pinned in the manifest: meant
    entries = dict(python_wheels.lock_entries(python_lock.compile_lock(manifest, [], "aarch64", snapshot_index)))
    assert entries["child"][0] == "child==0.1.dev1 \\"
