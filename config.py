"""
pyinfra loads this file before it builds the inventory or contacts any host.

sparkrig uses it for four things: every targeted host's settings are validated
before the first connection, so a bad value stops the run with one message
naming the host, the key and what is allowed, and no host is touched; a run's
first changing command on a host takes that host's deploy lock (sparkrig/lock.py),
so two deploys never change one host at once; every command on every host runs from
`/` (sparkrig/connection.py), never from the login user's home; and the run ends with one line saying
how many hosts changed ("4 hosts, no changes").
"""

from pyinfra.context import ctx_state

from sparkrig.connection import from_slash_on
from sparkrig.lock import lock_on
from sparkrig.settings import validate_on_init
from sparkrig.summary import report_on

validate_on_init(ctx_state.get())
from_slash_on(ctx_state.get())
report_on(ctx_state.get())
lock_on(ctx_state.get())
