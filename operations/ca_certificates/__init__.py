"""
Extra CA certificates: the roots a fleet behind a TLS-intercepting proxy must trust.

Each entry of ``ca_certificates_extra`` becomes
``/usr/local/share/ca-certificates/sparkrig-<name>.crt`` (root, 0644), and
``update-ca-certificates`` adds it to the system store that apt, curl, Docker and
pip read. uv reads that store too, because sparkrig runs it with
``UV_SYSTEM_CERTS=1`` (operations/python_stack/). Entries removed from the
setting are removed from the host. A converged host costs one remote command.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "ca_certificates"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "ca_certificates")
