"""An action control's testinfra host answers a host-wide question once (tests/compliance/reads.py's
HostReads): asked again under ``host.sudo()`` it is another user's view, sent to the host as it
is, never the login user's cached or prefetched answer (tests/mutants.py changes it). The
backend here is testinfra's local one, with the layer installed on a subclass whose run
records what would reach the host and answers as the user it runs as."""

from __future__ import annotations

import pytest
from testinfra.backend.local import LocalBackend
from testinfra.host import Host

from tests.compliance import reads


class Recording(LocalBackend):
    """testinfra's local backend, answering ``id -un`` and path tests as the login user
    (user, /home/user/x a file) or under sudo (root, no such file), and recording every command."""

    def run(self, command, *args, **kwargs):
        sent = self.get_command(command, *args)
        self.sent.append(sent)
        root = sent != self.quote(command, *args)
        if "id -un" in sent:
            return self.result(0, self.encode(sent), b"root\n" if root else b"user\n", b"")
        return self.result(1 if root else 0, self.encode(sent), b"", b"")


reads.install(Recording)

# How the suite's host.sudo() prefixes a command (root runs it itself: no sudo on the lent GPU box).
AS_ROOT = '$(test "$(id -u)" = 0 || echo sudo -n --)'
AS_POSTGRES = '$(if test "$(id -u)" = 0; then echo runuser -u postgres --; else echo sudo -n -u postgres --; fi)'


@pytest.fixture
def host():
    backend = Recording()
    backend.sent = []
    return Host(backend)


def test_a_question_under_sudo_is_asked_again_as_it_is(host):
    assert host.run("id -un").stdout == "user\n"
    assert host.run("id -un").stdout == "user\n"  # host-wide: asked once
    assert host.backend.sent == ["id -un"]
    with host.sudo():
        assert host.run("id -un").stdout == "root\n"
    with host.sudo("postgres"):
        host.run("id -un")
    assert host.backend.sent == [
        "id -un",
        f"{AS_ROOT} /bin/sh -c 'id -un'",
        f"{AS_POSTGRES} /bin/sh -c 'id -un'",
    ]
    assert host.run("id -un").stdout == "user\n"


def test_a_prefetched_answer_is_the_login_users_alone():
    backend = Recording()
    backend.sent = []
    backend._sparkrig_reads = reads.HostReads({"id -un": (0, b"user\n", b"")})
    host = Host(backend)
    assert host.run("id -un").stdout == "user\n" and backend.sent == []
    with host.sudo():
        assert host.run("id -un").stdout == "root\n"
    assert backend.sent == [f"{AS_ROOT} /bin/sh -c 'id -un'"]


def test_a_path_under_sudo_is_asked_as_it_is(host):
    assert host.run("test -f /home/user/x").rc == 0
    with host.sudo():
        assert host.run("test -f /home/user/x").rc == 1
    assert host.backend.sent[-1] == f"{AS_ROOT} /bin/sh -c 'test -f /home/user/x'"
