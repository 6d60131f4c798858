"""The lab's wheelhouse: a stand-in wheel identical on every build, a PEP 503 index whose
links carry each file's sha256, and the description the lab inventory reads."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import zipfile

from lab import wheelhouse

TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_the_standin_wheel_is_byte_identical_on_every_build():
    assert wheelhouse.standin_vllm_wheel() == wheelhouse.standin_vllm_wheel()


def test_the_standin_wheel_is_a_valid_wheel_named_as_a_standin():
    name, data = wheelhouse.standin_vllm_wheel()
    assert name == "sparkrig_lab_standin_vllm-0.20.2-py3-none-any.whl"
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        record = wheel.read("sparkrig_lab_standin_vllm-0.20.2.dist-info/RECORD").decode()
        for line in record.splitlines():
            path, digest, size = line.split(",")
            if not digest:
                continue
            content = wheel.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(content)
        metadata = wheel.read("sparkrig_lab_standin_vllm-0.20.2.dist-info/METADATA").decode()
    assert "Name: sparkrig-lab-standin-vllm" in metadata and "stand-in" in metadata


def test_the_standin_wheel_installs_and_imports(tmp_path):
    name, data = wheelhouse.standin_vllm_wheel()
    (tmp_path / name).write_bytes(data)
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(tmp_path / name), str(tmp_path / "site")], check=True)
    out = subprocess.run(
        [sys.executable, "-c", "import sparkrig_lab_standin_vllm as m; print(m.__version__)"],
        cwd=tmp_path / "site",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "0.20.2"


def test_the_index_links_every_wheel_with_its_sha256():
    files = wheelhouse.index_files({TORCH: "a" * 64, "six-1.17.0-py2.py3-none-any.whl": "b" * 64})
    assert sorted(files) == [
        "wheels/simple/index.html",
        "wheels/simple/six/index.html",
        "wheels/simple/torch/index.html",
    ]
    assert f'href="../../{TORCH}#sha256={"a" * 64}"' in files["wheels/simple/torch/index.html"].decode()
    assert 'href="torch/"' in files["wheels/simple/index.html"].decode()


def test_the_description_names_torch_by_python_tag_and_the_standin_by_path():
    standin, _ = wheelhouse.standin_vllm_wheel()
    described = wheelhouse.description({TORCH: "a" * 64, standin: "c" * 64}, standin)
    assert described["torch"] == [{"version": "2.13.0+cpu", "python": "cp311", "file": TORCH}]
    assert described["vllm_standin"] == {
        "name": "sparkrig-lab-standin-vllm",
        "version": "0.20.2",
        "path": f"/wheels/{standin}",
        "sha256": "c" * 64,
    }
    json.dumps(described)


def test_build_writes_the_wheels_the_index_and_the_description(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / TORCH).write_bytes(b"not really torch")
    assert wheelhouse.local_torch_wheels(local) == [local / TORCH]
    assert wheelhouse.local_torch_wheels(tmp_path / "missing") == []
    site = tmp_path / "site"
    wheelhouse.build(site, wheelhouse.local_torch_wheels(local))
    described = wheelhouse.read_description(site)
    assert (site / "wheels" / TORCH).read_bytes() == b"not really torch"
    assert described["torch"][0]["file"] == TORCH
    index = (site / "wheels/simple/torch/index.html").read_text()
    assert hashlib.sha256(b"not really torch").hexdigest() in index
