"""
Prefix builds (the kind of NCCL and nccl-tests) in the lab, with the lab's STAND-IN for them
(lab/sourcebuild.py: a small C library and a program linked against it, built with make and
gcc; no GPU, no CUDA and no MPI here): the first host builds each once and the other gets the
archive uploaded, never building; both have the prefixes root-owned under
/opt/sparkrig/builds, the program runs against the library through the `needs` link; a second
run changes nothing; a new ref of the needed build rebuilds the one that needs it; and an
archive its (unprivileged) build user made hostile is refused by root, failing that host, with
nothing written outside the prefix.

It runs on the lab's first two x86_64 hosts (lab-deb12 and lab-deb13: a 2-host lab, `python
-m lab up --hosts lab-deb12:debian12,lab-deb13:debian13`, or the default fleet), with the
stand-ins turned on by a variant of the lab inventory, and puts them back as they were.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest

import lab
from lab.stack import make_locks
from tests.support import run_deploy

pytestmark = pytest.mark.lab
ROOT = "/opt/sparkrig/builds"
LIB, TESTS = "lab-prefix", "lab-prefix-tests"  # STAND-INS for nccl and nccl-tests (inventory/lab.py)
PERF = f"{ROOT}/{TESTS}/current/bin/standin_perf"
BUILDER, PEER = "lab-deb12", "lab-deb13"  # in inventory order: lab-deb12 builds
HOSTS = ("--limit", BUILDER, "--limit", PEER)


@pytest.fixture(scope="module")
def fleet(request):
    """The two hosts, up: the lab as it is when it has them, else the suite's fleet."""
    running = {h["name"] for h in lab.status() if h.get("ssh_ok")} if lab.inventory_path().exists() else set()
    if not {BUILDER, PEER} <= running:
        request.getfixturevalue("lab_hosts")
    make_locks()  # the lab's python_stack locks (as the suite's lab_locks makes them)
    return [BUILDER, PEER]


def _sh(host: str, command: str, check: bool = True) -> str:
    return lab.run_ssh(host, f"sudo sh -c {shlex.quote(command)}", check=check).stdout


def _variant(tmp_path, name: str = "variant", enabled: bool = True, extra_step: str = "", **changes) -> str:
    """The lab inventory with the stand-ins turned on (and ``changes``: {build: {key: value}};
    ``extra_step`` ends the steps of the nccl-tests stand-in)."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import copy\n"
        "from inventory.lab import lab as _lab\n"
        "lab = [(name, copy.deepcopy(data)) for name, data in _lab]\n"
        "for _name, _data in lab:\n"
        f"    if {enabled!r}:\n"
        f"        _data['source_builds_enabled'] = _data['source_builds_enabled'] + [{TESTS!r}, {LIB!r}]\n"
        f"    for _build, _change in {changes!r}.items():\n"
        "        _data['source_builds'][_build].update(_change)\n"
        f"    if {extra_step!r}:\n"
        f"        _data['source_builds'][{TESTS!r}]['steps'] = "
        f"_data['source_builds'][{TESTS!r}]['steps'] + [{extra_step!r}]\n"
    )
    return str(path)


def _refs() -> dict:
    return json.loads(lab.inventory_path().read_text())["sources"]["prefix"]["refs"]


def _launches(host: str, build: str) -> int:
    out = _sh(host, f"cat /var/lib/sparkrig/source-builds/{build}/*/work/launches 2>/dev/null; true")
    return len(out.split())


def _current(host: str, build: str) -> str:
    return _sh(host, f"readlink {ROOT}/{build}/current", check=False).strip()


@pytest.fixture(scope="module")
def turned_on(fleet, tmp_path_factory):
    """The first converge with the stand-ins on (a fresh lab converges everything else too),
    the lab's own inventory put back afterwards."""
    inventory = _variant(tmp_path_factory.mktemp("prefix"))
    first = run_deploy(inventory, *HOSTS)
    yield inventory, first
    back = run_deploy(_variant(tmp_path_factory.mktemp("off"), enabled=False), *HOSTS)
    assert back.returncode == 0, back.log[-3000:]


