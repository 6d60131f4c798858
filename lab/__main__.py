"""Command line of the lab: ``python -m lab up|down|status|ssh NAME [CMD...]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import down, missing_requirements, ssh_config_path, status, up
from .model import FLAVOURS, parse_fleet_spec
from .stack import make_locks
from .system import LabError


def main(argv: list[str] | None = None) -> int:
    """Run one lab command; the process exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="lab: %(message)s", stream=sys.stderr)
    if args.command == "status":
        return _print_status()
    problems = missing_requirements()
    if problems:
        print("lab: cannot run here:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            fleet = parse_fleet_spec(args.hosts) if args.hosts else None
            for host in up(fleet, keep_on_failure=args.keep_on_failure):
                print(f"{host.name}\t{host.flavour}\t{host.address}")
            make_locks()  # the stand-in stack's locks, so that a deploy can follow
            print(f"ssh -F {ssh_config_path()} NAME")
        elif args.command == "down":
            down()
        elif args.command == "try":
            from .tryit import run  # noqa: PLC0415 (pyinfra and pytest only for this command)

            return run(keep=args.keep)
        elif not ssh_config_path().exists():
            print(f"lab: the lab is not up ({ssh_config_path()} is missing)", file=sys.stderr)
            return 1
        else:
            os.execvp("ssh", ["ssh", "-F", str(ssh_config_path()), args.name, *args.remote])
    except (LabError, ValueError) as error:
        print(f"lab: error: {error}", file=sys.stderr)
        return 1
    return 0


def _print_status() -> int:
    hosts = status()
    if not hosts:
        print("lab is down")
    for host in hosts:
        process = "alive" if host["alive"] else "dead"
        ssh = "ok" if host["ssh_ok"] else "failing"
        print(f"{host['name']}\t{host['flavour']}\t{host['address']}\tprocess={process}\tssh={ssh}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description="The local lab: real Debian hosts (systemd-nspawn containers, each in its own "
        "network namespace) that sparkrig deploys to over SSH. Needs root. SPARKRIG_LAB_ID=1-9 "
        "runs a separate lab beside the default one.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    boot = commands.add_parser("up", help="boot a fresh lab (removing leftovers first)")
    boot.add_argument("--hosts", help=f"fleet as NAME:FLAVOUR,... (flavours: {', '.join(FLAVOURS)})")
    boot.add_argument("--keep-on-failure", action="store_true", help="leave a failed lab up to inspect it")
    commands.add_parser("down", help="remove the lab (keeps the image cache and SSH key)")
    trial = commands.add_parser("try", help="boot a fresh lab, converge it twice, prove it, tear it down")
    trial.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    commands.add_parser("status", help="one line per host: process alive? ssh ok?")
    shell = commands.add_parser("ssh", help="ssh to a lab host as the lab user")
    shell.add_argument("name")
    shell.add_argument("remote", nargs=argparse.REMAINDER, help="command to run")
    return parser


if __name__ == "__main__":
    sys.exit(main())
