"""
sparkrig's concerns, in the order deploy.py applies them: the one registry.

Each name is a concern under ``sparkrig.operations`` that exposes a ``@deploy`` function of
its own name (usable from any other pyinfra deploy), the facts it decides changes from, and
``SETTINGS``: its settings, declared once (docs/settings.md is generated from them). Nothing
is imported here: importing one concern imports only it, what it reads, and sparkrig's shared
layer.

A deploy of your own gets sparkrig's settings validation, deploy lock and summary line with
one call in its ``config.py`` (pyinfra loads it before it contacts any host)::

    from sparkrig.operations import install
    install("swap")  # the concerns your deploy calls; none named: every concern
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pyinfra.context import ctx_state

from sparkrig import hooks, reading

# The repository's root is on the path too (the editable install, pytest's rootdir): this folder
# is sparkrig.operations alone, so that one file is never two modules.
if __name__ != "sparkrig.operations":
    raise ImportError(f"{__name__!r} is sparkrig.operations: import it by that name")

CONCERNS = (
    "hardware",
    "updates",
    "ca_certificates",
    "cuda_env",
    "swap",
    "sshd_guard",
    "watchdog",
    "gpu_policy",
    "jobs",
    "metrics",
    "containers",
    "ngc",
    "python_stack",
    "source_builds",
    "serving",
    "cluster",
    "prometheus",
)
# The host's one reading plans its parts in this order, not in the order concerns were imported.
reading.order(f"{__name__}.{name}" for name in CONCERNS)
# The shared layer's own settings (apt's; the Python stack's manifest, locks and venv, which the
# source builds read too), documented after the concern that reads them first.
_SHARED_SETTINGS = {"updates": "sparkrig.packages", "python_stack": "sparkrig.stack_locks"}


def concern(name: str) -> ModuleType:
    """The concern ``name`` (one of :data:`CONCERNS`), imported."""
    if name not in CONCERNS:
        raise ValueError(f"no sparkrig concern {name!r}: one of {', '.join(CONCERNS)}")
    return importlib.import_module(f"{__name__}.{name}")


def deploy_on_demand(package: str, name: str):
    """A concern package's module ``__getattr__``: its @deploy ``name``, imported from its
    ``deploy`` module when first asked for (``from sparkrig.operations.swap import swap``), so
    that importing the package, or its settings, imports nothing more."""

    def __getattr__(attribute: str):
        if attribute == name:
            return getattr(importlib.import_module(f"{package}.deploy"), name)
        raise AttributeError(f"module {package!r} has no attribute {attribute!r}")

    return __getattr__


def load(names: tuple[str, ...] = CONCERNS) -> tuple:
    """The @deploy of each of ``names``, imported (so their reading planners, sparkrig.reading,
    are registered; they run in CONCERNS order whatever the import order)."""
    return tuple(getattr(concern(name), name) for name in names)


def declaring(names: tuple[str, ...] = CONCERNS) -> tuple[ModuleType, ...]:
    """The modules that declare the settings of ``names``, in deploy order (the reference's)."""
    found: list[ModuleType] = []
    for name in names:
        found.append(concern(name))
        if name in _SHARED_SETTINGS:
            found.append(importlib.import_module(_SHARED_SETTINGS[name]))
    return tuple(found)


def install(*names: str) -> None:
    """Call from a deploy's ``config.py``: validate the settings of the concerns ``names``
    (default: all) on every targeted host before any host is contacted, take each host's
    deploy lock before its first change, and end the run with its one summary line."""
    declaring(names or CONCERNS)
    load(names or CONCERNS)
    hooks.install(ctx_state.get())
