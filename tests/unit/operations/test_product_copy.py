"""Root copies a build's product out of its owner's wheelhouse entry (install_prefix: the
prefix's archive; fetch: the product the controller keeps). Each operation's real first
command, run here by dash as root against a tree moved below /tmp, while the owner (nobody)
puts a FIFO, a sparse 1 TiB file or a link to /dev/zero where the product goes: the copy
neither hangs nor fills the disk, and fails with one line naming the file."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from sparkrig import prefix as px
from sparkrig.operations.source_builds import cache as sb_cache
from sparkrig.operations.source_builds import catalogue as sb_catalogue
from sparkrig.operations.source_builds import prefixes as sb_prefixes
from tests.unit import pyinfra_fake

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runuser"),
    reason="needs root and runuser (root copies as the owner, here nobody)",
)

KEY = "0123456789abcdef"
FACT = 'echo "unit $n'  # SourceBuilds' command holds this
# On the code before the bound, root's copy of a sparse file or /dev/zero ran until the
# disk was full: here it stops at 256 MiB (RLIMIT_FSIZE), so that code fails the test, not
# this machine.
FSIZE = 256 << 20


@pytest.fixture
def tree(monkeypatch):
    """Root's directories and the wheelhouse below a fresh /tmp directory others may enter;
    the build's wheelhouse entry is nobody's."""
    root = Path(tempfile.mkdtemp(prefix="sparkrig-copy-", dir="/tmp"))
    root.chmod(0o755)
    monkeypatch.setattr(sb_catalogue, "WHEELHOUSE", str(root / "wheelhouse"))
    monkeypatch.setattr(sb_cache, "OUTGOING", str(root / "outgoing"))
    monkeypatch.setattr(sb_prefixes, "INCOMING", str(root / "incoming"))
    monkeypatch.setattr(sb_prefixes, "PREFIX_ROOT", str(root / "opt" / "builds"))
    monkeypatch.setattr(px, "PREFIX_ROOT", str(root / "opt" / "builds"))
    entry = Path(sb_catalogue.wheelhouse_dir("lib", KEY))
    entry.mkdir(parents=True)
    shutil.chown(entry, "nobody")
    yield root, entry
    shutil.rmtree(root)


def _first_command(operation, cache: Path) -> tuple[str, str]:
    """The operation's first command as planned for a host whose build is built, and the
    root-owned file it copies into."""
    stamp = {"kind": "prefix", "name": "lib", "key": KEY, "archive": px.ARCHIVE, "sha256": "d" * 64}
    lines = ["unit lib inactive", f"stamp lib {json.dumps(stamp)}", f"wheel lib {pyinfra_fake.user_field(px.ARCHIVE)}"]
    ops = pyinfra_fake.plan(
        lambda: operation(name="copy", build_name="lib", key=KEY, cache=str(cache), owner="nobody"), {}, {FACT: lines}
    )
    if operation is sb_prefixes.install_prefix:
        dest = f"{sb_prefixes.INCOMING}/lib-{KEY}.{px.ARCHIVE}"
    else:
        dest = f"{sb_cache.OUTGOING}/lib-{KEY}.{px.ARCHIVE}"
    return ops[0].commands[0], dest


def _plant(entry: Path, script: str) -> None:
    subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", script, "plant", str(entry / px.ARCHIVE)], check=True)


def _run(command: str) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))

    return subprocess.run(["dash", "-c", command], capture_output=True, text=True, timeout=30, preexec_fn=limit)


OPERATIONS = [sb_prefixes.install_prefix, sb_cache.fetch]


@pytest.mark.parametrize("operation", OPERATIONS, ids=["install_prefix", "fetch"])
def test_a_regular_product_is_copied_whole(operation, tree, tmp_path):
    root, entry = tree
    _plant(entry, 'printf "archive\\0bytes" > "$1"')
    command, dest = _first_command(operation, tmp_path)
    run = _run(command)
    assert run.returncode == 0, run.stderr
    assert Path(dest).read_bytes() == b"archive\0bytes"


@pytest.mark.parametrize("operation", OPERATIONS, ids=["install_prefix", "fetch"])
@pytest.mark.parametrize(
    "planted",
    [
        'mkfifo "$1"',  # no writer ever comes: an open would block for ever
        'truncate -s 1T "$1"',  # sparse: no space taken, 1 TiB to copy
        'ln -s /dev/zero "$1"',  # endless
    ],
    ids=["fifo", "sparse-1TiB", "link-to-dev-zero"],
)
def test_a_product_that_would_hang_or_fill_the_disk_fails_the_host_and_copies_nothing(
    operation, planted, tree, tmp_path
):
    root, entry = tree
    _plant(entry, planted)
    command, dest = _first_command(operation, tmp_path)
    run = _run(command)
    assert run.returncode == 1, run
    assert f"sparkrig: source build lib: {entry / px.ARCHIVE} not copied" in run.stderr, run.stderr
    assert not Path(dest).exists()
