"""
``sparkrig COMMAND [ARGS]``: the wheel's console script (``uv run sparkrig`` in a checkout,
``python -m sparkrig.tools`` alike).

    sparkrig lock [--check]      the Python stack's locks (sparkrig.tools.python_lock)
    sparkrig report INVENTORY    each box's versions (sparkrig.tools.report)
    sparkrig rollout INVENTORY   the deploy batch by batch, each proven (sparkrig.tools.rollout)
    sparkrig reference [--check] the generated docs (sparkrig.tools.reference)

rollout and reference need a checkout (its deploy.py, compliance suite and docs): from an
installed wheel they say so and exit 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# Each command: its module, and whether it needs the checkout beside the tools.
COMMANDS = {
    "lock": ("python_lock", False),
    "report": ("report", False),
    "rollout": ("rollout", True),
    "reference": ("reference", True),
}
USAGE = f"usage: sparkrig {{{','.join(COMMANDS)}}} [ARGS] (sparkrig COMMAND --help)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        print(
            USAGE if not args or args[0] in ("-h", "--help") else f"sparkrig: no command {args[0]!r}; {USAGE}",
            file=sys.stderr,
        )
        return 0 if args and args[0] in ("-h", "--help") else 2
    name, needs_checkout = COMMANDS[args[0]]
    module = importlib.import_module(f"{__package__}.{name}")
    if needs_checkout:
        from sparkrig.tools.rollout import REPO, in_checkout  # noqa: PLC0415 (the command's module first)

        if not in_checkout():
            print(
                f"sparkrig {args[0]}: runs from a sparkrig checkout (its deploy.py, tests/compliance/ and "
                f"docs/), and this one is installed from the wheel ({REPO}): run `uv run sparkrig {args[0]}` "
                "in a clone of the repository",
                file=sys.stderr,
            )
            return 2
    if name == "report":
        # As pyinfra's CLI does: the hosts are read concurrently on gevent.
        from gevent import monkey  # noqa: PLC0415

        monkey.patch_all()
    return module.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
