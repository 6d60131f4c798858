"""Prefix builds (``kind: prefix``, such as NCCL): the catalogue's checks, the stamp of
a build that needs another, the build script, the fact, the plan, and root's unpacker run on
archives a hostile build user could make."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from pyinfra.api.exceptions import FactProcessError, PyinfraError

from sparkrig import prefix as px
from sparkrig import reading, user_files
from sparkrig.operations.source_builds import catalogue as sb_catalogue
from sparkrig.operations.source_builds import deploy as sb_deploy
from sparkrig.operations.source_builds import facts as sb_facts
from sparkrig.operations.source_builds import operations as sb_ops
from sparkrig.operations.source_builds import settings as sb_settings
from sparkrig.packages import install_command
from sparkrig.settings import SettingsError, all_settings, problems, resolve, validate_hosts
from tests.unit.pyinfra_fake import execute, user_field

SETTINGS = all_settings()
# Two prefix builds of the tests' own (the shipped catalogue holds none): a library, and
# programs compiled against it that need an MPI launcher where they run.
_PREFIX = {
    "kind": "prefix",
    "url": "https://example.org/libcoll.git",
    "ref": "v1.0",
    "env": {"MAX_JOBS": "4"},
    "build_packages": ["git", "build-essential"],
    "submodules": False,
    "subdirectory": ".",
    "memory_max": "8G",
}
PREFIXES = {
    "libcoll": {
        **_PREFIX,
        "steps": ['make -j"$MAX_JOBS"', 'make install PREFIX="$SPARKRIG_PREFIX"'],
        "needs": [],
        "runtime_packages": [],
    },
    "libcoll-tests": {
        **_PREFIX,
        "url": "https://example.org/libcoll-tests.git",
        "steps": [
            'make LIBCOLL_HOME="$SPARKRIG_NEED_LIBCOLL"',
            'mkdir -p "$SPARKRIG_PREFIX/bin" && cp build/*_perf "$SPARKRIG_PREFIX/bin/"',
        ],
        "needs": ["libcoll"],
        "runtime_packages": ["openmpi-bin"],
    },
}
CATALOGUE = {**sb_settings.load_catalogue(), **PREFIXES}
FACT = 'echo "unit $n'  # SourceBuilds' command holds this
PACKAGES = "dpkg-query -W"  # HostState's, for the runtime packages
BOTH = ["libcoll", "libcoll-tests"]


def _data(**data) -> dict:
    return resolve(
        SETTINGS, {"source_builds": CATALOGUE, "source_builds_enabled": BOTH, "hardware_profile": "gb10", **data}
    )


def _catalogue(name: str, **changes) -> dict:
    catalogue = copy.deepcopy(CATALOGUE)
    catalogue[name] = {**catalogue[name], **changes}
    return catalogue


def _problems(**data) -> list[str]:
    return [p for p in problems(SETTINGS, data) if not p.startswith("python_stack_locks")]


# The catalogue -----------------------------------------------------------------------------


def test_the_shipped_catalogue_holds_no_prefix_build_and_the_tests_pair_is_valid():
    assert all(spec["kind"] == "wheel" for spec in sb_settings.load_catalogue().values())
    assert _problems(source_builds=CATALOGUE, source_builds_enabled=BOTH) == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"source_builds": _catalogue("libcoll", kind="deb")}, "libcoll.kind must be one of: prefix, wheel"),
        (
            {"source_builds": _catalogue("libcoll", abi3=True)},
            "libcoll (kind prefix) must hold exactly: build_packages, env,"
            " kind, memory_max, needs, ref, runtime_packages, steps,",
        ),
        (
            {"source_builds": _catalogue("libcoll", steps=[])},
            "libcoll.steps must install the build into $SPARKRIG_PREFIX",
        ),
        (
            {"source_builds": _catalogue("libcoll-tests", needs=["libcoll", "libcoll"])},
            "libcoll-tests.needs must be a list",
        ),
        ({"source_builds": _catalogue("libcoll-tests", needs=["libcoll-tests"])}, "libcoll-tests.needs must be a list"),
        (
            {"source_builds": _catalogue("libcoll-tests", needs=["triton"])},
            "libcoll-tests.needs names triton, which is no prefix build of the catalogue",
        ),
        (
            {"source_builds": _catalogue("libcoll-tests", needs=["libfoo"])},
            "libcoll-tests.needs names libfoo, which is no prefix build of the catalogue",
        ),
        (
            {"source_builds": _catalogue("libcoll", needs=["libcoll-tests"])},
            "libcoll needs libcoll-tests needs libcoll: builds cannot need each other in a loop",
        ),
        (
            {"source_builds": _catalogue("libcoll-tests", runtime_packages=["Open MPI"])},
            "libcoll-tests.runtime_packages must be a list of apt package names",
        ),
        (
            {"source_builds": CATALOGUE, "source_builds_enabled": ["libcoll-tests"]},
            "with every build each one needs (libcoll-tests needs libcoll: enable it too)",
        ),
    ],
)
def test_bad_prefix_entries_are_refused_with_what_is_allowed(data, expected):
    found = _problems(**data)
    assert len(found) == 1 and expected in found[0], found


def test_one_error_names_the_host_the_key_and_what_is_allowed():
    with pytest.raises(SettingsError) as error:
        validate_hosts([("spark-02", {"source_builds": CATALOGUE, "source_builds_enabled": ["libcoll-tests"]})])
    assert (
        "host 'spark-02': source_builds_enabled = ['libcoll-tests']: allowed is a list of builds of "
        "source_builds: libcoll, libcoll-tests, triton, vllm, xformers, with every build each one needs"
    ) in str(error.value)


# Stamps, order and the script --------------------------------------------------------------


def test_a_need_is_built_first_and_its_key_enters_the_dependents_stamp():
    data = _data(source_builds_enabled=["libcoll-tests", "libcoll"])
    assert list(sb_catalogue.wanted(data)) == BOTH  # each after what it needs, whatever the order enabled
    keys = sb_catalogue.wanted(data)
    assert sb_catalogue.stamp_inputs("libcoll-tests", data)["needs"] == {"libcoll": keys["libcoll"]}
    bumped = sb_catalogue.wanted(_data(source_builds=_catalogue("libcoll", ref="v2.0")))
    assert bumped["libcoll"] != keys["libcoll"] and bumped["libcoll-tests"] != keys["libcoll-tests"]
    # No Python, torch or package in a prefix's stamp: a new venv does not rebuild the library.
    inputs = sb_catalogue.stamp_inputs("libcoll", data)
    assert "python" not in inputs and "torch" not in inputs and "package" not in inputs
    assert sb_catalogue.wanted(_data(python_stack={**data["python_stack"], "python": "3.13"})) == keys


def test_the_prefix_script_installs_into_its_prefix_and_packs_it(tmp_path):
    data = _data()
    keys = sb_catalogue.wanted(data)
    script = sb_ops.render_build_script("libcoll-tests", keys["libcoll-tests"], data)
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    need = px.installed_dir("libcoll", keys["libcoll"])
    assert f"export SPARKRIG_NEED_LIBCOLL={need}\n" in script
    assert f"[ -f {px.installed_stamp('libcoll', keys['libcoll'])} ] ||" in script
    assert f"SPARKRIG_INSTALL_PREFIX={px.installed_dir('libcoll-tests', keys['libcoll-tests'])}" in script
    assert 'tar -C "$SPARKRIG_PREFIX" --sort=name --owner=0 --group=0 --numeric-owner -czf' in script
    assert "pip wheel" not in script and "venv" not in script


def test_the_prefix_script_builds_a_real_prefix_and_a_valid_stamp(tmp_path):
    """The rendered script, run by sh on a local repository (a STAND-IN for a C library: one shell
    step that installs a file), makes the archive and a stamp the controller accepts."""
    if not shutil.which("git"):
        pytest.skip("git is not installed on this machine")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("stand-in\n")
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"], ["tag", "v1"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    spec = {
        **CATALOGUE["libcoll"],
        "url": str(repo),
        "ref": "v1",
        "steps": [
            'mkdir -p "$SPARKRIG_PREFIX/lib" && cp README "$SPARKRIG_PREFIX/lib/" '
            '&& ln -s README "$SPARKRIG_PREFIX/lib/link"'
        ],
    }
    data = _data(source_builds={**CATALOGUE, "libcoll": spec}, source_builds_enabled=["libcoll"])
    key = sb_catalogue.wanted(data)["libcoll"]
    script = sb_ops.render_build_script("libcoll", key, data)
    work, wheelhouse = tmp_path / "work", tmp_path / "wh" / key
    script = script.replace(sb_catalogue.work_dir("libcoll", key), str(work)).replace(
        sb_catalogue.wheelhouse_dir("libcoll", key), str(wheelhouse)
    )
    work.mkdir()
    (tmp_path / "wh").mkdir()
    run = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    stamp = json.loads((wheelhouse / "stamp.json").read_text())
    assert sb_catalogue.stamp_problem(stamp) is None and stamp["key"] == key and stamp["kind"] == "prefix"
    assert stamp["sha256"] == hashlib.sha256((wheelhouse / px.ARCHIVE).read_bytes()).hexdigest()
    with tarfile.open(wheelhouse / px.ARCHIVE) as tar:
        assert sorted(m.name for m in tar.getmembers()) == [".", "./lib", "./lib/README", "./lib/link"]
        assert {m.uid for m in tar.getmembers()} == {0}


# The fact and the plan ---------------------------------------------------------------------


def _stamp(name: str, key: str) -> dict:
    return {"kind": "prefix", "name": name, "key": key, "archive": px.ARCHIVE, "sha256": "d" * 64}


def _fact(states: dict[str, str], data: dict) -> list[str]:
    """SourceBuilds' lines: per build 'built', 'installed' (built and installed), 'running' or 'absent'."""
    keys, lines = sb_catalogue.wanted(data), []
    for name, state in states.items():
        key = keys[name]
        lines.append(f"unit {name} {'active' if state == 'running' else 'inactive'}")
        if state in ("built", "installed"):
            lines += [f"stamp {name} {json.dumps(_stamp(name, key))}", f"wheel {name} {user_field(px.ARCHIVE)}"]
        if state == "installed":
            lines += [f"installed {name} {key}", f"link {name} {key}"]
    return lines


