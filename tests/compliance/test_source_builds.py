"""
Source build controls: each enabled build is installed in the venv from its wheel in the
wheelhouse, stamped with the configured ref and build environment; the wheelhouse cannot be
changed by others; a build turned off is gone from the venv.

The expected values are worked out here from the settings, independently of the code that
builds (operations/source_builds/): nothing of it is imported. On a host with no build
enabled (the default) the controls skip, saying so.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex

import pytest

from sparkrig.user_files import user_read

from .reads import need
from .venv import distributions

WHEELHOUSE = "/var/lib/sparkrig/wheelhouse"
PREFIXES = "/opt/sparkrig/builds"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture
def enabled(settings) -> dict[str, dict]:
    """The enabled wheel builds (prefix builds are not in the venv: see ``prefixes``)."""
    names = settings["source_builds_enabled"]
    if not names:
        pytest.skip("no source build is enabled on this host (source_builds_enabled is empty)")
    wheels = {
        name: settings["source_builds"][name] for name in names if settings["source_builds"][name]["kind"] == "wheel"
    }
    if not wheels:
        pytest.skip(f"no wheel build is enabled on this host (only prefix builds: {', '.join(names)})")
    return wheels


@pytest.fixture
def prefixes(settings) -> dict[str, dict]:
    names = [n for n in settings["source_builds_enabled"] if settings["source_builds"][n]["kind"] == "prefix"]
    if not names:
        pytest.skip("no prefix build (kind: prefix, such as nccl) is enabled on this host")
    return {name: settings["source_builds"][name] for name in names}


STAMP_LIMIT = 1024 * 1024
WHEEL_LIMIT = 8 * 1024 * 1024 * 1024  # a wheel's bytes hashed at most (an XL CUDA wheel is a few GB)
_WHEEL_URL = r"^file://{wheelhouse}/{name}/([0-9a-f]+)/([^/]+\.whl)$"


def _wheelhouse_installs(r) -> dict[str, dict]:
    """Every distribution of the venv installed from a wheel file, by normalised name:
    its version and the URL and hash uv recorded (direct_url.json), read as files."""
    found = distributions(r, r.settings["python_venv_path"])
    return {_normal(name): d for name, d in found.items() if d["direct"]}


def _build_directory(installs: dict, name: str, spec: dict) -> re.Match | None:
    found = installs.get(_normal(spec["package"]))
    url = found and found["direct"].get("url") or ""
    return re.match(_WHEEL_URL.format(wheelhouse=re.escape(WHEELHOUSE), name=re.escape(name)), url)


@need
def builds(r) -> dict:
    """The wheel installs, each enabled wheel build's wheelhouse listing, and, for each build
    installed from the wheelhouse, its stamp and the sha256 of every wheel beside it."""
    settings = r.settings
    names = [n for n in settings["source_builds_enabled"] if settings["source_builds"][n]["kind"] == "wheel"]
    listings = {name: r.run(f"find {shlex.quote(f'{WHEELHOUSE}/{name}')} -printf '%u %m %p\\n'") for name in names}
    installs = _wheelhouse_installs(r)
    stamps = {}
    for name in names:
        match = _build_directory(installs, name, settings["source_builds"][name])
        if match:
            directory = f"{WHEELHOUSE}/{name}/{match[1]}"
            stamps[directory] = {
                "stamp": r.user_file(shlex.quote(f"{directory}/stamp.json"), STAMP_LIMIT),
                "wheels": r.run(
                    f'for w in {shlex.quote(directory)}/*.whl; do test -f "$w" || continue; '
                    f'printf "%s " "${{w##*/}}"; {user_read(chr(34) + "$w" + chr(34), WHEEL_LIMIT)}'
                    ' | sha256sum | cut -d " " -f 1; done',
                    sudo=True,
                ),
            }
    return {"installs": installs, "listings": listings, "stamps": stamps}


def _stamp(found: dict, directory: str) -> dict:
    return json.loads(found["stamps"][directory]["stamp"].check())


def _wheel_sha256(found: dict, directory: str, wheel: str) -> str | None:
    shas = dict(line.split(" ", 1) for line in found["stamps"][directory]["wheels"].check().splitlines() if " " in line)
    return shas.get(wheel)


def test_every_enabled_build_is_installed_from_its_stamped_wheel(read, enabled):
    """Protects against a venv that runs another build than configured: a wheel of an
    earlier ref or another build environment left in place after a bump, a build that
    never finished, or a package reinstalled by hand over the build."""
    read_builds = read(builds)
    installs = read_builds["installs"]
    for name, spec in enabled.items():
        found = installs.get(_normal(spec["package"]))
        assert found, f"{name}: {spec['package']} is not installed from a wheel file"
        url = found["direct"]["url"]
        match = _build_directory(installs, name, spec)
        assert match, f"{name}: installed from {url}, not from the wheelhouse"
        directory = f"{WHEELHOUSE}/{name}/{match[1]}"
        stamp = _stamp(read_builds, directory)
        assert stamp["ref"] == spec["ref"], f"{name}: built from {stamp['ref']}, configured {spec['ref']}"
        if COMMIT.match(spec["ref"]):
            assert stamp["commit"] == spec["ref"]
        # The stamp holds each value's sha256 (it is world-readable and travels to peers).
        wanted_env = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in spec["env"].items()}
        assert stamp["env"] == wanted_env, f"{name}: built with {stamp['env']}, configured {spec['env']}"
        assert stamp["steps"] == spec["steps"] and stamp["package"] == spec["package"]
        assert stamp["wheel"] == match[2] and found["version"] == stamp["version"], (found, stamp)
        assert _wheel_sha256(read_builds, directory, stamp["wheel"]) == stamp["sha256"]
        recorded = (found["direct"].get("archive_info") or {}).get("hashes", {}).get("sha256")
        assert recorded in (None, stamp["sha256"]), f"{name}: uv recorded sha256 {recorded}"


def target_problem(stamp: dict, spec: dict, settings: dict, profile_name: str) -> str | None:
    """Why a build's record says it was built for another GPU than the host's, or None:
    the entry's torch_cuda_arch_list for the host's profile, else the profile's own."""
    wanted = (spec.get("torch_cuda_arch_list") or {}).get(profile_name) or settings["hardware_profiles"][profile_name][
        "torch_cuda_arch_list"
    ]
    if stamp.get("target") != wanted or stamp.get("profile") != profile_name:
        return (
            f"built for TORCH_CUDA_ARCH_LIST={stamp.get('target')!r} (profile {stamp.get('profile')!r}); "
            f"this host is {profile_name!r}, which wants {wanted!r}"
        )
    return None


