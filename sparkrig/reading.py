"""
One reading per host: every concern's facts, read in one remote command.

pyinfra runs one command per ``host.get_fact`` call, and a deploy of eleven concerns
asked for 12 to 15 of them on a converged host, each paying a round trip. Here each
concern declares, from its settings alone, the facts it will read (``reads(settings)``,
a list of :func:`part`); the first :func:`get` on a host runs all of them in one command,
:class:`Reading`, and every later :func:`get` of a planned part is answered from it. A
part nobody planned is still read (with every planned part not read yet), so a missing
declaration costs one command, never a wrong answer.

Each part keeps its fact's own command and parser: :mod:`sparkrig.parts` runs the parts
side by side, each alone with its own output files, time and byte limits, and only once
all have ended prints each part's status, output and standard error, length-delimited and
base64-encoded: no part can write into another's answer, end the reading early or hold it
open, and no byte a host prints can cut the output short. A part that exits non-zero, runs
out of time or bytes, or whose output its parser refuses, fails that host with the part's
name and the reason, as pyinfra fails a host whose fact cannot be read; other hosts go on.

.. code:: python

    STATE = reading.part(atomic.HostState, paths=(DROP_IN,), units=(SERVICE,))

    @reading.planner
    def reads(settings):  # every setting resolved, defaults included
        return [STATE]

    state = reading.value(STATE)  # in the @deploy: no command when it was planned
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from gevent.lock import BoundedSemaphore
from pyinfra import host
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from . import host_output
from . import parts as sparkrig_parts
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

    def command(self, parts: Sequence[Part]) -> StringCommand:
        commands = [each.fact().command(**dict(each.kwargs)) for each in parts]
        return StringCommand(sparkrig_parts.script(commands, [timeout_of(each) for each in parts]))

    def process(self, output: list[str]) -> dict[Part, Any]:
        raise NotImplementedError("a Reading is made for its parts by reading_of()")


def timeout_of(each: Part) -> int:
    """How long the part's command may run: its fact's ``reading_timeout_s``, else
    :data:`sparkrig.parts.PART_TIMEOUT_S`."""
    return int(getattr(each.fact, "reading_timeout_s", sparkrig_parts.PART_TIMEOUT_S))


def split(parts: Sequence[Part], output: Sequence[str]) -> dict[Part, Any]:
    """Each part's value from the reading's output; FactProcessError naming the part when
    one failed, ran out of time or bytes, printed what its parser refuses, or is missing;
    ValueError when the output is not the reading's structure (sparkrig.parts.parse)."""
    answers = sparkrig_parts.parse(output, len(parts))
    values: dict[Part, Any] = {}
    for each, answer in zip(parts, answers):
        name = each.describe()
        said = answer.stderr.decode("utf-8", "replace").replace("\n", "; ").strip("; ")[:500] or "nothing on stderr"
        why = sparkrig_parts.failure(answer, timeout_of(each))
        if why:
            raise FactProcessError(f"sparkrig: reading {name}: {why} ({said}); this host stops here")
        if answer.status != 0:
            raise FactProcessError(
                f"sparkrig: reading {name} failed (exit {answer.status}: {said}); this host stops here"
            )
        text = answer.stdout.decode("utf-8", "surrogateescape")
        lines = text.split("\n")
        lines = lines[:-1] if lines[-1] == "" else lines
        fact = each.fact()
        try:
            values[each] = fact.process(lines) if lines else fact.default()
        except FactProcessError as error:
            raise FactProcessError(f"sparkrig: reading {name}: {error}") from error
        except (ValueError, LookupError, TypeError, AttributeError, RecursionError) as error:
            raise FactProcessError(
                f"sparkrig: reading {name}: its output is refused ({type(error).__name__}: {str(error)[:200]});"
                " this host stops here"
            ) from error
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
    value = host.get_fact(reading_of(parts), parts=tuple(parts))
    if host_output.fact_failed() or not value:
        return {each: each.fact().default() for each in parts}
    return value


def reading_of(parts: Sequence[Part]) -> type[Reading]:
    """The :class:`Reading` of these parts: its parser knows them."""

    class ThisReading(Reading):
        @host_output.parses
        def process(self, output):
            return split(parts, output)

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