def _ops(states: dict[str, str], packages: str = "ii ", **data):
    data = {"source_builds": CATALOGUE, "source_builds_enabled": BOTH, "hardware_profile": "gb10", **data}
    responses = {FACT: _fact(states, resolve(SETTINGS, data)), PACKAGES: [f"package {packages} 4.1.6 openmpi-bin"]}
    return execute(sb_deploy.source_builds, data=data, responses=responses)


def test_fact_reads_the_installed_key_and_the_link():
    data = _data()
    found = sb_facts.SourceBuilds().parse(_fact({"libcoll": "installed", "libcoll-tests": "built"}, data))
    key = sb_catalogue.wanted(data)["libcoll"]
    assert found["libcoll"]["installed"] == key and found["libcoll"]["link"] == key
    assert "installed" not in found["libcoll-tests"] and found["libcoll-tests"]["state"] == "built"
    command = sb_facts.SourceBuilds().command(
        (("libcoll", key, ""),), "/opt/sparkrig/venv", installs=(("libcoll", key),)
    )
    raw = command.get_raw_value()
    assert f"[ -d {px.installed_dir('libcoll', key)} ] && [ -f {px.installed_stamp('libcoll', key)} ]" in raw
    assert "readlink /opt/sparkrig/builds/libcoll/current" in raw and '"$w"/prefix.tar.gz' in raw