def test_the_first_host_builds_once_the_other_receives_and_both_install_root_owned(turned_on):
    inventory, first = turned_on
    assert first.returncode == 0, first.log[-5000:]
    for build in (LIB, TESTS):
        assert (_launches(BUILDER, build), _launches(PEER, build)) == (1, 0), build
    ops = first.changed()
    assert [op for op in ops[BUILDER] if f"Source build {TESTS}, on its builder" in op]
    assert not [op for op in ops[PEER] if "on its builder" in op], ops[PEER]
    assert [op for op in ops[PEER] if f"Source build {LIB}: the prefix from the controller's cache" in op], ops[PEER]
    for host in (BUILDER, PEER):
        key = _current(host, LIB)
        assert len(key) == 16, key
        stamp = json.loads(_sh(host, f"cat {ROOT}/{LIB}/{key}.json"))
        assert stamp["built_on"] == BUILDER and stamp["commit"] == _refs()["p1.0"]["commit"]
        # The program runs against the needed library, found through its RUNPATH.
        assert _sh(host, f"runuser -u spark -- {PERF}").strip().endswith("libstandin answers 1")
        assert _sh(host, f"grep -q {ROOT}/{LIB}/{key}/lib {PERF} && echo linked").strip() == "linked"
        # Root's, read-only to everyone else, no setuid bit; the library's link kept, inside.
        assert (
            _sh(host, f"find {ROOT} ! -user root -o ! -group root -o ! -type l \\( -perm /022 -o -perm /6000 \\)") == ""
        )
        assert _sh(host, f"readlink {ROOT}/{LIB}/{key}/lib/libstandin.so").strip() == "libstandin.so.1"
        assert _sh(host, "dpkg-query -W -f='${Status}' bc") == "install ok installed"


def test_a_second_converge_changes_nothing(turned_on):
    inventory, first = turned_on
    assert first.returncode == 0
    again = run_deploy(inventory, *HOSTS)
    assert again.returncode == 0 and again.changed() == {}, again.log[-3000:]


def test_a_new_ref_of_the_needed_build_rebuilds_the_one_that_needs_it(turned_on, tmp_path):
    inventory, first = turned_on
    assert first.returncode == 0
    before = {build: _launches(BUILDER, build) for build in (LIB, TESTS)}
    peer_before = {build: _launches(PEER, build) for build in (LIB, TESTS)}
    old = {build: _current(PEER, build) for build in (LIB, TESTS)}
    # (the environment names this run: a key no earlier run built, nor the controller cached)
    bumped = _variant(
        tmp_path,
        **{LIB: {"ref": _refs()["p2.0"]["commit"], "env": {"MAX_JOBS": "2", "SPARKRIG_LAB_RUN": str(time.time_ns())}}},
    )
    result = run_deploy(bumped, *HOSTS)
    assert result.returncode == 0, result.log[-5000:]
    # The dependent's ref did not change; its need's key did, so it was built again, once.
    assert {build: _launches(BUILDER, build) for build in (LIB, TESTS)} == {
        LIB: before[LIB] + 1,
        TESTS: before[TESTS] + 1,
    }
    assert {build: _launches(PEER, build) for build in (LIB, TESTS)} == peer_before  # it received both
    for host in (BUILDER, PEER):
        assert _sh(host, f"runuser -u spark -- {PERF}").strip().endswith("libstandin answers 2")
        assert _current(host, TESTS) != old[TESTS] and _current(host, LIB) != old[LIB]
    # Back to the first ref: its prefixes are on the hosts and in the controller's cache.
    back = run_deploy(inventory, *HOSTS)
    assert back.returncode == 0, back.log[-3000:]
    assert {build: _launches(BUILDER, build) for build in (LIB, TESTS)} == {
        LIB: before[LIB] + 1,
        TESTS: before[TESTS] + 1,
    }
    for host in (BUILDER, PEER):
        assert _current(host, TESTS) == old[TESTS]
        assert _sh(host, f"runuser -u spark -- {PERF}").strip().endswith("libstandin answers 1")
    again = run_deploy(inventory, *HOSTS)
    assert again.changed() == {}, again.log[-3000:]


# On lab-deb13 the builds run as spark (its python_venv_owner), an unprivileged user.
HOSTILE = "lab-deb13"
OUTSIDE = "/var/lib/sparkrig-attacker-was-here"


def _refused(result, host: str, said: str) -> None:
    assert result.returncode != 0
    assert f"sparkrig: source build {TESTS}: refused the archive: " in result.log, result.log[-3000:]
    assert said in result.log, result.log[-3000:]
    assert "nothing was installed" in result.log


