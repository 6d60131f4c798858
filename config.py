"""
pyinfra loads this file before it builds the inventory or contacts any host.

sparkrig uses it for two things: every targeted host's settings are validated
before the first connection, so a bad value stops the run with one message
naming the host, the key and what is allowed, and no host is touched; and a
run's first changing command on a host takes that host's deploy lock
(operations/lock.py), so two deploys never change one host at once.
"""

from pyinfra.context import ctx_state

from operations.lock import lock_on
from operations.settings import validate_on_init

validate_on_init(ctx_state.get())
lock_on(ctx_state.get())
