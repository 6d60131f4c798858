"""Extra CA certificates: what sparkrig wrote to the host's store, read in one command."""

from __future__ import annotations

from pyinfra.api import FactBase

from sparkrig import host_output

CERT_DIR = "/usr/local/share/ca-certificates"
LINK_DIR = "/etc/ssl/certs"
PREFIX = "sparkrig-"


class SparkrigCaCertificates(FactBase):
    """
    Returns the CA files sparkrig wrote (``sparkrig-*.crt``) with their sha256, mode and
    owner, whether ``update-ca-certificates`` linked each into the store, and whether
    the tool is installed.

    .. code:: python

        {"tool": True, "files": {"/usr/local/share/ca-certificates/sparkrig-corp.crt":
            {"sha256": "3f...", "mode": 0o644, "user": "root", "linked": True}}}
    """

    def command(self) -> str:
        return (
            f"command -v update-ca-certificates >/dev/null && echo tool; "
            f'for f in {CERT_DIR}/{PREFIX}*.crt; do [ -f "$f" ] || continue; '
            f'n=${{f##*/}}; l=no; [ -L "{LINK_DIR}/${{n%.crt}}.pem" ] && l=yes; '
            'echo file $(sha256sum < "$f" | cut -d\' \' -f1) $(stat -c \'%a %U\' "$f") $l "$f"; '
            "done; true"
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found = self.default()
        for line in output:
            if line == "tool":
                found["tool"] = True
                continue
            parts = line.split(" ", 5)
            if len(parts) == 6 and parts[0] == "file":
                _, sha, mode, user, linked, path = parts
                found["files"][path] = {
                    "sha256": sha,
                    "mode": int(mode, 8),
                    "user": user,
                    "linked": linked == "yes",
                }
        return found

    @staticmethod
    def default() -> dict:
        return {"tool": False, "files": {}}
