"""The lab's registry stand-in: the image is byte for byte the same on every build, its
manifest names its blobs by their digests, and the repository server answers the
registry API's version check and serves manifests with their media type."""

import gzip
import hashlib
import http.client
import io
import json
import subprocess
import sys
import tarfile

from lab import registry, reposerver

BUSYBOX = b"\x7fELF not really busybox"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_the_image_is_byte_identical_on_every_build():
    assert registry.blobs(BUSYBOX) == registry.blobs(BUSYBOX)
    assert registry.blobs(BUSYBOX)[0] != registry.blobs(BUSYBOX + b"x")[0]


def test_the_manifest_names_its_blobs_by_digest_and_the_layer_holds_busybox():
    manifest, blobs = registry.blobs(BUSYBOX)
    document = json.loads(manifest)
    assert document["mediaType"] == registry.MANIFEST_TYPE
    config, layer = document["config"], document["layers"][0]
    assert _digest(blobs[config["digest"]]) == config["digest"]
    assert len(blobs[layer["digest"]]) == layer["size"]
    tar = gzip.decompress(blobs[layer["digest"]])
    assert json.loads(blobs[config["digest"]])["rootfs"]["diff_ids"] == [_digest(tar)]
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        assert archive.extractfile("bin/busybox").read() == BUSYBOX
        assert archive.getmember("bin/sh").linkname == "busybox"
    assert "STAND-IN" in json.loads(blobs[config["digest"]])["config"]["Labels"]["org.opencontainers.image.title"]


def test_build_writes_the_registry_layout_and_its_description(tmp_path):
    busybox = tmp_path / "busybox"
    busybox.write_bytes(BUSYBOX)
    site = tmp_path / "site"
    described = registry.build(site, busybox)
    assert registry.read_description(site) == described
    manifest = site / "v2" / registry.NAME / "manifests" / described["digest"]
    assert _digest(manifest.read_bytes()) == described["digest"]
    assert (site / "v2" / registry.NAME / "manifests" / registry.TAG).read_bytes() == manifest.read_bytes()
    assert registry.build(site, busybox) == described


def test_the_repository_server_speaks_enough_of_the_registry_api(tmp_path):
    busybox = tmp_path / "busybox"
    busybox.write_bytes(BUSYBOX)
    described = registry.build(tmp_path, busybox)
    server = subprocess.Popen(
        [sys.executable, "-I", reposerver.__file__, "--root", str(tmp_path), "--port", "18799", "127.0.0.1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reposerver.READY in server.stderr.readline()
        connection = http.client.HTTPConnection("127.0.0.1", 18799, timeout=10)
        connection.request("GET", "/v2/")
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        assert response.getheader("Docker-Distribution-API-Version") == "registry/2.0"
        connection.request("GET", f"/v2/{registry.NAME}/manifests/{described['digest']}")
        response = connection.getresponse()
        body = response.read()
        assert response.getheader("Content-Type") == registry.MANIFEST_TYPE
        assert _digest(body) == described["digest"]
    finally:
        server.terminate()
        server.wait()
