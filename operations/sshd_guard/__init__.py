"""
SSH guard: sshd keeps running under memory pressure, and SSH sessions stay killable.

sshd already protects its own listener (it sets its oom_score_adj to -1000) and, after
each fork, gives the session back the value it inherited from its unit. So the unit's
``OOMScoreAdjust`` must NOT be -1000, as hand-written guides set it: every SSH session,
and every training job started from one, would become unkillable. This concern writes
a drop-in for the unit that really runs sshd (``ssh.service``, also when ``ssh.socket``
starts it) that sets ``OOMScoreAdjust=0`` and reserves memory with ``MemoryMin``, plus
the matching reservation on ``system.slice`` without which ``MemoryMin`` has no effect.
Both are checked with ``systemd-analyze verify`` before they take effect; sshd is
restarted only when they changed and only after ``sshd -t`` passes, and a new SSH
connection is proven to work before the deploy goes on.
"""

from sparkrig.operations import deploy_on_demand

from .settings import SETTINGS

__all__ = ["SETTINGS", "sshd_guard"]
# The deploy (and the facts and operations it imports) only when asked for: a concern that
# reads this one's settings imports them alone.
__getattr__ = deploy_on_demand(__name__, "sshd_guard")
