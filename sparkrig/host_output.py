"""
A host's output, read with care: it comes from the other side of a trust boundary.

Facts whose output anyone may have written travel base64-encoded (:func:`encoded`,
:func:`decoded`); a fact's parser that cannot read what came back fails that host, with the
reason, never the run (:func:`parses`). Every string a fact's parser returns is checked there
(:func:`checked`): no control character, no byte that is not UTF-8, no string over its length
limit, so what reaches a terminal, a JSON document, a page or a command line is clean by
construction; text meant only to be shown is escaped instead (:func:`printable`).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

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


# Host strings ----------------------------------------------------------------------
# One boundary: a string a host supplies (a version, a device's name, a unit's, a job's) is
# checked where it is parsed. A control character (C0 but tab, DEL, C1), a line or paragraph
# separator, or a byte that is not UTF-8 (a surrogate, as :func:`decoded` keeps it) in it would
# drive the operator's terminal, end a subprocess argument (NUL) or forge a line of a log; a
# string that long is no name or version. Such a string fails its host, naming the field.
TEXT_LIMIT = 4096
_UNCLEAN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class Content(str):
    """A string kept as the host's bytes, to be compared (a file's body, a file's name): its
    line ends (CRLF too), its length (bounded by its reader) and bytes that are not UTF-8 (as
    surrogates) pass :func:`checked`, other control characters do not. Never passed as an
    argument, and shown only through :func:`printable`."""


_UNCLEAN_CONTENT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")  # CRLF files pass


def printable(text: str) -> str:
    """``text`` with every control, format and separator character, and every byte that is
    not UTF-8, escaped (``\\x1b``): for text a host wrote that is only shown."""
    if text.isprintable():  # no C* or Z* character but the space: nothing to escape (most text)
        return text
    return "".join(_escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, as surrogateescape keeps it
        return f"\\x{code - 0xDC00:02x}"
    if unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp"):
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return ch


def text(value: Any, what: str, limit: int = TEXT_LIMIT) -> str:
    """``value``, a string a host supplied, checked: ValueError naming ``what`` when it is no
    string, is longer than ``limit`` or holds a control character or a byte that is not UTF-8."""
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string: {printable(str(value)[:80])}")
    unclean = (_UNCLEAN_CONTENT if isinstance(value, Content) else _UNCLEAN).search(value)
    if unclean:
        raise ValueError(
            f"{what} holds a control character or a byte that is not UTF-8 "
            f"({_escaped(unclean[0])} in '{printable(value[:80])}'): refused"
        )
    if len(value) > limit and not isinstance(value, Content):
        raise ValueError(f"{what} is over {limit} characters ('{printable(value[:80])}'...): refused")
    return value


def checked(value: Any, what: str) -> Any:
    """``value`` (what a fact's parser made of a host's output), every string in it, keys
    included, checked with :func:`text`; ValueError naming ``what`` and where in it."""
    if isinstance(value, str):
        text(value, what)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                text(key, f"{what}: a key")
            checked(item, f"{what}[{printable(str(key))[:80]!r}]")
    elif isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            checked(item, f"{what}[{index}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for each in dataclasses.fields(value):
            checked(getattr(value, each.name), f"{what}.{each.name}")
    return value


def parses(process):
    """A fact's ``process``: output it cannot parse, or a string in what it made of it that
    :func:`checked` refuses, fails this host (pyinfra's FactProcessError, with what went
    wrong), never the run, never silently."""

    @functools.wraps(process)
    def checked_process(self, output):
        try:
            return checked(process(self, output), type(self).__name__)
        except FactProcessError:
            raise
        except (ValueError, LookupError, TypeError, AttributeError, RecursionError) as error:
            why = printable(f"{type(error).__name__}: {str(error)[:200]}")  # it may quote the host
            # Kept for a caller that reports hosts (sparkrig report): pyinfra logs the reason
            # and raises only "No hosts remaining!". A parser run outside any host has none.
            if ctx_host.isset():
                host._sparkrig_fact_error = why
            raise FactProcessError(
                f"sparkrig: {type(self).__name__}: cannot read the host's output ({why}); this host stops here"
            ) from error

    checked_process.sparkrig_checked = True  # tests find every fact's parser wrapped
    return checked_process


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
