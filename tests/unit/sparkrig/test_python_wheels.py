"""python_offline's choice of wheels on the controller (sparkrig/python_wheels.py)."""

from __future__ import annotations

import hashlib

from sparkrig import python_wheels

ABI3 = "torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
ANY = "torchao-0.18.0-py3-none-any.whl"
BODY = {ABI3: b"abi3 wheel", ANY: b"any wheel"}
SHA = {name: hashlib.sha256(body).hexdigest() for name, body in BODY.items()}
# uv's lock lists a package's hashes sorted, not in the index's order.
LOCK = "torchao==0.18.0 \\\n" + " \\\n".join(f"    --hash=sha256:{sha}" for sha in sorted(SHA.values())) + "\n"


def _index(monkeypatch, asked: list):
    def index_files(index, name):
        asked.append(name)
        return [{"filename": f, "url": f"https://files.example/{f}", "hashes": {"sha256": SHA[f]}} for f in (ANY, ABI3)]

    def download(url, sha256, target):
        target.write_bytes(BODY[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(python_wheels, "_index_files", index_files)
    monkeypatch.setattr(python_wheels, "_download", download)


def test_each_host_gets_the_wheel_its_tags_prefer_whatever_the_cache_holds(tmp_path, monkeypatch):
    """Found converging the real stack: x86_64 got torchao's abi3 wheel, then its py3-none-any
    one once the aarch64 host had cached that, and the switch was a change at the next converge."""
    asked: list = []
    _index(monkeypatch, asked)
    assert list(python_wheels.offline_wheels(LOCK, "aarch64", "3.11", tmp_path)) == [ANY]
    assert list(python_wheels.offline_wheels(LOCK, "x86_64", "3.11", tmp_path)) == [ABI3]
    assert list(python_wheels.offline_wheels(LOCK, "x86_64", "3.11", tmp_path)) == [ABI3]
    assert list(python_wheels.offline_wheels(LOCK, "aarch64", "3.11", tmp_path)) == [ANY]
    assert asked == ["torchao"]  # the index's files are kept: later runs ask no index


def test_the_order_prefers_the_platform_wheel():
    order = python_wheels.tag_order("x86_64", "3.11")
    assert order.index("cp310-abi3-manylinux_2_28_x86_64") < order.index("py3-none-any")
    assert set(order) == python_wheels.target_tags("x86_64", "3.11")
