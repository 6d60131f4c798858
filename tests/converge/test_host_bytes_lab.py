"""
A host's bytes fail that host, never the run, on real lab hosts over
real SSH: one host's login prints a Latin-1 banner (its ``.bashrc``); the compliance
suite's prefetch reads every host, that one included. Each test restores what it changed.
"""

from __future__ import annotations

import base64
import subprocess

import pytest

import lab
from tests.compliance import reads

pytestmark = pytest.mark.lab
# First in .bashrc: bash reads it for an ssh command, before Debian's "not interactive: return".
BANNER = "printf 'Gr\\374\\337 Gott\\n'  # sparkrig test: a Latin-1 banner\n"


def _ssh(host: str, command: str) -> subprocess.CompletedProcess[bytes]:
    """``command`` on a lab host, its output as bytes (lab.run_ssh decodes UTF-8 and would raise)."""
    return subprocess.run(
        ["ssh", "-F", str(lab.ssh_config_path()), host, command],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_a_latin1_banner_in_one_hosts_bashrc_stops_no_hosts_prefetch(lab_hosts):
    names = sorted(host.name for host in lab_hosts if host.name in ("lab-deb12", "lab-deb13"))
    assert len(names) == 2, names
    noisy = names[0]
    lab.run_ssh(
        noisy, "cp ~/.bashrc ~/.bashrc.sparkrig-test && cat - ~/.bashrc.sparkrig-test > ~/.bashrc", input=BANNER
    )
    try:
        assert _ssh(noisy, "true").stdout == b"Gr\xfc\xdf Gott\n"  # the banner comes, and is not UTF-8
        found = reads.prefetch(str(lab.ssh_config_path()), names, reads.EVERY_HOST)
        assert sorted(found) == names
        for name in names:
            rc, out, _err = found[name]["uname -s"]
            assert (rc, base64.b64decode(out)) == (0, b"Linux\n"), name
    finally:
        assert _ssh(noisy, "mv ~/.bashrc.sparkrig-test ~/.bashrc").returncode == 0
