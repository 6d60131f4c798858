"""
Extra CA certificate controls: each configured certificate is in the system store.

Expected values come from the settings alone, independently of the code that converges
(operations/ca_certificates/).
"""

from __future__ import annotations

import pytest

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


def test_extra_certificates_are_root_owned_files_with_the_configured_content(host, extra):
    """Protects against a trust store that anyone can widen: a writable certificate file
    lets its writer intercept every TLS connection the host makes (apt, pip, uv, Docker)."""
    for name, pem in extra.items():
        f = host.file(f"{CERT_DIR}/sparkrig-{name}.crt")
        assert f.is_file, f"{f.path} is missing"
        assert (f.user, f.group, f.mode) == ("root", "root", 0o644), f"{f.path}: {f.user} {f.mode:o}"
        assert _body(f.content_string) == _body(pem), f"{f.path} holds another certificate"


def test_extra_certificates_are_in_the_system_bundle(host, extra):
    """Protects against failing downloads behind a TLS-intercepting proxy ("self-signed
    certificate in certificate chain"): the file alone is not trusted until
    update-ca-certificates has put it into the bundle every TLS client reads."""
    bundle = _body(host.file(BUNDLE).content_string.replace("-----END CERTIFICATE-----", "\n"))
    for name, pem in extra.items():
        assert _body(pem) in bundle, f"{name} is not in {BUNDLE}"


# What the read-only controls above ask, read once per host before they run (reads.py).
def reads(plan, settings) -> None:
    for name in settings["ca_certificates_extra"]:
        plan.file(f"{CERT_DIR}/sparkrig-{name}.crt")
    if settings["ca_certificates_extra"]:
        plan.run("cat -- %s", BUNDLE)
