"""
``sparkrig COMMAND [ARGS]``: the wheel's console script (``uv run sparkrig`` in a checkout,
``python -m sparkrig.tools`` alike). ``sparkrig --help`` lists the commands, each registered by
its own module (sparkrig.tools.cli); ``sparkrig COMMAND --help`` says all of one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sparkrig.tools import cli


def top_parser(commands: dict[str, cli.Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkrig",
        description="sparkrig: configure NVIDIA DGX Spark machines with pyinfra, prove them with the compliance suite.",
        epilog="`sparkrig COMMAND --help` says all of one command.\n\n" + cli.statuses(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, command in commands.items():
        subparsers.add_parser(name, help=command.summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = cli.discover()
    parser = top_parser(commands)
    if not args:
        parser.print_help(sys.stderr)
        return cli.USAGE
    if args[0] not in commands:
        try:  # --help (exit 0), or argparse's one line naming the wrong word (exit 2)
            parser.parse_args(args)
        except SystemExit as stop:
            return int(stop.code or 0)
        return cli.USAGE
    return commands[args[0]].main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