def test_a_stamp_whose_archive_is_another_name_fails_that_host():
    bad = {**_stamp("libcoll", "k"), "archive": "../../etc/shadow"}
    with pytest.raises(ValueError, match="is not prefix.tar.gz"):
        sb_facts.SourceBuilds().parse([f"stamp libcoll {json.dumps(bad)}"])


def test_a_converged_host_gets_no_operation_and_plans_one_reading():
    assert _ops({"libcoll": "installed", "libcoll-tests": "installed"}) == []
    parts = reading.planned(_data())
    assert any(part.fact is sb_facts.SourceBuilds for part in parts)
    assert any(dict(part.kwargs).get("packages") == ("openmpi-bin",) for part in parts)


def test_a_fresh_host_builds_fetches_installs_each_in_order_and_the_venv_is_untouched():
    ops = _ops({"libcoll": "absent", "libcoll-tests": "absent"}, python_venv_owner="spark")
    names = [op.name.removeprefix("Source builds | ") for op in ops]
    assert names == [
        "Source build libcoll, on its builder",
        "Source build libcoll: the prefix from its builder into the controller's cache",
        "Source build libcoll: the prefix from the controller's cache",
        "Source build libcoll: root checks its archive and installs it into "
        f"{px.installed_dir('libcoll', sb_catalogue.wanted(_data())['libcoll'])}",
        "Source build libcoll-tests, on its builder",
        "Source build libcoll-tests: the prefix from its builder into the controller's cache",
        "Source build libcoll-tests: the prefix from the controller's cache",
        f"Source build libcoll-tests: root checks its archive and installs it into "
        f"{px.installed_dir('libcoll-tests', sb_catalogue.wanted(_data())['libcoll-tests'])}",
    ]
    assert not any("venv" in op.name for op in ops)
    assert ops[0].commands[0] == install_command(["git", "build-essential"], 300).get_raw_value()


