"""
pyinfra loads this file before it builds the inventory or contacts any host.

sparkrig uses it for one thing: every targeted host's settings are validated
before the first connection, so a bad value stops the run with one message
naming the host, the key and what is allowed, and no host is touched.
"""

from pyinfra.context import ctx_state

from operations.settings import validate_on_init

validate_on_init(ctx_state.get())
