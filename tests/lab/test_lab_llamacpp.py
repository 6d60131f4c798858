"""lab/llamacpp.py: the sdist is used only with its pinned sha256, the build is keyed on the hash
and the flags, and the tiny random model is a GGUF file of the shape llama.cpp loads (the lab
test, tests/converge/test_serving_lab.py, has the real llama-server serve it)."""

from __future__ import annotations

import hashlib
import struct

import pytest

from lab import llamacpp
from lab.system import LabError


def test_an_sdist_whose_sha256_is_not_the_pinned_one_is_refused_before_it_is_opened(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp, "CACHE", tmp_path)
    (tmp_path / llamacpp.SDIST).write_bytes(b"not llama.cpp\n")
    opened = []
    monkeypatch.setattr(llamacpp, "_extract", lambda *args: opened.append(args))
    with pytest.raises(LabError, match="not the pinned 832db069"):
        llamacpp.build()
    assert opened == []
    assert not llamacpp.server_path().exists()


def test_the_pinned_hash_lets_the_sdist_through(tmp_path):
    path = tmp_path / "x.tar.gz"
    path.write_bytes(b"some bytes")
    assert llamacpp.verified_sdist(path, hashlib.sha256(b"some bytes").hexdigest()) == path


def test_a_built_server_is_reused_and_its_name_follows_the_hash_and_the_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp, "CACHE", tmp_path)
    llamacpp.server_path().write_bytes(b"built before")
    monkeypatch.setattr(llamacpp, "fetch_sdist", lambda: pytest.fail("a cached build fetched the sdist"))
    assert llamacpp.server() == llamacpp.server_path()
    before = llamacpp.build_key()
    monkeypatch.setattr(llamacpp, "FLAGS", (*llamacpp.FLAGS, "-DGGML_AVX512=ON"))
    assert llamacpp.build_key() != before
    monkeypatch.setattr(llamacpp, "SDIST_SHA256", "0" * 64)
    assert llamacpp.build_key() != before


def test_the_build_downloads_nothing_and_needs_glibc_alone():
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in llamacpp.FLAGS and "-DLLAMA_CURL=OFF" in llamacpp.FLAGS
    assert "-DGGML_OPENMP=OFF" in llamacpp.FLAGS
    assert "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc" in llamacpp.FLAGS


def _string(data: bytes, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", data, at)
    return data[at + 8 : at + 8 + n].decode(), at + 8 + n


def test_the_tiny_model_is_a_gguf_of_a_llama_with_random_weights(tmp_path):
    path = llamacpp.write_tiny_model(tmp_path / "tiny.gguf", seed=1)
    data = path.read_bytes()
    magic, version, tensors, kvs = struct.unpack_from("<4sIQQ", data)
    assert (magic, version) == (b"GGUF", 3)
    assert tensors == 2 + 9 * llamacpp.BLOCKS and kvs == 18
    _key, at = _string(data, 24)
    assert _key == "general.architecture"
    assert _string(data, at + 4)[0] == "llama"
    assert len(data) < 2 << 20
    assert llamacpp.write_tiny_model(tmp_path / "again.gguf", seed=1).read_bytes() == data
    assert llamacpp.write_tiny_model(tmp_path / "other.gguf", seed=2).read_bytes() != data
