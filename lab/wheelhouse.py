"""The lab's wheelhouse: a PEP 503 package index served beside the apt repositories.

The lab hosts reach PyPI (through NAT) but neither PyTorch's index nor a GPU, so
the lab serves, under ``wheels/`` of the repository site:

- the PyTorch CPU wheels that lie in this machine's local wheel folder
  (:data:`LOCAL_WHEEL_DIR`), when there are any, so that ``import torch`` is
  proven in the lab on a host whose Python matches one of them;
- ``sparkrig-lab-standin-vllm``: a STAND-IN for vLLM, named as such, a tiny
  pure-Python wheel built here byte for byte the same every time (so its sha256
  is stable). It proves the manifest's "wheel URL + sha256 per architecture"
  path for real; vLLM itself needs a GPU and 240 MB.

``wheels/simple/<project>/`` is the index (links carry ``#sha256=``),
``wheels/wheelhouse.json`` describes it for the lab inventory.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import shutil
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = "wheels"
STANDIN_NAME = "sparkrig-lab-standin-vllm"
STANDIN_VERSION = "0.20.2"
DESCRIPTION = f"{ROOT}/wheelhouse.json"
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-(?P<python>[^-]+)-[^-]+-[^-]+\.whl$")
_EPOCH = (1980, 1, 1, 0, 0, 0)


def local_torch_wheels(directory: Path) -> list[Path]:
    """The torch wheels in ``directory`` (none when it does not exist)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("torch-*.whl") if _WHEEL.match(p.name))


def standin_vllm_wheel() -> tuple[str, bytes]:
    """The stand-in wheel's file name and bytes, identical on every call."""
    module = STANDIN_NAME.replace("-", "_")
    dist_info = f"{module}-{STANDIN_VERSION}.dist-info"
    files = {
        f"{module}/__init__.py": (
            '"""STAND-IN for vLLM in the sparkrig lab: it proves the wheel-URL path, nothing else."""\n'
            f'__version__ = "{STANDIN_VERSION}"\n'
        ),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {STANDIN_NAME}\nVersion: {STANDIN_VERSION}\n"
            "Summary: sparkrig lab stand-in for vLLM (not vLLM)\n"
        ),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: sparkrig-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        data = text.encode()
        sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={sha},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, text)
    return f"{module}-{STANDIN_VERSION}-py3-none-any.whl", buffer.getvalue()


def _project(file_name: str) -> str:
    return re.sub(r"[-_.]+", "-", _WHEEL.match(file_name)["name"]).lower()


def index_files(wheels: Mapping[str, str]) -> dict[str, bytes]:
    """The simple index of ``wheels`` (file name: sha256), by path below the site."""
    projects: dict[str, list[str]] = {}
    for name in sorted(wheels):
        projects.setdefault(_project(name), []).append(name)
    files = {
        f"{ROOT}/simple/index.html": (
            "<!DOCTYPE html><html><body>\n"
            + "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(projects))
            + "</body></html>\n"
        ).encode()
    }
    for project, names in projects.items():
        links = "".join(f'<a href="../../{n}#sha256={wheels[n]}">{n}</a>\n' for n in names)
        files[f"{ROOT}/simple/{project}/index.html"] = (
            f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"
        ).encode()
    return files


def description(wheels: Mapping[str, str], standin: str) -> dict[str, object]:
    """What the lab inventory needs to know of the wheelhouse."""
    torch = []
    for name in sorted(wheels):
        match = _WHEEL.match(name)
        if match["name"] == "torch":
            torch.append({"version": match["version"], "python": match["python"], "file": name})
    return {
        "simple": f"/{ROOT}/simple",
        "torch": torch,
        "vllm_standin": {
            "name": STANDIN_NAME,
            "version": STANDIN_VERSION,
            "path": f"/{ROOT}/{standin}",
            "sha256": wheels[standin],
        },
    }


def recipe(torch_wheels: Sequence[Path]) -> list[object]:
    """What makes up the wheelhouse, for the site's cache key."""
    return [standin_vllm_wheel()[0], [(p.name, p.stat().st_size) for p in torch_wheels]]


def build(site: Path, torch_wheels: Sequence[Path]) -> None:
    """Write the wheelhouse below ``site`` (torch wheels copied: the site's files get
    their modes set, which must not touch the machine's own wheel folder)."""
    root = site / ROOT
    root.mkdir(parents=True, exist_ok=True)
    standin, data = standin_vllm_wheel()
    (root / standin).write_bytes(data)
    wheels = {standin: hashlib.sha256(data).hexdigest()}
    for wheel in torch_wheels:
        target = root / wheel.name
        shutil.copyfile(wheel, target)
        sha = hashlib.sha256()
        with open(target, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                sha.update(block)
        wheels[wheel.name] = sha.hexdigest()
    for path, content in index_files(wheels).items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(content)
    (site / DESCRIPTION).write_text(json.dumps(description(wheels, standin), indent=2) + "\n")


def read_description(site: Path) -> dict[str, object] | None:
    path = site / DESCRIPTION
    return json.loads(path.read_text()) if path.is_file() else None
