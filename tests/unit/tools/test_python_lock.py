"""The controller's locks, resolved for real: the shipped manifest and every profile for
aarch64 and x86_64 against PyPI (uv's own resolver; its cache keeps it to seconds once warm),
and a named index that serves only its own packages (a local index with a decoy)."""

from __future__ import annotations

import hashlib
import io
import shutil
import threading
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lab import wheelhouse
from sparkrig import python_wheels
from sparkrig.operations import python_stack as ps
from tools import python_lock

MANIFEST = ps.load_manifest()


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
        return True
    except OSError:
        return False


needs_pypi = pytest.mark.skipif(
    shutil.which("uv") is None or not _pypi_reachable(), reason="uv or PyPI is out of reach from here"
)


@needs_pypi
def test_the_real_manifest_and_every_profile_resolve_for_both_architectures():
    combos = [(arch, profiles) for arch in ("aarch64", "x86_64") for profiles in ([], *[[p] for p in MANIFEST["profiles"]])]
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda c: python_lock.compile_lock(MANIFEST, c[1], c[0]), combos))
    for (arch, profiles), text in zip(combos, texts):
        entries = dict(ps.lock_entries(text))
        for name, version in ps.pins(MANIFEST, profiles).items():
            if name != "vllm":
                assert entries[name][0] == f"{name}=={version} \\", (arch, profiles, name)
        assert entries["torch"][0] == "torch==2.11.0 \\" and "    # from https://pypi.org/simple" in entries["torch"]
        assert entries["cuda-toolkit"][0].startswith("cuda-toolkit==13.0.2")  # PyPI's torch is the CUDA 13.0 build
        assert ps.lock_stamp(text) == ps.lock_input(MANIFEST, profiles, arch)


def _decoy_wheel(name: str, version: str) -> tuple[str, bytes]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        info = f"{name}-{version}.dist-info"
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
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
        "python": "3.12", "torch": None,
        "vllm": {"name": wheelhouse.STANDIN_NAME, "version": wheelhouse.STANDIN_VERSION, "index_url": local_index},
        "packages": {"six": "1.17.0"}, "profiles": {},
        "locks": {"architectures": ["x86_64"], "profiles": [[]]},
    }
    entries = dict(ps.lock_entries(python_lock.compile_lock(manifest, [], "x86_64")))
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
    assert not python_wheels._fits("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", tags)
    assert not python_wheels._fits("torch-2.11.0-cp311-cp311-manylinux_2_28_aarch64.whl", tags)
    assert not python_wheels._fits("x-1.0-cp312-cp312-manylinux_2_39_aarch64.whl", tags)  # newer glibc than the lock's
