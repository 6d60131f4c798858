"""
One reading per host: every concern's facts, read in one remote command.

pyinfra runs one command per ``host.get_fact`` call, and a deploy of eleven concerns
asked for 12 to 15 of them on a converged host, each paying a round trip. Here each
concern declares, from its settings alone, the facts it will read (``reads(settings)``,
a list of :func:`part`); the first :func:`get` on a host runs all of them in one command,
:class:`Reading`, and every later :func:`get` of a planned part is answered from it. A
part nobody planned is still read (with every planned part not read yet), so a missing
declaration costs one command, never a wrong answer.

Each part keeps its fact's own command and parser: the reading runs the parts one after
another, each in a subshell whose output and standard error are tagged with the part's
index, and sends the whole base64-encoded (so no byte a host prints can cut the output
short, see :mod:`sparkrig.atomic`). A part that exits non-zero, or whose output its parser
refuses, fails that host with the part's name and what it printed, as pyinfra fails a
host whose fact cannot be read; other hosts go on.

.. code:: python

    STATE = reading.part(atomic.HostState, paths=(DROP_IN,), units=(SERVICE,))

    @reading.planner
    def reads(settings):  # every setting resolved, defaults included
        return [STATE]

    state = reading.value(STATE)  # in the @deploy: no command when it was planned
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from gevent.lock import BoundedSemaphore
from pyinfra import host
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from . import host_output
from .settings import all_settings, resolve


class Part(NamedTuple):
    """One fact and its arguments (hashable: lists become tuples)."""

    fact: type
    kwargs: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.kwargs)
        return f"{self.fact.__name__}({arguments})"[:300]


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def part(fact: type, **kwargs: Any) -> Part:
    """The fact ``fact`` with these arguments, as a concern's ``reads`` declares it."""
    return Part(fact, tuple(sorted((key, _frozen(value)) for key, value in kwargs.items())))


class Reading(FactBase):
    """
    Returns the value of each part (a :class:`Part`: a fact and its arguments), read in one
    command: a mapping from part to what the fact's own ``process`` made of its output
    (its ``default()`` where it printed nothing).

    .. code:: python

        {Part(HostState, (("paths", ("/etc/default/earlyoom",)),)): {"files": {...}, ...}}
    """

    def command(self, parts: Sequence[Part], nonce: str) -> StringCommand:
        bits: list = []
        for index, each in enumerate(parts):
            command = each.fact().command(**dict(each.kwargs))
            if isinstance(command, str):
                command = StringCommand(command)
            tag = f"@@{nonce}"
            # stdout to fd 3 untouched; stderr tagged, merged into stdout.
            bits += [
                "{ { (",
                command,
                f"); echo {tag} end {index} $?; }} 2>&1 1>&3 | sed 's/^/{tag} err {index} /';",
                "} 3>&1;",
            ]
        return host_output.encoded(*bits)

    def process(self, output: list[str]) -> dict[Part, Any]:
        raise NotImplementedError("a Reading is made for its parts by reading_of()")


def split(parts: Sequence[Part], nonce: str, output: Sequence[str]) -> dict[Part, Any]:
    """Each part's value from the reading's output; FactProcessError naming the part when
    one failed, printed what its parser refuses, or is missing."""
    tag = f"@@{nonce} "
    lines = host_output.decoded(output)
    stdout: dict[int, list[str]] = {i: [] for i in range(len(parts))}
    stderr: dict[int, list[str]] = {i: [] for i in range(len(parts))}
    status: dict[int, int] = {}
    current = 0
    for line in lines:
        if line.startswith(tag):
            kind, index, rest = (line[len(tag) :].split(" ", 2) + [""])[:3]
            index = int(index)
            if index not in stdout:
                raise ValueError(f"a part index out of range: {index}")
            if kind == "end":
                status[index] = int(rest)
                current = index + 1
            elif kind == "err":
                stderr[index].append(rest)
            else:
                raise ValueError(f"unknown tag {kind!r}")
        else:
            if current >= len(parts):
                raise ValueError("output after the last part")
            stdout[current].append(line)
    values: dict[Part, Any] = {}
    for index, each in enumerate(parts):
        name = each.describe()
        if index not in status:
            raise FactProcessError(f"sparkrig: the reading of {name} never ended; this host stops here")
        if status[index] != 0:
            said = "; ".join(stderr[index])[:500] or "nothing on stderr"
            raise FactProcessError(
                f"sparkrig: reading {name} failed (exit {status[index]}: {said}); this host stops here"
            )
        fact = each.fact()
        values[each] = fact.process(stdout[index]) if stdout[index] else fact.default()
    return values


