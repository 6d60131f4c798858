"""Extra CA certificates: the roots a fleet behind a TLS-intercepting proxy must trust:
the settings, declared once, and their checks."""

from __future__ import annotations

import re
from typing import Any

from sparkrig.settings import Setting, declare, defaults, mapping_of

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


_PEM = re.compile(r"-----BEGIN CERTIFICATE-----\n[A-Za-z0-9+/=\n]+-----END CERTIFICATE-----\n?")


def _entry_problem(name: Any, pem: Any) -> str | None:
    if not (isinstance(name, str) and _NAME.fullmatch(name) and isinstance(pem, str)):
        return f"bad entry: {name!r}"
    if not _PEM.fullmatch(pem.strip() + "\n"):
        return f"entry {name!r} is not one PEM certificate"
    return None


extra_check = mapping_of(
    "a mapping of names ([A-Za-z0-9._-], up to 64 characters) to the PEM text of ONE "
    "certificate (-----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----)",
    _entry_problem,
)


SETTINGS = (
    Setting(
        "ca_certificates_extra",
        {},
        "CA certificates the hosts trust besides the system's, by name: the PEM text of one "
        'certificate each, e.g. {"corp-proxy": open("files/corp-proxy.crt").read()}. Needed behind'
        " a TLS-intercepting proxy: apt, curl, Docker and pip read the system store, and uv does "
        "because sparkrig runs it with UV_SYSTEM_CERTS=1. Written to "
        "/usr/local/share/ca-certificates/sparkrig-<name>.crt; a name removed here is removed from"
        " the hosts.",
        extra_check,
    ),
)

DEFAULTS = defaults(SETTINGS)  # the settings this concern's deploy reads: its own

declare(__name__, SETTINGS)
