"""
A host's output, read with care: it comes from the other side of a trust boundary.

Facts whose output anyone may have written travel base64-encoded (:func:`encoded`,
:func:`decoded`); a fact's parser that cannot read what came back fails that host, with the
reason, never the run (:func:`parses`).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import FactProcessError
from pyinfra.context import ctx_host

# Host output ----------------------------------------------------------------------
# A host's output is data from the other side of a trust boundary. pyinfra stops reading a
# command's output at its first byte that is not UTF-8 (the rest is lost without a word), so
# a fact that reads bytes anyone may have written (file contents and names) has its output
# sent base64-encoded, ending in END: what arrives is complete or is refused.
END = "sparkrig-end"


def encoded(*bits) -> StringCommand:
    """A fact's command whose standard output travels base64-encoded on one line, then END."""
    return StringCommand("{", *bits, "\n} | base64 -w0; echo; echo", END)


def decoded(output: Sequence[str]) -> list[str]:
    """The lines a command of :func:`encoded` printed (bytes that are not UTF-8 kept as
    surrogates, as ``os.fsdecode`` keeps them); ValueError when the output is incomplete."""
    if len(output) != 2 or output[1] != END:
        raise ValueError(f"expected one base64 line and {END}, got {len(output)} lines")
    text = base64.b64decode(output[0], validate=True).decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


# A field a user wrote (a file's name, a file's contents) travels base64-encoded inside its
# line: `... | base64 -w0` on the host (FIELD), :func:`field` here. A newline in it can then
# never start a line of its own (a forged `record` or `installed` line), and a field holding
# a newline or NUL is refused, naming the file: that host fails, with the reason.
FIELD = "base64 -w0"


def field(value: str, what: str) -> str:
    """A field of :data:`FIELD` as the host sent it: its text (one final newline, as the
    tools that print it end, dropped); ValueError naming ``what`` (its file) when it holds a
    newline or NUL byte, or is not base64."""
    try:
        text = base64.b64decode(value, validate=True).decode("utf-8", "surrogateescape")
    except ValueError as error:
        raise ValueError(f"{what}: not a field of sparkrig's ({error})") from None
    text = text.removesuffix("\n")
    if "\n" in text or "\0" in text:
        raise ValueError(f"{what} holds a newline or NUL byte ({text[:80]!r}): refused, a field is one line")
    return text


def parses(process):
    """A fact's ``process``: output it cannot parse fails this host (pyinfra's
    FactProcessError, with what went wrong), never the run, never silently."""

    @functools.wraps(process)
    def checked(self, output):
        try:
            return process(self, output)
        except FactProcessError:
            raise
        except (ValueError, LookupError, TypeError, AttributeError, RecursionError) as error:
            why = f"{type(error).__name__}: {str(error)[:200]}"
            # Kept for a caller that reports hosts (sparkrig report): pyinfra logs the reason
            # and raises only "No hosts remaining!". A parser run outside any host has none.
            if ctx_host.isset():
                host._sparkrig_fact_error = why
            raise FactProcessError(
                f"sparkrig: {type(self).__name__}: cannot read the host's output ({why}); this host stops here"
            ) from error

    return checked


def failure() -> str | None:
    """Why a fact of :func:`parses` failed this host, where one did (else None)."""
    return getattr(host, "_sparkrig_fact_error", None)


def fact_failed() -> bool:
    """Whether this host has failed (a fact could not read it, and pyinfra said why)."""
    return host.name in {failed_host.name for failed_host in host.state.failed_hosts}


def direct_fact(cls, **kwargs):
    """``host.get_fact(cls, **kwargs)``, asked of the host directly (not through the one
    reading, :func:`sparkrig.reading.fact`), or None when it failed this host (pyinfra has
    said why): the caller then does nothing more on it."""
    value = host.get_fact(cls, **kwargs)
    return None if fact_failed() else value