Planner = Callable[[Mapping[str, Any]], Iterable[Part]]
_PLANNERS: list[Planner] = []
# The concerns' packages in deploy order (sparkrig.operations.CONCERNS, which tells it): the
# planners run in this order whatever order their modules were imported in.
_ORDER: list[str] = []


def order(packages: Iterable[str]) -> None:
    """Set the order of the planners: a planner of module ``packages[i]`` or below runs
    after those of ``packages[:i]``; the shared layer's (a box's identity) first."""
    _ORDER[:] = list(packages)


def _rank(function: Planner) -> int:
    module = function.__module__
    for index, package in enumerate(_ORDER):
        if module == package or module.startswith(package + "."):
            return index + 1
    return 0  # the shared layer's, or a user's own module


def planner(function: Planner) -> Planner:
    """Register a concern's ``reads(settings)``: the parts it will :func:`get` on a host
    with these settings (every setting resolved, defaults included; ``hardware_profile``
    as the host's data says it, possibly ``"auto"``: the reading is what resolves it)."""
    _PLANNERS.append(function)
    return function


def planners() -> list[Planner]:
    """The registered planners in deploy order (stable: import order breaks ties)."""
    return sorted(_PLANNERS, key=_rank)


def planned(settings: Mapping[str, Any]) -> list[Part]:
    """Every registered concern's parts for a host with these settings, in order, once each."""
    found: dict[Part, None] = {}
    for function in planners():
        for each in function(settings):
            found.setdefault(each, None)
    return list(found)


def _host_settings() -> dict[str, Any]:
    return resolve(all_settings(), host.data.dict())


def _memo() -> dict[Part, Any]:
    memo = getattr(host, "_sparkrig_reading", None)
    if memo is None:
        memo = {}
        host._sparkrig_reading = memo
    return memo


def read(parts: Sequence[Part]) -> dict[Part, Any]:
    """Read ``parts`` on the current host now, in one command (no memo)."""
    fact_class = reading_of(parts)
    value = host.get_fact(fact_class, parts=tuple(parts), nonce=fact_class.nonce)
    if host_output.fact_failed() or not value:
        return {each: each.fact().default() for each in parts}
    return value


def reading_of(parts: Sequence[Part], nonce: str | None = None) -> type[Reading]:
    """The :class:`Reading` of these parts: its parser knows them and this run's nonce
    (the tag that separates them, which no host can know in advance)."""
    chosen = nonce or secrets.token_hex(8)

    class ThisReading(Reading):
        nonce = chosen

        @host_output.parses
        def process(self, output):
            return split(parts, chosen, output)

    ThisReading.__name__ = ThisReading.__qualname__ = "Reading"
    ThisReading.name = f"{__name__}.Reading"  # how pyinfra names it in its messages
    return ThisReading


def _reading_lock() -> BoundedSemaphore:
    lock = getattr(host, "_sparkrig_reading_lock", None)
    if lock is None:
        lock = host._sparkrig_reading_lock = BoundedSemaphore()
    return lock


def value(wanted: Part) -> Any:
    """The part's value on the current host, from its one reading (read now, with every
    planned part, if it was not read yet). The fact's ``default()`` when this host failed.

    pyinfra runs each host's deploy code in a greenlet of its own: a concern that reads
    another host (a cluster's peers, operations/cluster/) waits for that host's reading
    under way instead of making a second one."""
    memo = _memo()
    if wanted not in memo:
        with _reading_lock():
            if wanted not in memo:
                pending = [wanted] + [each for each in planned(_host_settings()) if each not in memo and each != wanted]
                memo.update(read(pending))
    return memo[wanted]


def get(fact_class: type, **kwargs: Any) -> Any:
    """:func:`value` of ``part(fact_class, **kwargs)``."""
    return value(part(fact_class, **kwargs))


def fact(fact_class: type, **kwargs: Any) -> Any:
    """:func:`get`, or None when this host has failed (a reading could not be made of it,
    and pyinfra said why): the caller then does nothing more on it."""
    found = get(fact_class, **kwargs)
    return None if host_output.fact_failed() else found
