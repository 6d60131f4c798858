"""
What the Python stack and the source builds share, as a contract neither imports the other for.

- **The wheelhouse** (:data:`WHEELHOUSE`): the source builds put each built wheel in
  ``WHEELHOUSE/<build>/<key>/``; the venv installs it from there, named in its requirement
  lines (``package @ file://WHEELHOUSE/<build>/<key>/<file>.whl --hash=sha256:...``).
- **Which built wheels a host installs now**: whoever fills the wheelhouse registers one
  :class:`Builds` (:func:`provide`); the venv's owner asks :func:`built_lines` (empty while
  nothing is registered: a deploy without source builds) and :func:`missing` (what the lock
  leaves to a build no enabled build makes).
- **The venv sync that installs from it**: the venv's owner registers its operation
  (:func:`sync_with`); the builds call :func:`sync_venv` once a build of this run may have
  added a wheel. Without a registered sync (a deploy without the Python stack) the new wheel
  reaches the venv with the next deploy that has one, and the host is told so.

Each side registers itself when its deploy module is imported (deploy.py imports both), so the
order in which a deploy calls them is the order their data allows: python_stack() first, as
the builds install into its venv.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from . import messages
from .python_wheels import normalise

WHEELHOUSE = "/var/lib/sparkrig/wheelhouse"


def line_prefix(build: str, package: str) -> str:
    """How the requirement line of any wheel of ``build`` (making ``package``) begins."""
    return f"{normalise(package)} @ file://{WHEELHOUSE}/{build}/"


class Builds(NamedTuple):
    """What the wheelhouse's filler answers, for a host's settings."""

    # {package: requirement line} of the built wheels the host installs now.
    lines: Callable[[Mapping[str, Any]], Mapping[str, str]]
    # Why the host's lock cannot be installed for its architecture (a package it leaves to a
    # source build that no enabled build makes), or None.
    missing: Callable[[Mapping[str, Any], str], str | None]


_BUILDS: list[Builds] = []
_SYNC: list[Callable[..., Any]] = []


def provide(builds: Builds) -> None:
    """Register the wheelhouse's filler (once, at import)."""
    _BUILDS[:] = [builds]


def sync_with(operation: Callable[..., Any]) -> None:
    """Register the venv owner's operation: ``operation(name=..., settings=...)`` makes the
    venv hold its lock and :func:`built_lines` as they are when it runs."""
    _SYNC[:] = [operation]


def built_lines(settings: Mapping[str, Any]) -> dict[str, str]:
    """The requirement lines of the built wheels the host installs now, by package."""
    return {package: line for builds in _BUILDS for package, line in builds.lines(settings).items()}


def missing(settings: Mapping[str, Any], arch: str) -> str | None:
    """What the host's lock leaves to a source build that no enabled build makes, or None."""
    return next((said for builds in _BUILDS if (said := builds.missing(settings, arch))), None)


def sync_venv(name: str, settings: Mapping[str, Any]) -> None:
    """Have the venv install the wheels built so far (when the venv's owner is in this deploy)."""
    if not _SYNC:
        messages.detail("a wheel built in this run reaches the venv with the next deploy that calls python_stack()")
        return
    _SYNC[0](name=name, settings=settings)
