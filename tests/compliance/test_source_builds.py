"""
Source build controls: each enabled build is installed in the venv from its wheel in the
wheelhouse, stamped with the configured ref and build environment; the wheelhouse cannot be
changed by others; a build turned off is gone from the venv.

The expected values are worked out here from the settings, independently of the code that
builds (operations/source_builds.py): nothing of it is imported. On a host with no build
enabled (the default) the controls skip, saying so.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex

import pytest

from tests.compliance.conftest import as_venv_owner

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
    wheels = {name: settings["source_builds"][name] for name in names if settings["source_builds"][name]["kind"] == "wheel"}
    if not wheels:
        pytest.skip(f"no wheel build is enabled on this host (only prefix builds: {', '.join(names)})")
    return wheels


@pytest.fixture
def prefixes(settings) -> dict[str, dict]:
    names = [n for n in settings["source_builds_enabled"] if settings["source_builds"][n]["kind"] == "prefix"]
    if not names:
        pytest.skip("no prefix build (kind: prefix, such as nccl) is enabled on this host")
    return {name: settings["source_builds"][name] for name in names}


# The venv's distributions installed from a wheel file, with what uv recorded; run by the control
# and declared, the same text, for the suite's one reading.
_INSTALLS = (
    "import importlib.metadata as m, json\n"
    "found = {}\n"
    "for d in m.distributions():\n"
    "    direct = d.read_text('direct_url.json')\n"
    "    if direct:\n"
    "        found[d.metadata['Name']] = {'version': d.version, 'direct': json.loads(direct)}\n"
    "print(json.dumps(found))"
)


def _wheelhouse_installs(host, venv: str) -> dict[str, dict]:
    """Every distribution of the venv installed from a wheel file, by normalised name:
    its version and the URL and hash uv recorded (direct_url.json)."""
    command = f"{shlex.quote(venv + '/bin/python')} -c {shlex.quote(_INSTALLS)}"
    out = host.check_output(as_venv_owner(host, host.file(venv).user, command))
    return {_normal(name): value for name, value in json.loads(out).items()}


def test_every_enabled_build_is_installed_from_its_stamped_wheel(host, settings, enabled):
    """Protects against a venv that runs another build than configured: a wheel of an
    earlier ref or another build environment left in place after a bump, a build that
    never finished, or a package reinstalled by hand over the build."""
    installs = _wheelhouse_installs(host, settings["python_venv_path"])
    for name, spec in enabled.items():
        found = installs.get(_normal(spec["package"]))
        assert found, f"{name}: {spec['package']} is not installed from a wheel file"
        url = found["direct"]["url"]
        match = re.match(rf"^file://{re.escape(WHEELHOUSE)}/{re.escape(name)}/([0-9a-f]+)/([^/]+\.whl)$", url)
        assert match, f"{name}: installed from {url}, not from the wheelhouse"
        directory = f"{WHEELHOUSE}/{name}/{match[1]}"
        stamp = json.loads(host.file(f"{directory}/stamp.json").content_string)
        assert stamp["ref"] == spec["ref"], f"{name}: built from {stamp['ref']}, configured {spec['ref']}"
        if COMMIT.match(spec["ref"]):
            assert stamp["commit"] == spec["ref"]
        # The stamp holds each value's sha256 (it is world-readable and travels to peers).
        wanted_env = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in spec["env"].items()}
        assert stamp["env"] == wanted_env, f"{name}: built with {stamp['env']}, configured {spec['env']}"
        assert stamp["steps"] == spec["steps"] and stamp["package"] == spec["package"]
        assert stamp["wheel"] == match[2] and found["version"] == stamp["version"], (found, stamp)
        assert host.file(f"{directory}/{stamp['wheel']}").sha256sum == stamp["sha256"]
        recorded = (found["direct"].get("archive_info") or {}).get("hashes", {}).get("sha256")
        assert recorded in (None, stamp["sha256"]), f"{name}: uv recorded sha256 {recorded}"


def target_problem(stamp: dict, spec: dict, settings: dict, profile_name: str) -> str | None:
    """Why a build's record says it was built for another GPU than the host's, or None:
    the entry's torch_cuda_arch_list for the host's profile, else the profile's own."""
    wanted = (spec.get("torch_cuda_arch_list") or {}).get(profile_name) \
        or settings["hardware_profiles"][profile_name]["torch_cuda_arch_list"]
    if stamp.get("target") != wanted or stamp.get("profile") != profile_name:
        return (f"built for TORCH_CUDA_ARCH_LIST={stamp.get('target')!r} (profile {stamp.get('profile')!r}); "
                f"this host is {profile_name!r}, which wants {wanted!r}")
    return None


def test_every_build_targets_the_hosts_gpu(host, settings, enabled, profile_name):
    """Protects against kernels built for another GPU: a build that took a fixed
    TORCH_CUDA_ARCH_LIST (sm_121 on a hopper box), or a wheel shared from a host of another
    profile. Its record (stamp.json) names the target it was compiled for."""
    installs = _wheelhouse_installs(host, settings["python_venv_path"])
    for name, spec in enabled.items():
        found = installs.get(_normal(spec["package"]))
        assert found, f"{name}: {spec['package']} is not installed from a wheel file"
        directory = found["direct"]["url"].removeprefix("file://").rsplit("/", 1)[0]
        stamp = json.loads(host.file(f"{directory}/stamp.json").content_string)
        problem = target_problem(stamp, spec, settings, profile_name)
        assert problem is None, f"{name}: {problem}"