def test_a_build_that_links_out_of_its_prefix_is_refused_by_root(turned_on, tmp_path):
    inventory, first = turned_on
    assert first.returncode == 0
    current = _current(HOSTILE, TESTS)
    installed = _sh(HOSTILE, f"ls {ROOT}/{TESTS}").split()
    hostile = _variant(tmp_path, extra_step='ln -s /etc/shadow "$SPARKRIG_PREFIX/bin/shadow"')
    result = run_deploy(hostile, "--limit", HOSTILE)
    _refused(result, HOSTILE, "symlink 'bin/shadow' -> '/etc/shadow' points to the absolute path '/etc/shadow'")
    assert _current(HOSTILE, TESTS) == current  # the host keeps the prefix it had
    assert _sh(HOSTILE, f"ls {ROOT}/{TESTS}").split() == installed  # nothing of the refused key
    back = run_deploy(inventory, "--limit", HOSTILE)
    assert back.returncode == 0 and back.changed() == {}, back.log[-3000:]


# Written by spark into their own wheelhouse entry, replacing the archive the build made and
# its stamp's sha256: an absolute member, one that climbs out, a setuid shell. The script is
# sent as written, so its one long line stays (E501 waived where the string ends).
_CRAFT = r"""
import hashlib, io, json, sys, tarfile
entry = sys.argv[1]
with tarfile.open(entry + "/prefix.tar.gz", "w:gz") as tar:
    for name, mode in (("./bin/standin_perf", 0o755), ("%s", 0o644), ("./../../../../..%s", 0o644), ("./bin/rootshell", 0o4755)):
        info = tarfile.TarInfo(name)
        info.size, info.mode = 1, mode
        tar.addfile(info, io.BytesIO(b"x"))
stamp = json.load(open(entry + "/stamp.json"))
stamp["sha256"] = hashlib.sha256(open(entry + "/prefix.tar.gz", "rb").read()).hexdigest()
json.dump(stamp, open(entry + "/stamp.json", "w"))
""" % (OUTSIDE, OUTSIDE)  # noqa: E501


def test_an_archive_its_build_user_crafted_is_refused_and_nothing_lands_outside(turned_on, tmp_path):
    inventory, first = turned_on
    assert first.returncode == 0
    current = _current(HOSTILE, TESTS)
    built = _sh(HOSTILE, f"ls /var/lib/sparkrig/wheelhouse/{TESTS}").split()
    # A new key, built detached: the deploy returns while it builds, before root installs it.
    # (a key no earlier run built: the environment names this run)
    variant = _variant(tmp_path, **{TESTS: {"env": {"MAX_JOBS": "1", "SPARKRIG_LAB_RUN": str(time.time_ns())}}})
    started = run_deploy(variant, "--limit", HOSTILE, "--data", "source_builds_wait=False")
    assert started.returncode == 0, started.log[-3000:]
    deadline = time.monotonic() + 300
    while _sh(HOSTILE, "systemctl list-units --state=active --no-legend --plain 'sparkrig-build-*'").strip():
        assert time.monotonic() < deadline, "the build never ended"
        time.sleep(2)
    entries = _sh(HOSTILE, f"ls /var/lib/sparkrig/wheelhouse/{TESTS}").split()
    new = [e for e in entries if e not in built]
    assert len(new) == 1, entries
    entry = f"/var/lib/sparkrig/wheelhouse/{TESTS}/{new[0]}"
    _sh(HOSTILE, f"runuser -u spark -- python3 -c {shlex.quote(_CRAFT)} {entry}")
    result = run_deploy(variant, "--limit", HOSTILE)
    _refused(result, HOSTILE, f"member '{OUTSIDE}' is an absolute path")
    assert _sh(HOSTILE, f"ls -d {OUTSIDE} {ROOT}/{new[0]} {ROOT}/{TESTS}/{new[0]} 2>/dev/null; true") == ""
    assert _sh(HOSTILE, "find /opt /var/lib -name rootshell 2>/dev/null; true") == ""
    assert _current(HOSTILE, TESTS) == current
    back = run_deploy(inventory, "--limit", HOSTILE)
    assert back.returncode == 0 and back.changed() == {}, back.log[-3000:]
