"""
sparkrig's concerns, one module each, in the order deploy.py applies them.

Every concern module exposes a ``@deploy`` function (usable from any other
pyinfra deploy), the facts it decides changes from, and ``SETTINGS``: its
settings, declared once (docs/settings.md is generated from them).
"""

from sparkrig import packages

from . import (
    ca_certificates,
    cluster,
    containers,
    cuda_env,
    hardware,
    jobs,
    ngc,
    python_stack,
    source_builds,
    sshd_guard,
    swap,
    updates,
    watchdog,
)

# Every module that declares settings, in deploy order.
CONCERNS = (
    hardware, updates, packages, ca_certificates, cuda_env, swap, sshd_guard, watchdog, jobs, containers, ngc,
    python_stack, source_builds, cluster,
)
