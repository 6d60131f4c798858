"""Python stack: the deploy, and the part of the host's one reading it decides from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api import deploy

from sparkrig import atomic, host_settings, reading, wheelhouse
from sparkrig.messages import refused
from sparkrig.packages import installed as install_packages
from sparkrig.stack_locks import digest, lock_problem, manifest_problem
from sparkrig.venv import UV_TOOL

from .facts import OFFLINE_DIR, PythonStack, major_minor, plan_clean
from .operations import UV_REQUIREMENTS, render_uv_requirements, synced, uv_tool, virtualenv, virtualenv_arguments
from .settings import DEFAULTS


def venv_stale(found: Mapping[str, Any], python: str, owner: str, lock: str, wheels: Sequence[str]) -> bool:
    """Whether :func:`virtualenv` has work, from one :class:`PythonStack` reading."""
    return (
        not found["usable"]
        or major_minor(found["python"]) != python
        or (found["owner"], found["cache_owner"]) != (owner, owner)
        or found["lock"] != digest(lock)
        or not plan_clean(found, lock)
        or sorted(found["wheels"]) != sorted(wheels)
        or (found["offline_dir"] and not wheels)
    )


@reading.planner
def reads(settings):
    # As python_stack() asks (offline wheels exist when python_offline is on).
    return [
        reading.part(
            PythonStack,
            venv=settings["python_venv_path"],
            owner=settings["python_venv_owner"],
            wheels=OFFLINE_DIR if settings["python_offline"] else "",
        )
    ]


wheelhouse.sync_with(synced)


@deploy("Python stack", data_defaults=DEFAULTS)
def python_stack():
    """
    Install uv and make the virtualenv hold the controller's lock of the manifest.

    The venv also holds the wheels built on the host (sparkrig/wheelhouse.py: the source
    builds, when their concern is in this deploy, say which); without them it holds the lock
    alone.

    Settings: ``python_*``; see docs/settings.md and group_data/python_stack.yml.
    """
    data = host_settings.current()
    profile = host_settings.profile_or_refuse(data, "python_stack")
    if profile is None:
        return
    manifest = data.python_stack
    arch = profile["arch"]
    # Checked before any connection for a named profile; for "auto", now that the box said.
    problem = (
        manifest_problem(manifest, arch)
        or lock_problem(manifest, arch, data.python_stack_profiles, data.python_stack_locks)
        or wheelhouse.missing(data, arch)
    )
    if problem:
        refused(name="The versions manifest and its lock fit this box", message=f"python_stack: {problem}")
        return
    try:
        arguments = virtualenv_arguments(data, wheelhouse.built_lines(data))
    except (OSError, RuntimeError, ValueError) as error:  # python_offline's downloads
        refused(name="The controller has the locked wheels", message=f"python_offline: {error}")
        return
    owner = data.python_venv_owner
    found = reading.fact(
        PythonStack,
        venv=data.python_venv_path,
        owner=owner,
        wheels=OFFLINE_DIR if arguments["wheels"] else "",
    )
    if found is None:
        return

    # The pins file is read only when uv is (re)installed: the uv version tells the rest.
    if found["uv"] != data.python_uv_version:
        if not found["venv_module"]:
            install_packages(name="Install python3-venv (uv's tool environment)", packages=["python3-venv"])
        atomic.file(
            name=f"uv pin (python_uv_version) and its sha256 ({UV_REQUIREMENTS})",
            dest=UV_REQUIREMENTS,
            content=render_uv_requirements(data.python_uv_version, data.python_uv_sha256),
            mode=0o644,
        )
    link_free = not found["link_exists"]
    if found["uv"] != data.python_uv_version or link_free:
        uv_tool(
            name=f"uv in {UV_TOOL}",
            version=data.python_uv_version,
            index_url=data.python_index_url,
            present=found["uv"],
            link=link_free,
        )

    if venv_stale(found, manifest["python"], owner, arguments["lock"], list(arguments["wheels"])):
        virtualenv(
            name="Virtualenv python_venv_path, with the manifest's Python, owned by python_venv_owner",
            **arguments,
        )
