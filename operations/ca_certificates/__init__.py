"""
Extra CA certificates: the roots a fleet behind a TLS-intercepting proxy must trust.

Each entry of ``ca_certificates_extra`` becomes
``/usr/local/share/ca-certificates/sparkrig-<name>.crt`` (root, 0644), and
``update-ca-certificates`` adds it to the system store that apt, curl, Docker and
pip read. uv reads that store too, because sparkrig runs it with
``UV_SYSTEM_CERTS=1`` (operations/python_stack.py). Entries removed from the
setting are removed from the host. A converged host costs one remote command.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation

from sparkrig import atomic, reading
from sparkrig.packages import installed as install_packages
from sparkrig.settings import ALL_DEFAULTS

from .settings import _NAME, _PEM, SETTINGS, _entry_problem, extra_check  # noqa: F401 (re-exported)

CERT_DIR = "/usr/local/share/ca-certificates"
LINK_DIR = "/etc/ssl/certs"
PREFIX = "sparkrig-"








def cert_file(name: str) -> str:
    return f"{CERT_DIR}/{PREFIX}{name}.crt"


def pem_content(pem: str) -> str:
    """The file's content: the PEM text with exactly one trailing newline."""
    return pem.strip() + "\n"


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
            f"for f in {CERT_DIR}/{PREFIX}*.crt; do [ -f \"$f\" ] || continue; "
            f"n=${{f##*/}}; l=no; [ -L \"{LINK_DIR}/${{n%.crt}}.pem\" ] && l=yes; "
            "echo file $(sha256sum < \"$f\" | cut -d' ' -f1) $(stat -c '%a %U' \"$f\") $l \"$f\"; "
            "done; true"
        )

    @atomic.parses
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


@operation()
def refresh_store(remove: Sequence[str] = ()):
    """
    Rebuild the system CA store from the certificate directories.

    + remove: certificate files to delete first (no longer trusted)

    **Example:**

    .. code:: python

        refresh_store(name="Refresh the CA store", remove=["/usr/local/share/ca-certificates/old.crt"])
    """
    if remove:
        atomic.detail(f"no longer trusted: {', '.join(remove)}")
        yield StringCommand("rm", "-f", *[QuoteString(path) for path in remove])
    # --fresh: the links of removed certificates go too.
    yield StringCommand("update-ca-certificates", "--fresh")


# What the concern decides from, in the host's one reading.
CERTIFICATES = reading.part(SparkrigCaCertificates)


@reading.planner
def reads(_settings):
    return [CERTIFICATES]


@deploy("Extra CA certificates", data_defaults=ALL_DEFAULTS)
def ca_certificates():
    """
    Make the hosts trust the CA certificates of ``ca_certificates_extra``, and no
    certificate sparkrig wrote earlier that the setting no longer names.

    Settings: ``ca_certificates_extra``; see docs/settings.md.
    """
    wanted = {cert_file(name): pem_content(pem) for name, pem in host.data.ca_certificates_extra.items()}
    found = reading.value(CERTIFICATES)
    if wanted and not found["tool"]:
        install_packages(name="Install ca-certificates", packages=["ca-certificates"])
    changed = False
    for path, content in sorted(wanted.items()):
        current = found["files"].get(path)
        digest = hashlib.sha256(content.encode()).hexdigest()
        if current and (current["sha256"], current["mode"], current["user"]) == (digest, 0o644, "root"):
            changed = changed or not current["linked"]
            continue
        changed = True
        atomic.file(
            name="An extra CA certificate (ca_certificates_extra)",
            dest=path,
            content=content,
            mode=0o644,
            validate=("openssl", "x509", "-noout", "-in"),
        )
    stale = sorted(set(found["files"]) - set(wanted))
    if changed or stale:
        refresh_store(
            name="Refresh the system CA store (update-ca-certificates)",
            remove=stale,
        )
