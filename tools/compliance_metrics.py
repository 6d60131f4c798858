"""
Each host's last compliance outcome, pushed to where its metrics collector serves it.

    sparkrig metrics-push RESULTS.json INVENTORY [--limit GROUP_OR_HOST]
    sparkrig metrics-push RESULTS.json --print HOST

RESULTS.json is a document of the compliance suite's ``--results DIR`` (``sparkrig check
--results DIR``; sparkrig.compliance.results). For each host of it under INVENTORY (and
--limit), its lines are written, as root and atomically (a temporary file beside it, then
renamed), to /var/lib/sparkrig/compliance-last, the file the metrics concern's collector reads
(docs/metrics.md): one line per concern, ``CONCERN PASSED FAILED EPOCH``: the concern (the
control's module, ``test_swap.py`` -> ``swap``), its controls that passed (a waived failure
counts as passed: the owner accepted it), those that failed or broke, and when the run ended.
Skipped controls count in neither. The collector (templates/metrics/sparkrig-metrics.sh.j2)
serves them as ``sparkrig_compliance_controls`` and
``sparkrig_compliance_last_run_timestamp_seconds``. ``--print HOST`` prints one host's lines
instead of pushing them. ``sparkrig check --metrics-push`` and ``sparkrig rollout
--metrics-push`` push after each run.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from sparkrig.operations.metrics.deploy import COMPLIANCE_FILE
from sparkrig.tools import cli
from sparkrig.tools.inventory import PYINFRA, REPO, limit_hosts, read_inventory
from sparkrig.tools.rollout_reboot import HostError, PyinfraHosts

SCHEMA = "sparkrig.compliance.results/1"  # sparkrig.compliance.results's
_MODULE = re.compile(r"test_([a-z_]{1,40})\.py")
COUNTS = {"passed": "passed", "waived": "passed", "failed": "failed", "error": "failed"}


def checked(document) -> dict:
    """``document``, or ValueError when it is not a results document."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"not a compliance results document ({SCHEMA})")
    return document


def lines(document: dict, host: str) -> str:
    """The host's lines, sorted by concern; ValueError when the document is not a results
    document or does not name the host."""
    found = (checked(document).get("hosts") or {}).get(host)
    if not isinstance(found, dict):
        raise ValueError(f"the document has no host {host!r}")
    ended = int(datetime.fromisoformat(document["finished"]).timestamp())
    counts: dict[str, dict[str, int]] = {}
    for control in found.get("controls") or []:
        module = _MODULE.fullmatch(str(control.get("id", "")).split("::", 1)[0])
        outcome = COUNTS.get(control.get("outcome"))
        if module and outcome:
            counts.setdefault(module[1], {"passed": 0, "failed": 0})[outcome] += 1
    return "".join(f"{concern} {c['passed']} {c['failed']} {ended}\n" for concern, c in sorted(counts.items()))


def push_command(text: str, path: str = COMPLIANCE_FILE) -> str:
    """The root shell command that puts ``text`` at ``path``: written to a temporary file in
    the same directory, made 0644, then renamed over the old one, so the collector reads the
    old lines or the new, never half of them. The directory must be root's alone (no link, no
    other owner, nobody else may write it): the collector trusts the file as root's."""
    directory = str(Path(path).parent)
    return (
        f"d={shlex.quote(directory)}; "
        '[ -d "$d" ] && [ ! -L "$d" ] && [ "$(stat -c %u "$d")" = 0 ] && '
        '[ -z "$(find "$d" -maxdepth 0 -perm /022)" ] || '
        '{ echo "sparkrig: $d is missing or not root-only: deploy the metrics concern first" >&2; exit 1; }; '
        f't=$(mktemp "$d/.{Path(path).name}.XXXXXX") || exit 1; '
        f'printf %s {shlex.quote(text)} > "$t" && chmod 0644 "$t" && mv -f "$t" {shlex.quote(path)} '
        '|| { rm -f "$t"; exit 1; }'
    )


def push(document: dict, hosts: Sequence[str], remote: PyinfraHosts) -> dict[str, str]:
    """Each host's lines pushed; the hosts that failed, each with why."""
    failed = {}
    for host in hosts:
        try:
            remote.root(host, push_command(lines(document, host)))
        except (HostError, ValueError) as error:
            failed[host] = str(error)
    return failed


def push_document(path: Path, inventory: str, limit: Sequence[str] = (), project: Path | None = None) -> int:
    """Push the hosts of the document at ``path`` under ``inventory`` and ``limit``; the exit
    status. An inventory pyinfra cannot load raises InventoryError, a --limit that matches
    nothing ValueError (:func:`sparkrig.tools.cli.answer` says them)."""
    try:
        document = checked(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as error:
        print(f"metrics-push: {path}: {error}", file=sys.stderr)
        return cli.BAD_INPUT
    loaded = read_inventory(inventory, cwd=project)
    chosen = limit_hosts({h["name"]: h["groups"] for h in loaded}, limit)
    hosts = [h for h in chosen if h in (document.get("hosts") or {})]
    failed = push(document, hosts, PyinfraHosts(PYINFRA, str(project or REPO), str(Path(inventory).resolve())))
    for host in hosts:
        print(
            f"metrics-push: {host}: " + (f"failed: {failed[host]}" if host in failed else COMPLIANCE_FILE),
            file=sys.stderr,
        )
    return cli.FAILED if failed else cli.OK


@cli.command("metrics-push", "each host's last compliance outcome to its metrics collector (from check --results)")
def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("metrics-push", __doc__)
    parser.add_argument("results", metavar="RESULTS.json", help="a document of sparkrig check --results DIR")
    parser.add_argument("inventory", nargs="?", help="a pyinfra inventory naming the document's hosts")
    parser.add_argument("--limit", action="append", default=[], help="only these hosts, as pyinfra's --limit")
    parser.add_argument("--print", metavar="HOST", dest="print_host", help="print HOST's lines; push nothing")
    args = parser.parse_args(argv)
    if args.print_host:
        try:
            sys.stdout.write(lines(json.loads(Path(args.results).read_text()), args.print_host))
        except (OSError, ValueError, KeyError) as error:
            print(f"metrics-push: {args.results}: {error}", file=sys.stderr)
            return cli.BAD_INPUT
        return cli.OK
    if not args.inventory:
        parser.error("an INVENTORY to push to, or --print HOST")
    return cli.answer("metrics-push", lambda: push_document(Path(args.results), args.inventory, args.limit))


if __name__ == "__main__":
    sys.exit(main())