def test_every_build_targets_the_hosts_gpu(read, settings, enabled, profile_name):
    """Protects against kernels built for another GPU: a build that took a fixed
    TORCH_CUDA_ARCH_LIST (sm_121 on a hopper box), or a wheel shared from a host of another
    profile. Its record (stamp.json) names the target it was compiled for."""
    read_builds = read(builds)
    for name, spec in enabled.items():
        found = read_builds["installs"].get(_normal(spec["package"]))
        assert found, f"{name}: {spec['package']} is not installed from a wheel file"
        directory = found["direct"]["url"].removeprefix("file://").rsplit("/", 1)[0]
        assert directory in read_builds["stamps"], f"{name}: installed from {directory}, not from the wheelhouse"
        stamp = _stamp(read_builds, directory)
        problem = target_problem(stamp, spec, settings, profile_name)
        assert problem is None, f"{name}: {problem}"


def test_wheelhouse_is_not_writable_by_others(read, settings, enabled):
    """Protects against code injection: whoever can replace a wheel or its stamp in the
    wheelhouse puts code into the venv at the next converge."""
    owners = {"root", settings["python_venv_owner"]}
    for name in enabled:
        listing = read(builds)["listings"][name].check().splitlines()
        assert listing, f"{name}: nothing in the wheelhouse"
        for line in listing:
            user, mode, path = line.split(" ", 2)
            assert user in owners and int(mode, 8) & 0o022 == 0, line


def test_builds_turned_off_are_not_in_the_venv(read, settings):
    """Protects against a build that was turned off (source_builds_enabled) but still runs
    in the venv, shadowing the manifest's package of the same name."""
    off = set(settings["source_builds"]) - set(settings["source_builds_enabled"])
    installs = read(builds)["installs"]
    for name, found in installs.items():
        url = found["direct"]["url"]
        for build in off:
            assert not url.startswith(f"file://{WHEELHOUSE}/{build}/"), f"{name} still comes from {url}"


@need
def prefix_installs(r) -> dict:
    """Each enabled prefix build's current link and, once it is read, the record, listing and
    links' targets of the directory it leads to (root's: root installs the prefix)."""
    found = {}
    for name in [n for n in r.settings["source_builds_enabled"] if r.settings["source_builds"][n]["kind"] == "prefix"]:
        link = r.path(f"{PREFIXES}/{name}/current")
        found[name] = {"link": link}
        if link.is_symlink:
            directory = f"{PREFIXES}/{name}/{link.linked_to.rsplit('/', 1)[-1]}"
            found[name].update(
                directory=directory,
                record=r.file(f"{directory}.json"),
                listing=r.run(f"find {shlex.quote(directory)} -printf '%u %g %m %y %p\\n'"),
                targets=r.run(
                    f"find {shlex.quote(directory)} -type l -exec sh -c "
                    """'for p; do printf "%s\\t%s\\n" "$p" "$(realpath -m -- "$p")"; done' sh {} +"""
                ),
            )
    return found


def test_every_enabled_prefix_is_installed_root_owned_from_its_stamped_archive(read, prefixes):
    """Protects against a prefix (NCCL, nccl-tests) that runs other code than configured: an
    earlier ref still linked as current, a build its unprivileged build user could change
    after root installed it (a file or directory not root's, writable by others), a setuid
    file, or a link that leads out of the prefix."""
    found = read(prefix_installs)
    for name, spec in prefixes.items():
        link = f"{PREFIXES}/{name}/current"
        assert found[name]["link"].is_symlink, f"{name}: {link} is no link"
        directory = found[name]["directory"]
        record = json.loads(found[name]["record"].check())
        assert record["ref"] == spec["ref"] and record["kind"] == "prefix", f"{name}: installed {record['ref']}"
        if COMMIT.match(spec["ref"]):
            assert record["commit"] == spec["ref"]
        assert record["env"] == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in spec["env"].items()}
        assert record["steps"] == spec["steps"] and sorted(record["needs"]) == sorted(spec["needs"])
        listing = found[name]["listing"].check().splitlines()
        assert listing, f"{name}: {directory} is empty"
        targets = dict(line.split("\t", 1) for line in found[name]["targets"].check().splitlines() if "\t" in line)
        for line in listing:
            user, group, mode, kind, path = line.split(" ", 4)
            assert (user, group) == ("root", "root"), line
            assert kind in "fdl" and (kind == "l" or int(mode, 8) & 0o6022 == 0), line
            if kind == "l":
                target = targets.get(path, "")
                assert target == directory or target.startswith(directory + "/"), f"{line} leads to {target}"
