"""
Source builds: packages compiled on the hosts from a git repository at a pinned ref
(Triton, xformers, vLLM for sm_121), built once per fleet, installed from a wheelhouse;
and prefixes (C/C++/CUDA projects such as NCCL), installed by root into /opt/sparkrig/builds.

Each build is data (``source_builds``, loaded from ``group_data/source_builds.yml``):
repository URL, ref (a commit or a tag), build environment, build steps, build
requirements and the apt packages it needs. All are off; a host or group turns
builds on by name with ``source_builds_enabled``.

- **Stamp.** A build's key hashes everything that makes its wheel: ref (and the URL
  for a tag; a commit id names the same sources on any mirror), environment, steps,
  requirements, the host's architecture and hardware profile,
  the venv's Python (unless the wheel is abi3) and torch version (if it compiles
  against torch). Hosts of one key share one wheel.
- **Detached.** The build runs on the host as a transient systemd service,
  ``sparkrig-build-<name>-<key>.service``, under ``training.slice``, as the venv's
  owner, its log in the journal. It survives a dropped SSH connection; a deploy
  that finds it running never starts it again. With ``source_builds_wait`` the
  deploy waits for it (printing progress), else it returns at once and the next
  run picks up the result.
- **Wheelhouse.** The build ends in ``/var/lib/sparkrig/wheelhouse/<name>/<key>/``:
  the wheel and ``stamp.json`` (URL, ref, commit, environment, wheel, version,
  sha256). The venv installs it through python_stack's lock, where its line
  (``package @ file:///…whl --hash=sha256:…``) replaces the package's locked entry, so
  ``uv pip sync`` keeps it. Its dependencies are not resolved on the host: they must be
  in the lock (Triton, xformers and vLLM depend on what the stack already holds). While a
  new ref builds, the venv keeps the wheel it has.
- **Once per fleet.** Among the hosts of this run that share a key, the first in
  inventory order builds; its wheel is fetched into the controller's cache
  (``source_builds_controller_cache``) and uploaded to the others, which never
  build. A wheel already in the cache is uploaded, not built.
- **Failure.** A failed build leaves the venv as it was; the deploy fails that
  host with the journal's last lines, and the next deploy tries again.
- **Prefix builds** (``kind: prefix``, entries of the owner's: the catalogue ships none) run their steps into
  ``$SPARKRIG_PREFIX``; the product is ``prefix.tar.gz`` of it with ``stamp.json``,
  shared like a wheel. Root copies the archive out as its owner into a root-owned file,
  checks its sha256 and every member (:mod:`sparkrig.unpack_prefix`: files, directories
  and links that stay inside only; no setuid bit) and unpacks it into
  ``/opt/sparkrig/builds/<name>/<key>/``, then points ``current`` at it. ``needs`` names
  prefixes a build compiles against (built first; their keys enter its stamp);
  ``runtime_packages`` are installed on every host that installs it. The venv is not touched.

A converged host costs one remote command (:class:`SourceBuilds`, read once while
pyinfra prepares, by python_stack, which installs the wheels, and by this concern).
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "source_builds"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "source_builds")
