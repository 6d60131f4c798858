"""
NGC training containers (seeds 000 and 004): NVIDIA's PyTorch image pinned by
digest, an optional image built on it, the ``spark-container`` launcher, and
JupyterLab as a systemd-managed container bound to 127.0.0.1. Off by default.

- The base image is pulled by digest (``name[:tag]@sha256:…``), never by a moving
  tag, and only when ``docker image inspect`` does not find it at that digest.
- ``ngc_build`` ``packages`` or ``unsloth`` renders ``/etc/sparkrig/ngc/Dockerfile``
  (``FROM`` the pinned base) and builds it as ``ngc_image``, labelled with the sha256
  of the Dockerfile: it is rebuilt only when the Dockerfile (base digest included)
  changed. The build runs as a transient systemd unit, so it survives a dropped SSH
  session.
- ``/usr/local/bin/spark-container`` runs a command (default: bash) as its caller in
  the image with ``--gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864``,
  the project, the Hugging Face cache and the outputs mounted, the CUDA env file's
  portable variables, and secrets as read-only 0600 files exported inside the
  container only (never ``--env`` values, which ``docker inspect`` shows).
  ``--publish PORT`` binds to 127.0.0.1 (``--publish-all-interfaces`` for every
  interface), ``ngc_home_mounts`` are mounted read-only, ``jobs_model_cache`` (when
  set) replaces ``ngc_hf_cache``, and ``--detach NAME`` hands the same launch to
  ``spark-run --detach`` (the job wrappers concern), so ``spark-jobs`` sees it.
- ``ngc_jupyter``: ``sparkrig-jupyter.service`` runs JupyterLab through the launcher,
  on the host network bound to 127.0.0.1, with its token read from a 0600 file
  generated on the host (``JUPYTER_TOKEN`` inside the container), ``Restart=always``.

The concern reads the host with two facts (:class:`NgcHost` for Docker's images, the
users and the token; :class:`atomic.HostState` for its files and unit): one remote
command each, and no operation on a converged host. Turned off, it reads nothing.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "ngc"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "ngc")
