"""Extra CA certificates: the setting's check, the fact, and the plan for new, converged,
unlinked and removed certificates."""

from __future__ import annotations

import hashlib

import pytest

from sparkrig.operations import ca_certificates as ca
from sparkrig.operations.ca_certificates import deploy as ca_deploy
from sparkrig.operations.ca_certificates import facts as ca_facts
from sparkrig.settings import problems
from tests.unit.pyinfra_fake import execute

PEM = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUabc=\n-----END CERTIFICATE-----\n"
FACT = "update-ca-certificates >/dev/null && echo tool"
PATH = "/usr/local/share/ca-certificates/sparkrig-corp.crt"


def _line(path=PATH, content=PEM, mode="644", user="root", linked="yes") -> str:
    return f"file {hashlib.sha256(content.encode()).hexdigest()} {mode} {user} {linked} {path}"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"corp": "not a certificate"}, "entry 'corp' is not one PEM certificate"),
        ({"corp": PEM + PEM}, "entry 'corp' is not one PEM certificate"),
        ({"corp/../x": PEM}, "bad entry: 'corp/../x'"),
        (["corp"], "a mapping of names"),
    ],
)
def test_bad_values_are_refused(value, expected):
    found = "\n".join(problems(ca.SETTINGS, {"ca_certificates_extra": value}))
    assert expected in found, found


def test_a_certificate_without_final_newline_is_valid_and_written_with_one():
    assert problems(ca.SETTINGS, {"ca_certificates_extra": {"corp": PEM.strip()}}) == []
    assert ca_deploy.pem_content(PEM.strip()) == PEM


def test_fact_reads_files_links_and_the_tool():
    found = ca_facts.SparkrigCaCertificates().process(["tool", _line(linked="no")])
    assert found == {
        "tool": True,
        "files": {
            PATH: {"sha256": hashlib.sha256(PEM.encode()).hexdigest(), "mode": 0o644, "user": "root", "linked": False}
        },
    }


def _ops(lines, extra):
    return execute(ca.ca_certificates, data={"ca_certificates_extra": extra}, responses={FACT: lines})


def test_nothing_configured_and_nothing_there_costs_nothing():
    assert _ops(["tool"], {}) == []


def test_a_converged_host_gets_no_operation():
    assert _ops(["tool", _line()], {"corp": PEM}) == []


def test_a_new_certificate_is_validated_written_and_the_store_refreshed():
    ops = _ops(["tool"], {"corp": PEM})
    assert [op.name for op in ops] == [
        "Extra CA certificates | An extra CA certificate (ca_certificates_extra)",
        "Extra CA certificates | Refresh the system CA store (update-ca-certificates)",
    ]
    assert ops[0].uploads["/usr/local/share/ca-certificates/.sparkrig-corp.crt.sparkrig-new"] == PEM.encode()
    assert any("openssl x509 -noout -in" in c for c in ops[0].commands)
    assert ops[1].commands == ["update-ca-certificates --fresh"]


def test_a_certificate_not_in_the_store_only_refreshes_it():
    (op,) = _ops(["tool", _line(linked="no")], {"corp": PEM})
    assert op.commands == ["update-ca-certificates --fresh"]


def test_a_certificate_no_longer_configured_is_removed():
    old = "/usr/local/share/ca-certificates/sparkrig-old.crt"
    (op,) = _ops(["tool", _line(), _line(path=old)], {"corp": PEM})
    assert op.commands == [f"rm -f {old}", "update-ca-certificates --fresh"]


def test_without_the_tool_ca_certificates_is_installed_first():
    ops = _ops([], {"corp": PEM})
    assert ops[0].name == "Extra CA certificates | Install ca-certificates"
