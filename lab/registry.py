"""The lab's image registry: a STAND-IN for nvcr.io, read-only, served beside the apt repositories.

The lab hosts cannot reach nvcr.io (nor Docker Hub), so the lab serves one image the
way a registry does (the Docker Registry HTTP API v2, read-only: ``GET /v2/``,
``/v2/<name>/manifests/<reference>``, ``/v2/<name>/blobs/<digest>``), from files
below the repository site, so that a deploy really pulls an image by its digest.

The image is ``sparkrig-lab/ngc-stand-in``: a STAND-IN for NVIDIA's PyTorch
container, named as such, holding nothing but a static busybox (``sh``, ``httpd``,
``true``) from the lab's Debian image. Its layer, config and manifest are built
byte for byte the same every time from the same busybox, so its digest is stable;
``registry/registry.json`` tells the lab inventory the reference to pin.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

NAME = "sparkrig-lab/ngc-stand-in"
TAG = "stand-in"
DESCRIPTION = "registry/registry.json"
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
TITLE = "sparkrig lab STAND-IN for nvcr.io/nvidia/pytorch: busybox only, not NGC"
# The busybox applets the stand-in links: a shell, the stand-in Jupyter's HTTP server.
APPLETS = ("sh", "true", "httpd", "cat", "echo", "ls", "mkdir", "sleep", "id", "env", "test")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer(busybox: bytes) -> bytes:
    """The image's one layer, an uncompressed tar with fixed owners and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for directory, mode in (("bin", 0o755), ("tmp", 0o1777), ("workspace", 0o755)):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(busybox), 0o755
        tar.addfile(info, io.BytesIO(busybox))
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(info)
    return buffer.getvalue()


def blobs(busybox: bytes) -> tuple[bytes, dict[str, bytes]]:
    """The manifest and the blobs it names (by digest), identical on every call."""
    tar = layer(busybox)
    compressed = gzip.compress(tar, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": ["sh"],
                "Labels": {"org.opencontainers.image.title": TITLE},
            },
            "rootfs": {"type": "layers", "diff_ids": [_digest(tar)]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "lab/registry.py"}],
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": _digest(config)},
            "layers": [{"mediaType": LAYER_TYPE, "size": len(compressed), "digest": _digest(compressed)}],
        },
        sort_keys=True,
    ).encode()
    return manifest, {_digest(config): config, _digest(compressed): compressed}


def build(site: Path, busybox: Path) -> dict[str, str]:
    """Write the registry's files below ``site`` (the same bytes every time) and its
    description; return the description."""
    manifest, found = blobs(busybox.read_bytes())
    digest = _digest(manifest)
    files = {
        f"v2/{NAME}/manifests/{digest}": manifest,
        f"v2/{NAME}/manifests/{TAG}": manifest,
        **{f"v2/{NAME}/blobs/{d}": data for d, data in found.items()},
    }
    description = {"name": NAME, "tag": TAG, "digest": digest, "image_id": next(iter(found))}
    files[DESCRIPTION] = (json.dumps(description, indent=2) + "\n").encode()
    for path, data in files.items():
        target = site / path
        if target.is_file() and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o644)
    for directory in {(site / path).parent for path in files} | {site / "v2", site / "registry"}:
        while directory != site:
            directory.chmod(0o755)
            directory = directory.parent
    return description


def read_description(site: Path) -> dict[str, str] | None:
    path = site / DESCRIPTION
    return json.loads(path.read_text()) if path.is_file() else None
