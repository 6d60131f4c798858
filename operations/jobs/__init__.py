"""
Job wrappers: commands in /usr/local/bin that start, check for and clean up after
training runs, and the slice that caps the memory of every job.

- ``spark-run [--memory-max SIZE] -- CMD…`` runs CMD as the caller, with the
  caller's environment, in a transient scope below ``training.slice``
  (``MemoryMax=jobs_memory_max``, ``MemorySwapMax=0``) and with
  ``oom_score_adj`` ``jobs_oom_score_adj`` (``choom``), so the job dies first.
  Only root can create the scope: for another user spark-run runs ``busctl``
  through sudo, asking systemd to move spark-run's own process into the scope.
  ``--detach NAME`` runs it instead as the transient service
  ``spark-job-NAME.service`` (the same caps, the caller's user, environment and
  directory, output in the journal), which outlives the SSH session; its
  ``ExecStopPost`` (``spark-jobs record``, as root) keeps how it ended.
  ``--drop-caches`` (the default with ``jobs_drop_caches``) runs
  spark-drop-caches first; ``jobs_env`` is set for every job.
- ``spark-jobs``: the detached jobs (state, start, memory now and peak, exit
  status), their logs; stops a job of the caller's. ``drain``/``undrain`` (root)
  set and clear ``/var/lib/sparkrig/drain``, while which spark-run starts no job
  (a rollout drains a host before it reboots it).
- ``spark-preflight``: memory, swap, watchdog, stray vLLM/Ray processes, GPU; one
  line per check, the failed checks' codes summed into the exit status.
- ``spark-drop-caches``: ``sync`` and drop the page cache (root only).

``/etc/systemd/system/training.slice`` caps all jobs together; systemd re-reads
it only when it changed. On GB10 the caps count CPU-side memory and page cache,
not CUDA allocations: the watchdog (operations/watchdog/) covers those.

Records of ended detached jobs older than ``jobs_records_max_age`` are removed by
systemd-tmpfiles' daily clean (``/etc/tmpfiles.d/sparkrig-jobs.conf``).

``jobs_model_cache`` (off by default) is a model cache shared by a group: the
directory, root's and the group's (setgid, 2775), the group and its members.
cuda_env exports it as ``HF_HOME``; spark-container mounts it.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "jobs"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "jobs")
