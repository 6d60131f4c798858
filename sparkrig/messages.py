"""What a deploy says on a host, and what it refuses there."""

from __future__ import annotations

from collections.abc import Iterator

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation


def detail(message: str) -> None:
    """Say, under the running operation, what it does on this host. pyinfra shows one name
    per operation for every host, so a name holds nothing that differs between hosts (a
    setting's value, a fact); this line does."""
    logger.info(f"{host.print_prefix}{message}")


def refuse(message: str) -> StringCommand:
    """A command that fails this host's operation with ``message`` on stderr; other
    hosts go on."""
    return StringCommand("echo", QuoteString(f"sparkrig: {message}"), ">&2; exit 1")


@operation()
def refused(message: str) -> Iterator[StringCommand]:
    """
    Fail this host with a message: what sparkrig will not do, and why; other hosts go on.

    + message: printed on the host's stderr, prefixed with ``sparkrig:``
    """
    yield refuse(message)
