"""
Extra CA certificate controls: each configured certificate is in the system store.

Expected values come from the settings alone, independently of the code that converges
(operations/ca_certificates/).
"""

from __future__ import annotations

import pytest

from .reads import need

CERT_DIR = "/usr/local/share/ca-certificates"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _body(pem: str) -> str:
    """The base64 lines of a PEM certificate, joined: how it appears in any bundle."""
    return "".join(line.strip() for line in pem.strip().splitlines() if not line.startswith("-----"))


@pytest.fixture
def extra(settings) -> dict[str, str]:
    if not settings["ca_certificates_extra"]:
        pytest.skip("ca_certificates_extra is empty for this host: no extra CA to check")
    return settings["ca_certificates_extra"]


@need
def certificates(r) -> dict:
    """Each extra certificate's file (its reading and content) and the system bundle."""
    if not r.settings["ca_certificates_extra"]:
        return None
    files = {
        name: (r.path(f"{CERT_DIR}/sparkrig-{name}.crt"), r.file(f"{CERT_DIR}/sparkrig-{name}.crt"))
        for name in r.settings["ca_certificates_extra"]
    }
    return {"files": files, "bundle": r.file(BUNDLE)}


def test_extra_certificates_are_root_owned_files_with_the_configured_content(read, extra):
    """Protects against a trust store that anyone can widen: a writable certificate file
    lets its writer intercept every TLS connection the host makes (apt, pip, uv, Docker)."""
    files = read(certificates)["files"]
    for name, pem in extra.items():
        f, content = files[name]
        assert f.is_file, f"{f.path} is missing"
        assert (f.user, f.group, f.mode) == ("root", "root", 0o644), f"{f.path}: {f.user} {f.mode:o}"
        assert _body(content.check()) == _body(pem), f"{f.path} holds another certificate"


def test_extra_certificates_are_in_the_system_bundle(read, extra):
    """Protects against failing downloads behind a TLS-intercepting proxy ("self-signed
    certificate in certificate chain"): the file alone is not trusted until
    update-ca-certificates has put it into the bundle every TLS client reads."""
    bundle = _body(read(certificates)["bundle"].check().replace("-----END CERTIFICATE-----", "\n"))
    for name, pem in extra.items():
        assert _body(pem) in bundle, f"{name} is not in {BUNDLE}"
