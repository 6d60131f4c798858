"""
The one command line, ``sparkrig COMMAND``: each module of :mod:`sparkrig.tools` that is a
command registers itself here (:func:`command`), and ``sparkrig --help`` lists every one with
its line. Each command's ``--help`` prints its module's whole docstring and the exit statuses
every command shares (:data:`EXIT_STATUSES`).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkrig.tools.inventory import InventoryError

# What every command's exit status means (a command says where it adds its own).
OK, FAILED, USAGE, BAD_INPUT = 0, 1, 2, 4
EXIT_STATUSES = (
    (OK, "done, nothing failed"),
    (FAILED, "something failed: a control, a host, a stale file"),
    (USAGE, "the command line is wrong (one line says what)"),
    (BAD_INPUT, "an input file is refused: an inventory or its settings, a waivers file, a results document"),
)


def statuses(own: Sequence[tuple[int, str]] = ()) -> str:
    """The exit statuses, one a line: every command's, and a command's ``own``."""
    rows = sorted({**dict(EXIT_STATUSES), **dict(own)}.items())
    return "exit status:\n" + "\n".join(f"  {code:<3} {meaning}" for code, meaning in rows)


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    main: Callable[[Sequence[str] | None], int]


COMMANDS: dict[str, Command] = {}


def command(name: str, summary: str):
    """Register the decorated ``main(argv) -> exit status`` as ``sparkrig NAME``, ``summary``
    its line in ``sparkrig --help``."""

    def register(main: Callable[[Sequence[str] | None], int]):
        COMMANDS[name] = Command(name, summary, main)
        return main

    return register


def parser(name: str, doc: str | None, own: Sequence[tuple[int, str]] = ()) -> argparse.ArgumentParser:
    """A command's parser: its whole module docstring as the description (as written), the
    exit statuses (every command's, and ``own``: the command's) after the options."""
    return argparse.ArgumentParser(
        prog=f"sparkrig {name}",
        description=(doc or "").strip(),
        epilog=statuses(own),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def answer(name: str, run: Callable[[], int]) -> int:
    """``run()``'s exit status, its refusals one line each: an input file refused
    (:class:`InventoryError`: exit 4), a value of the command line refused (ValueError: exit 2)."""
    try:
        return run()
    except InventoryError as error:
        print(f"{name}: {error.line}", file=sys.stderr)
        return BAD_INPUT
    except ValueError as error:
        print(f"{name}: {error}", file=sys.stderr)
        return USAGE


def discover() -> dict[str, Command]:
    """Every command: each module of this package imported, which registers its own."""
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "__main__":
            importlib.import_module(f"{__package__}.{module.name}")
    return dict(sorted(COMMANDS.items()))
