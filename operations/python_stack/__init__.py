"""
Python ML stack: uv, and a virtualenv holding exactly a lock made on the controller.

The stack is data: ``python_stack`` (loaded from ``group_data/python_stack.yml``)
names the Python version, torch (from PyPI unless an index is named for it alone),
vLLM's wheel per CPU architecture with its sha256, extras and optional profiles.

- **Locks.** ``uv run sparkrig lock`` resolves the manifest on the
  controller, once per (architecture, Python, set of profiles) listed under ``locks``,
  into ``group_data/python_stack.locks/`` (``uv pip compile --generate-hashes``, every
  file's sha256). Each lock's header records a digest of its inputs: settings
  validation refuses a host whose lock is missing or stale, before any host is contacted.
- **Hosts never resolve.** The lock is uploaded to ``<venv>/sparkrig/requirements.lock``
  (built wheels, operations/source_builds/, replace their package's entry) and
  ``uv pip sync --require-hashes`` makes the venv hold exactly that. With
  ``python_offline`` the controller downloads the locked wheels once (hashes checked)
  and hosts install them with ``--offline --no-index``.
- uv, pinned by version and sha256, is installed from a package index into its own
  tool environment ``/opt/sparkrig/uv`` (``/usr/local/bin/uv`` links to it unless
  that name is taken); no ``curl | sh``.
- Whether anything changes is read once (:class:`PythonStack`): the sha256 of the
  host's lock and uv's offline ``uv pip sync --dry-run`` of it ("Would make no changes").

uv runs as the venv's owner, with ``--no-config`` (no user or system uv.toml
changes what is installed) and ``UV_SYSTEM_CERTS=1`` (the system CA store, which
holds ``ca_certificates_extra``).
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "python_stack"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "python_stack")
