"""A directory of the controller's user alone (tools/private.py), where what steers sparkrig's
next step lives (a rollout's state, SSH control sockets, the suite's results): refused when
group-writable, another user's, or a link, not only when anyone may write it."""

from __future__ import annotations

import os

import pytest

from sparkrig.tools import private

NOBODY = 65534


def test_a_directory_of_the_callers_alone_is_taken_and_a_missing_one_made(tmp_path):
    assert private.private_directory(tmp_path / "a" / "b", "x") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    assert private.private_directory(tmp_path / "open", "x") == tmp_path / "open"
    with pytest.raises(ValueError, match="with mode 0700"):
        private.private_directory(tmp_path / "open", "x", closed=True)


@pytest.mark.parametrize("mode", [0o770, 0o720, 0o702, 0o777])
def test_a_directory_others_may_write_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(ValueError, match=r"shared \(a rollout's state\) must be a directory of yours"):
        private.private_directory(shared, "a rollout's state")


def test_another_users_directory_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root (CI runs as root)")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=f"found uid {NOBODY}, mode drwx------"):
        private.private_directory(theirs, "x")


def test_a_file_of_the_callers_where_the_directory_goes_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "file").chmod(0o600)
    with pytest.raises(ValueError, match=r"found uid \d+, mode -rw-------"):
        private.private_directory(tmp_path / "file", "x")


def test_a_link_to_the_callers_own_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ValueError, match="not a link"):
        private.private_directory(tmp_path / "link", "x")
