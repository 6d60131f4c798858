"""Extra CA certificates: the deploy, deciding from the one reading what to write and remove."""

from __future__ import annotations

import hashlib

from pyinfra.api import deploy

from sparkrig import atomic, host_settings, reading
from sparkrig.packages import installed as install_packages

from .facts import CERT_DIR, PREFIX, SparkrigCaCertificates
from .operations import refresh_store
from .settings import DEFAULTS


def cert_file(name: str) -> str:
    return f"{CERT_DIR}/{PREFIX}{name}.crt"


def pem_content(pem: str) -> str:
    """The file's content: the PEM text with exactly one trailing newline."""
    return pem.strip() + "\n"


# What the concern decides from, in the host's one reading.
CERTIFICATES = reading.part(SparkrigCaCertificates)


@reading.planner
def reads(_settings):
    return [CERTIFICATES]


@deploy("Extra CA certificates", data_defaults=DEFAULTS)
def ca_certificates():
    """
    Make the hosts trust the CA certificates of ``ca_certificates_extra``, and no
    certificate sparkrig wrote earlier that the setting no longer names.

    Settings: ``ca_certificates_extra``; see docs/settings.md.
    """
    settings = host_settings.current()
    wanted = {cert_file(name): pem_content(pem) for name, pem in settings.ca_certificates_extra.items()}
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