def test_installing_copies_checks_and_unpacks_as_root_then_links():
    data = _data()
    key = sb_catalogue.wanted(data)["libcoll"]
    ops = _ops({"libcoll": "built", "libcoll-tests": "installed"}, python_venv_owner="spark")
    (install,) = [op for op in ops if "root checks its archive" in op.name]
    command = "\n".join(install.commands)
    incoming = f"/var/lib/sparkrig/incoming/libcoll-{key}.prefix.tar.gz"
    assert f"install -m 600 -o root -g root /dev/null {incoming}" in command
    assert (
        user_files.copy_out(
            f"/var/lib/sparkrig/wheelhouse/libcoll/{key}/prefix.tar.gz",
            incoming,
            32 << 30,
            "spark",
            1800,
            "source build libcoll",
        )
        in command
    )
    assert "python3 -I -c" in command and f"{incoming} {'d' * 64} {px.installed_dir('libcoll', key)}.new" in command
    assert f"ln -sfn {key} /opt/sparkrig/builds/libcoll/current.new && mv -T" in command
    record = json.loads(install.uploads[f"/opt/sparkrig/builds/libcoll/.{key}.json.new"])
    assert record["sha256"] == "d" * 64 and record["key"] == key


def test_missing_runtime_packages_are_installed_and_present_ones_cost_nothing():
    ops = _ops({"libcoll": "installed", "libcoll-tests": "installed"}, packages="un ")
    (op,) = ops
    assert op.name.endswith("Packages the prefix builds need at run time (openmpi-bin)")
    assert op.commands == [install_command(["openmpi-bin"], 300).get_raw_value()]


def test_a_dependent_waits_while_its_need_builds_detached():
    ops = _ops({"libcoll": "absent", "libcoll-tests": "absent"}, source_builds_wait=False)
    names = [op.name for op in ops]
    assert any(name.endswith("Source build libcoll, on its builder") for name in names)
    assert not any("libcoll-tests" in name for name in names)
    build = "\n".join(ops[0].commands)
    assert "systemd-run" in build and "while case" not in build


def test_prefix_builds_add_no_line_to_the_venvs_requirements():
    data = _data()
    found = sb_facts.SourceBuilds().parse(_fact({"libcoll": "installed", "libcoll-tests": "installed"}, data))
    assert sb_facts.requirement_lines(data, found) == {}


# Root's unpacker, on archives a hostile build user makes -----------------------------------


def _archive(tmp_path, members) -> tuple[str, str]:
    """A tar.gz of ``members``: (name, type, extra) with type file|dir|sym|hard|fifo."""
    path = tmp_path / "prefix.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, extra in members:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = b"x"
                info.size, info.mode = 1, extra or 0o644
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, extra
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, extra
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def _unpack(tmp_path, members, sha=None):
    archive, digest = _archive(tmp_path, members)
    dest = tmp_path / "opt" / "key.new"
    dest.parent.mkdir(exist_ok=True)
    run = subprocess.run(
        [sys.executable, "-I", str(px.UNPACKER), archive, sha or digest, str(dest), "source build x"],
        capture_output=True,
        text=True,
    )
    return run, dest


