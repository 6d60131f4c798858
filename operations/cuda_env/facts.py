"""CUDA environment: the toolkits the host has, read to choose CUDA_HOME."""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from sparkrig import host_output

CUDA_LINK = "/usr/local/cuda"
_TOOLKIT = re.compile(r"/cuda-(\d+)(?:\.(\d+))?\Z")


class CudaToolkits(FactBase):
    """
    Returns where ``/usr/local/cuda`` leads (every link followed; ``None`` when it is
    missing or dangling) and the ``/usr/local/cuda-*`` toolkit directories.

    .. code:: python

        {"link": "/usr/local/cuda-13.0", "toolkits": ["/usr/local/cuda-12.8", "/usr/local/cuda-13.0"]}
    """

    def command(self) -> str:
        return (
            f"if [ -e {CUDA_LINK} ]; then echo link $(readlink -f {CUDA_LINK}); fi; "
            f'for d in {CUDA_LINK}-*/; do [ -d "$d" ] && echo toolkit "${{d%/}}"; done; true'
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        link, toolkits = None, []
        for line in output:
            kind, _, path = line.partition(" ")
            if kind == "link" and path:
                link = path
            elif kind == "toolkit" and path:
                toolkits.append(path)
        return {"link": link, "toolkits": sorted(toolkits, key=toolkit_version)}

    @staticmethod
    def default() -> dict:
        return {"link": None, "toolkits": []}


def toolkit_version(path: str) -> tuple[int, int]:
    """(major, minor) of a ``/usr/local/cuda-X.Y`` path, minor -1 for ``cuda-X``
    (Ubuntu's per-major alternative); (-1, -1) when the name holds no version."""
    match = _TOOLKIT.search(path)
    if not match:
        return (-1, -1)
    return (int(match[1]), int(match[2]) if match[2] else -1)
