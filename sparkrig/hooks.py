"""What sparkrig adds to a pyinfra run, installed from a ``config.py`` in one call
(``sparkrig.operations.install``, which imports the concerns first so that their settings are
known): every targeted host's settings validated before any connection, every command of
every host run from ``/`` (never the login user's home), each host's deploy lock before its
first change, and the run's one summary line."""

from __future__ import annotations

from .connection import from_slash_on
from .lock import lock_on
from .settings import validate_on_init
from .summary import report_on


def install(state) -> None:
    """Install the four on pyinfra's ``state`` (before it is initialised: from config.py)."""
    validate_on_init(state)
    from_slash_on(state)
    report_on(state)
    lock_on(state)