def test_a_plain_prefix_is_unpacked_with_normalised_modes(tmp_path):
    run, dest = _unpack(
        tmp_path,
        [
            (".", "dir", None),
            ("./bin", "dir", None),
            ("./bin/all_reduce_perf", "file", 0o775),
            ("./lib", "dir", None),
            ("./lib/libcoll.so.1.0.0", "file", 0o664),
            ("./lib/libcoll.so.2", "sym", "libcoll.so.1.0.0"),
            ("./lib/libcoll.so", "sym", "libcoll.so.2"),
            ("./include/libcoll.h", "file", None),
            ("./lib/pkgconfig/up", "sym", "../../include/libcoll.h"),
        ],
    )
    assert run.returncode == 0, run.stderr
    assert "unpacked 3 files, 2 directories, 3 symlinks" in run.stdout
    assert os.stat(dest / "bin" / "all_reduce_perf").st_mode & 0o7777 == 0o755
    assert os.stat(dest / "lib" / "libcoll.so.1.0.0").st_mode & 0o7777 == 0o644
    assert os.readlink(dest / "lib" / "libcoll.so") == "libcoll.so.2"


OUTSIDE = "sparkrig-unit-outside"


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ([("./lib/evil", "sym", "/etc/shadow")], "points to the absolute path '/etc/shadow'"),
        ([("./lib", "dir", None), ("./lib/evil", "sym", "../../" + OUTSIDE)], "symlink 'lib/evil' -> '../../"),
        ([("./a", "sym", "."), ("./b", "sym", "a/..")], "leaves the prefix"),  # a chain that climbs
        ([("./loop", "sym", "loop")], "loops"),
        ([("/" + OUTSIDE, "file", None)], "is an absolute path"),
        ([("./../" + OUTSIDE, "file", None)], "climbs out with '..'"),
        ([("./lib/../../" + OUTSIDE, "file", None)], "climbs out with '..'"),
        ([("./bin/su", "file", 0o4755)], "has a setuid or setgid bit"),
        ([("./bin/sg", "file", 0o2755)], "has a setuid or setgid bit"),
        ([("./dev", "fifo", None)], "is not a regular file, directory or symlink"),
        ([("./lib/x", "file", None), ("./lib/hard", "hard", "/etc/shadow")], "is a hard link"),
        ([("./lib", "sym", "."), ("./lib/x", "file", None)], "lies below the symlink 'lib'"),
        ([("./lib/x", "file", None), ("./lib", "sym", "..")], "lies below the symlink 'lib'"),
        ([("./x", "file", None), ("./x", "file", None)], "appears twice"),
    ],
)
def test_a_hostile_member_refuses_the_whole_archive_and_nothing_is_written(tmp_path, members, said):
    run, dest = _unpack(tmp_path, [(".", "dir", None), ("./ok", "file", None), *members])
    assert run.returncode == 1
    assert "sparkrig: source build x: refused the archive:" in run.stderr and said in run.stderr, run.stderr
    assert "nothing was installed" in run.stderr
    assert not dest.exists() and not (tmp_path / OUTSIDE).exists() and not (tmp_path / "opt" / OUTSIDE).exists()


def test_an_archive_whose_sha256_differs_is_refused(tmp_path):
    run, dest = _unpack(tmp_path, [("./ok", "file", None)], sha="0" * 64)
    assert run.returncode == 1 and "its sha256 is" in run.stderr and not dest.exists()


def test_an_existing_destination_is_never_written_through(tmp_path):
    """Root unpacks into a directory it makes: a link planted where it goes fails the unpack."""
    (tmp_path / "opt").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "opt" / "key.new").symlink_to(tmp_path / "elsewhere")
    run, _ = _unpack(tmp_path, [("./ok", "file", None)])
    assert run.returncode == 1 and "unpacking it failed" in run.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []


def _members(count: int, size: int = 1, links: int = 0) -> list[tarfile.TarInfo]:
    found = []
    for i in range(count):
        info = tarfile.TarInfo(f"d{i % 100}/f{i}")
        info.size = size
        found.append(info)
    for i in range(links):
        info = tarfile.TarInfo(f"l{i}")
        info.type, info.linkname = tarfile.SYMTYPE, f"d{i % 100}/f{i}"
        found.append(info)
    return found