def test_wheelhouse_is_not_writable_by_others(host, settings, enabled):
    """Protects against code injection: whoever can replace a wheel or its stamp in the
    wheelhouse puts code into the venv at the next converge."""
    owners = {"root", settings["python_venv_owner"]}
    for name in enabled:
        listing = host.check_output(
            f"find {shlex.quote(f'{WHEELHOUSE}/{name}')} -printf '%u %m %p\\n'"
        ).splitlines()
        assert listing, f"{name}: nothing in the wheelhouse"
        for line in listing:
            user, mode, path = line.split(" ", 2)
            assert user in owners and int(mode, 8) & 0o022 == 0, line


def test_builds_turned_off_are_not_in_the_venv(host, settings):
    """Protects against a build that was turned off (source_builds_enabled) but still runs
    in the venv, shadowing the manifest's package of the same name."""
    off = set(settings["source_builds"]) - set(settings["source_builds_enabled"])
    installs = _wheelhouse_installs(host, settings["python_venv_path"])
    for name, found in installs.items():
        url = found["direct"]["url"]
        for build in off:
            assert not url.startswith(f"file://{WHEELHOUSE}/{build}/"), f"{name} still comes from {url}"


def test_every_enabled_prefix_is_installed_root_owned_from_its_stamped_archive(host, prefixes):
    """Protects against a prefix (NCCL, nccl-tests) that runs other code than configured: an
    earlier ref still linked as current, a build its unprivileged build user could change
    after root installed it (a file or directory not root's, writable by others), a setuid
    file, or a link that leads out of the prefix."""
    for name, spec in prefixes.items():
        link = f"{PREFIXES}/{name}/current"
        assert host.file(link).is_symlink, f"{name}: {link} is no link"
        key = host.file(link).linked_to.rsplit("/", 1)[-1]
        directory = f"{PREFIXES}/{name}/{key}"
        record = json.loads(host.file(f"{directory}.json").content_string)
        assert record["ref"] == spec["ref"] and record["kind"] == "prefix", f"{name}: installed {record['ref']}"
        if COMMIT.match(spec["ref"]):
            assert record["commit"] == spec["ref"]
        assert record["env"] == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in spec["env"].items()}
        assert record["steps"] == spec["steps"] and sorted(record["needs"]) == sorted(spec["needs"])
        listing = host.check_output(f"find {shlex.quote(directory)} -printf '%u %g %m %y %p\\n'").splitlines()
        assert listing, f"{name}: {directory} is empty"
        for line in listing:
            user, group, mode, kind, path = line.split(" ", 4)
            assert (user, group) == ("root", "root"), line
            assert kind in "fdl" and (kind == "l" or int(mode, 8) & 0o6022 == 0), line
            if kind == "l":
                target = host.check_output(f"realpath -m -- {shlex.quote(path)}")
                assert target == directory or target.startswith(directory + "/"), f"{line} leads to {target}"


# What the read-only controls above ask, read once per host before they run (reads.py).
def reads(plan, settings) -> None:
    names = settings["source_builds_enabled"]
    venv = settings["python_venv_path"]
    plan.path(venv)
    found, me = plan.known_path(venv), plan.known("id -nu")
    if found is None or me is None or "stat -Lc %U" not in found:
        return
    plan.run("id -u %s", me.strip())
    uid = plan.known("id -u %s", me.strip())
    if uid is None:
        return
    command = f"{shlex.quote(venv + '/bin/python')} -c {shlex.quote(_INSTALLS)}"
    command = f"runuser -u {shlex.quote(found['stat -Lc %U'])} -- {command}" if uid.strip() == "0" else command
    plan.run(command)
    for name in names:
        spec = settings["source_builds"][name]
        if spec["kind"] == "wheel":
            plan.run(f"find {shlex.quote(f'{WHEELHOUSE}/{name}')} -printf '%u %m %p\\n'")
    installs = plan.known(command)
    if installs is None:
        return
    installs = {_normal(k): v for k, v in json.loads(installs).items()}
    for name in names:
        spec = settings["source_builds"][name]
        got = installs.get(_normal(spec["package"]))
        match = got and re.match(rf"^file://{re.escape(WHEELHOUSE)}/{re.escape(name)}/([0-9a-f]+)/([^/]+\.whl)$",
                                 got["direct"]["url"])
        if spec["kind"] != "wheel" or not match:
            continue
        directory = f"{WHEELHOUSE}/{name}/{match[1]}"
        plan.file(f"{directory}/stamp.json")
        stamp = plan.known("cat -- %s", f"{directory}/stamp.json")
        if stamp is not None:
            plan.run("sha256sum %s | cut -d ' ' -f 1", f"{directory}/{json.loads(stamp)['wheel']}")
