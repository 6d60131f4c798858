"""
CUDA environment: one KEY=VALUE file that login shells and systemd units both read.

``cuda_env_file`` (default ``/etc/sparkrig/cuda.env``) is the single source of
truth. ``/etc/profile.d/sparkrig-cuda.sh`` exports it into login shells, keeping
what PATH and LD_LIBRARY_PATH already held after the file's entries; systemd
units read the same file with ``EnvironmentFile=``. ``CUDA_HOME`` is read from
the host: the target of ``/usr/local/cuda`` (followed through every link),
else the newest ``/usr/local/cuda-X.Y``, else ``cuda_env_default_home``.

The file also makes ``uv run`` in a user's project use the managed venv
(``UV_PROJECT_ENVIRONMENT``, the venv's path) as it is (``UV_NO_SYNC=1``: no lock,
no sync, nothing the deploy installed is replaced), and names the shared model
cache (``jobs_model_cache``) as ``HF_HOME``.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "cuda_env"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "cuda_env")