def test_an_archive_over_the_member_or_byte_limit_is_refused_before_anything_is_written():
    """A few hundred compressed bytes can declare gigabytes of zeros: the declared sizes and
    the member count are checked against the unpacker's limits first."""
    unpacker = _unpacker()
    with pytest.raises(unpacker.Refused, match="more than 10 members"):
        unpacker.check(_members(11), max_members=10)
    with pytest.raises(unpacker.Refused, match="more than 1000 bytes"):
        unpacker.check(_members(3, size=400), max_bytes=1000)
    with pytest.raises(unpacker.Refused, match="bytes"):
        unpacker.check(_members(1, size=unpacker.MAX_BYTES + 1))
    assert len(unpacker.check(_members(10), max_members=10)) == 10


def test_the_link_check_is_linear_in_the_members():
    """40,000 members, half of them links (16,000 took the quadratic check 17 s, so this
    would take minutes): the check alone, in a process of its own, ends within the bound."""
    script = (
        "import importlib.util, tarfile, sys\n"
        "spec = importlib.util.spec_from_file_location('u', sys.argv[1]); u = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(u)\n"
        "members = []\n"
        "for i in range(20000):\n"
        "    f = tarfile.TarInfo(f'd{i % 100}/f{i}'); f.size = 1; members.append(f)\n"
        "    l = tarfile.TarInfo(f'l{i}'); l.type, l.linkname = tarfile.SYMTYPE, f'd{i % 100}/f{i}'; "
        "members.append(l)\n"
        "print(len(u.check(members)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-c", script, str(px.UNPACKER)], capture_output=True, text=True, timeout=30
    )
    assert run.stdout.strip() == "40000", run.stderr


def _unpacker():
    spec = importlib.util.spec_from_file_location("unpack_prefix_under_test", px.UNPACKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Forged lines: the owner names the wheelhouse's files and writes the build's result --------

ONE = {"source_builds": CATALOGUE, "source_builds_enabled": ["libcoll"], "hardware_profile": "gb10"}


def _real_reading(tmp_path, monkeypatch, plant) -> tuple[list[str], str]:
    """SourceBuilds' real command (run by dash) for a host where libcoll is built, not
    installed, and its owner did ``plant(work, entry)``: what the host sends, and the key."""
    monkeypatch.setattr(sb_catalogue, "BUILD_ROOT", str(tmp_path / "builds"))
    monkeypatch.setattr(sb_catalogue, "WHEELHOUSE", str(tmp_path / "wheelhouse"))
    monkeypatch.setattr(px, "PREFIX_ROOT", str(tmp_path / "opt"))
    key = sb_catalogue.wanted(resolve(SETTINGS, ONE))["libcoll"]
    work, entry = sb_catalogue.work_dir("libcoll", key), sb_catalogue.wheelhouse_dir("libcoll", key)
    os.makedirs(work)
    os.makedirs(entry)
    with open(f"{entry}/stamp.json", "w") as stamp:
        json.dump(_stamp("libcoll", key), stamp)
    open(f"{entry}/{px.ARCHIVE}", "wb").close()
    plant(work, entry, key)
    command = sb_facts.SourceBuilds().command((("libcoll", key, ""),), "", installs=(("libcoll", key),))
    run = subprocess.run(["dash", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines(), key


def _wheel_name(work, entry, key):
    open(f"{entry}/x.whl\ninstalled libcoll {key}\ny.whl", "wb").close()


def _result(work, entry, key):
    with open(f"{work}/result", "w") as result:
        result.write(f"0\ninstalled libcoll {key}\n")


@pytest.mark.parametrize("plant", [_wheel_name, _result], ids=["wheel-file-name", "result"])
def test_a_forged_installed_line_never_passes_a_prefix_build_for_installed(tmp_path, monkeypatch, plant):
    """A file in the wheelhouse entry named `x.whl<newline>installed libcoll KEY<newline>y.whl`
    (or a result file of two lines): before, the reading carried `installed libcoll KEY` as a
    line of its own and the prefix was never installed. Now that field is refused, naming
    the place: the host stops there, with the reason."""
    sent, key = _real_reading(tmp_path, monkeypatch, plant)
    try:
        ops = execute(sb_deploy.source_builds, data=ONE, responses={FACT: {"as_sent": sent}, PACKAGES: []})
    except PyinfraError as error:
        assert "No hosts remaining" in str(error)
    else:
        assert any("root checks its archive" in op.name for op in ops), [op.name for op in ops]
    with pytest.raises(FactProcessError, match="holds a newline"):
        sb_facts.SourceBuilds().process(sent)
