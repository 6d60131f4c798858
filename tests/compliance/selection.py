"""
What a pytest command line selects of the suite, read from its options alone: the suite's
conftest decides on it whether workers start, and ``sparkrig check`` (before pytest loads the
suite) which of pytest's own per-control work a read-only run can leave out.
"""

from __future__ import annotations

from collections.abc import Sequence

from _pytest.mark.expression import Expression


def read_only_selection(markexpr: str) -> bool:
    """Whether ``-m markexpr`` leaves out every control marked action (``-m read``, ``-m "not
    action"``): those controls read the prefetch, and workers would only cost their start."""
    if not markexpr:
        return False
    expression = Expression.compile(markexpr)
    # An action control's markers: action, and lab against the lab.
    return not any(
        expression.evaluate(lambda name, marks=marks, **_kwargs: name in marks)
        for marks in ({"action"}, {"action", "lab"})
    )


def markexpr(args: Sequence[str]) -> str:
    """The ``-m`` of a pytest command line (``-m EXPR`` or ``-mEXPR``; the last one wins, as in
    pytest); empty where there is none."""
    found, args = "", list(args)
    for index, arg in enumerate(args):
        if arg == "-m" and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith("-m") and len(arg) > 2:
            found = arg[2:]
    return found


def read_only_options(args: Sequence[str]) -> list[str]:
    """pytest options a read-only selection (``args``, pytest's command line) runs lighter with:
    no log capture (no control logs) and output captured at Python's level rather than the file
    descriptors' (a read-only control starts no process: it reads the prefetch). pytest does
    both for every phase of every control: about a tenth of the controller's CPU per host
    (docs/performance.md). Nothing where the selection acts, or where ``args`` set either."""
    if not read_only_selection(markexpr(args)):
        return []
    out = []
    if not any(arg == "-s" or arg.startswith("--capture") for arg in args):
        out.append("--capture=sys")
    if not any(arg.startswith("--log") or "log_" in arg for arg in args):
        out += ["-p", "no:logging"]
    return out
