"""Source builds: the one reading of a host's builds, and the deploy that builds each enabled
build once per fleet, shares its product and installs it."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy

from sparkrig import atomic, host_settings, reading, wheelhouse
from sparkrig.packages import TIMEOUT_KEY
from sparkrig.packages import installed as install_packages
from sparkrig.prefix import installed_dir

from .cache import cache_root, cached, fetch, receive
from .catalogue import build_env, known_keys, runtime_packages, unit_name, wanted
from .facts import SourceBuilds, fact_arguments, requirement_lines
from .operations import build, render_build_script, report, report_failure
from .prefixes import install_prefix
from .settings import DEFAULTS, missing_builds_message


def read_builds(data: Mapping[str, Any]) -> dict:
    """:class:`SourceBuilds` of the current host's enabled builds. While pyinfra prepares,
    from the host's one reading (python_stack and this concern both need it; nothing on the
    host has changed yet). While operations execute, the host is read again each time."""
    arguments = fact_arguments(data)
    if host.state.is_executing:
        return host.get_fact(SourceBuilds, **arguments)
    return reading.get(SourceBuilds, **arguments)


def host_requirement_lines(data: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The requirement lines of the built wheels the current host installs now (its
    resolved settings ``data``, by default read from the host); reads
    :class:`SourceBuilds` only when a build is enabled."""
    data = host_settings.current() if data is None else data
    if data.get("hardware_profile") not in data["hardware_profiles"]:  # "auto", unresolved
        return {}
    builds = wanted(data)
    if not builds:
        return {}
    return requirement_lines(data, read_builds(data))


@reading.planner
def reads(settings):
    # A build's key depends on the hardware profile; "auto" is chosen from the reading itself
    # (hardware()), so such a host reads its builds when they are asked for: one command more.
    if not settings["source_builds_enabled"] or settings["hardware_profile"] not in settings["hardware_profiles"]:
        return []
    parts = [reading.part(SourceBuilds, **fact_arguments(settings))]
    if runtime_packages(settings):
        parts.append(reading.part(atomic.HostState, packages=runtime_packages(settings)))
    return parts


# Each host's build keys, once per run: every host asks for every other host's (_peers), so
# a fleet of N hosts resolved N² hosts' settings (256 hosts: 65,536, most of the run's CPU).
_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _known_keys(state, other) -> dict[str, str]:
    """:func:`known_keys` of host ``other``, kept for the run once known (a host whose
    profile is still "auto" is asked again: its box has not been read yet)."""
    keys = _KEYS.setdefault(state, {})
    if other.name not in keys:
        found = known_keys(host_settings.known(other))
        if found is None:
            return {}
        keys[other.name] = found
    return keys[other.name]


def _peers(name: str, key: str) -> list[str]:
    """The hosts of this run that want build ``name`` with ``key``, in inventory order
    (from their settings alone: no host is contacted)."""
    state = host.state
    return [
        other.name
        for other in state.inventory
        if state.is_host_in_limit(other)
        and other not in state.failed_hosts
        and _known_keys(state, other).get(name) == key
    ]


wheelhouse.provide(wheelhouse.Builds(lines=host_requirement_lines, missing=missing_builds_message))


@deploy("Source builds", data_defaults=DEFAULTS)
def source_builds():
    """
    Build the enabled source builds once per fleet; have their wheels installed into the venv
    and their prefixes into /opt/sparkrig/builds.

    A wheel built in this run reaches the venv through the shared contract
    (sparkrig/wheelhouse.py: the venv's owner, python_stack, syncs it); the builds run as the
    venv's owner, so python_stack() comes first in a deploy that has both.

    Settings: ``source_builds*``; see docs/settings.md and group_data/source_builds.yml.
    """
    data = host_settings.current()
    if data["source_builds_enabled"] and host_settings.profile_or_refuse(data, "source_builds") is None:
        return
    builds = wanted(data)
    if not builds:
        return
    found = read_builds(data)
    cache = data["source_builds_controller_cache"]
    owner = data["python_venv_owner"]
    packages = runtime_packages(data)
    if packages:
        present = reading.get(atomic.HostState, packages=packages)["packages"]
        missing = [p for p in packages if present.get(p) is None]
        if missing:
            install_packages(
                name=f"Packages the prefix builds need at run time ({', '.join(missing)})", packages=missing
            )
    pending = False
    deferred: set[str] = set()  # prefix builds that cannot be installed in this run
    for name, key in builds.items():
        spec = data["source_builds"][name]
        prefix = spec["kind"] == "prefix"
        entry = found.get(name) or {}
        state = entry.get("state", "absent")
        peers = _peers(name, key)
        builder = peers[0] if peers else host.name
        building = builder == host.name  # `host` is a context proxy: compare names
        in_cache = cached(cache_root(cache), name, key) is not None
        share = len(peers) > 1 and not in_cache
        if state == "failed":
            report_failure(name=f"Source build {name} failed", build_name=name, key=key)
            continue
        installed = prefix and entry.get("installed") == key and entry.get("link") == key
        if (installed or (state == "built" and not prefix)) and not (share and building):
            continue
        pending = pending or (state != "built" and not prefix)
        runs_here = state == "running" or (state == "absent" and building and not in_cache)
        waiting_for = [need for need in spec.get("needs", []) if need in deferred]
        if runs_here and state != "running" and waiting_for:
            # Its build compiles against the needed prefix, which is not installed yet.
            report(f"source build {name} waits for {', '.join(waiting_for)}: it is built by a later deploy")
            deferred.add(name)
            continue
        if runs_here and not data["source_builds_wait"]:
            report(
                f"source build {name} {'runs' if state == 'running' else 'starts'} detached "
                f"({unit_name(name, key)}; journalctl -u to follow it): its "
                f"{'prefix' if prefix else 'wheel'} comes with a later deploy"
            )
        if prefix and not installed and (state != "built" and (runs_here and not data["source_builds_wait"])):
            deferred.add(name)
        # Every host with work for this build calls the same operations in the same order
        # (each a no-op where it is not this host's part): pyinfra orders operations by each
        # host's sequence, and the others' upload must come after the builder's fetch.
        build(
            name=f"Source build {name}, on its builder",
            build_name=name,
            key=key,
            script=render_build_script(name, key, data) if runs_here else "",
            owner=owner,
            env=build_env(name, data),
            packages=spec["build_packages"],
            memory_max=spec["memory_max"],
            oom_score_adj=data["jobs_oom_score_adj"],
            cuda_env_file=data["cuda_env_file"],
            launch=runs_here and state != "running",
            wait=runs_here and data["source_builds_wait"],
            dpkg_lock_timeout_s=data[TIMEOUT_KEY],
        )
        product_name = "prefix" if prefix else "wheel"
        fetch(
            name=f"Source build {name}: the {product_name} from its builder into the controller's cache",
            build_name=name,
            key=key,
            cache=cache,
            owner=owner,
            active=share and building,
        )
        receive(
            name=f"Source build {name}: the {product_name} from the controller's cache",
            build_name=name,
            key=key,
            cache=cache,
            builder=builder,
            owner=owner,
            active=state == "absent" and not runs_here,
        )
        if prefix and not installed:
            install_prefix(
                name=f"Source build {name}: root checks its archive and installs it into {installed_dir(name, key)}",
                build_name=name,
                key=key,
                cache=cache,
                owner=owner,
            )
    if pending:
        wheelhouse.sync_venv(name="Built wheels into the venv (python_venv_path)", settings=data)
