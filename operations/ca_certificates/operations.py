"""Extra CA certificates: the operation that rebuilds the system store."""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import messages


@operation()
def refresh_store(remove: Sequence[str] = ()):
    """
    Rebuild the system CA store from the certificate directories.

    + remove: certificate files to delete first (no longer trusted)

    **Example:**

    .. code:: python

        refresh_store(name="Refresh the CA store", remove=["/usr/local/share/ca-certificates/old.crt"])
    """
    if remove:
        messages.detail(f"no longer trusted: {', '.join(remove)}")
        yield StringCommand("rm", "-f", *[QuoteString(path) for path in remove])
    # --fresh: the links of removed certificates go too.
    yield StringCommand("update-ca-certificates", "--fresh")
