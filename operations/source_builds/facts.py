"""Source builds: the one fact (:class:`SourceBuilds`) that reads every enabled build's
state on a host, its arguments, and the venv's requirement lines python_stack takes from it."""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output, user_files
from sparkrig.prefix import ARCHIVE, current, installed_dir, installed_stamp
from sparkrig.python_wheels import normalise
from sparkrig.venv import LOCK_LIMIT, STATE_DIR
from sparkrig.wheelhouse import line_prefix

from .catalogue import build_dir, product, stamp_problem, unit_name, wanted, wheelhouse_dir, work_dir

# The most a deploy reads of a host's stamp (its owner can replace it; a stamp is about 1 KB)
# and of a build's result (its exit status).
STAMP_LIMIT = 1 << 20
RESULT_LIMIT = 64


class SourceBuilds(FactBase):
    """
    Returns the state of each source build ``(name, key, prefix)`` on the host, in one command:
    ``built`` (its wheel and stamp are in the wheelhouse), ``running`` (its unit is
    active), ``failed`` (an attempt ended without a wheel: ``result`` holds the build's
    exit status, or None when it never wrote one, as when it was killed) or ``absent``;
    and ``current``: the line of the venv's requirements.lock that starts with ``prefix``
    (the build's wheel the venv holds now, maybe of an earlier ref) while its wheel exists.
    For each prefix build of ``installs`` also ``installed`` (its key, when root's record of
    it is there) and ``link`` (the key ``/opt/sparkrig/builds/NAME/current`` points to).

    .. code:: python

        {"lab-ext": {"state": "built", "unit": "active",
                     "stamp": {"ref": "v1.0", "wheel": "x-1.0-cp38-abi3-linux_x86_64.whl",
                               "sha256": "9f…", "version": "1.0", ...},
                     "result": "0",
                     "current": "x @ file:///var/lib/sparkrig/wheelhouse/lab-ext/af37…/x-1.0-….whl --hash=sha256:9f…"}}
    """

    def command(
        self,
        builds: Sequence[tuple[str, str, str]],
        venv: str,
        installs: Sequence[tuple[str, str]] = (),
    ) -> StringCommand:
        bits: list = ["r=", QuoteString(posixpath.join(venv, STATE_DIR, "requirements.lock")), ";"]
        for name, key in installs:
            # A prefix build: installed (root's record of it, written last) and the link in use.
            bits += [
                "[ -d ",
                QuoteString(installed_dir(name, key)),
                " ] && [ -f ",
                QuoteString(installed_stamp(name, key)),
                " ] && echo ",
                QuoteString(f"installed {name} {key}"),
                ";",
                "l=$(readlink ",
                QuoteString(current(name)),
                '); [ -n "$l" ] && echo "link ',
                name,
                ' $l";',
            ]
        for name, key, prefix in builds:
            n, d, w = QuoteString(name), QuoteString(build_dir(name, key)), QuoteString(wheelhouse_dir(name, key))
            bits += [
                "n=",
                n,
                "; d=",
                d,
                "; w=",
                w,
                "; u=",
                QuoteString(unit_name(name, key)),
                ";",
                'echo "unit $n $(systemctl is-active "$u" 2>/dev/null)";',
                "s=$(",
                user_files.user_read('"$w/stamp.json"', STAMP_LIMIT),
                " | tr -d '\\n');",
                ' [ -n "$s" ] && echo "stamp $n $s";',
                # The owner names the wheelhouse's files and writes the result: each travels as a
                # field (host_output.FIELD), so a newline in it forges no line.
                'for f in "$w"/*.whl "$w"/',
                QuoteString(ARCHIVE),
                '; do [ -f "$f" ] && echo "wheel $n $(printf %s "${f##*/}" | ',
                host_output.FIELD,
                ')"; done;',
                '[ -f "$d/attempt" ] && echo "attempt $n yes";',
                "x=$(",
                user_files.user_read(shlex.quote(f"{work_dir(name, key)}/result"), RESULT_LIMIT),
                " | ",
                host_output.FIELD,
                '); [ -n "$x" ] && echo "result $n $x";',
            ]
            if venv and prefix:
                # The line of this build's wheel in the venv's requirements, if that wheel is there.
                bits += [
                    "c=$(",
                    user_files.user_read('"$r"', LOCK_LIMIT),
                    " | grep -F -- ",
                    QuoteString(prefix),
                    " | head -n 1); p=${c#* @ file://};",
                    ' [ -n "$c" ] && [ -f "${p%% *}" ] && echo "current $n $c";',
                ]
        return host_output.encoded(StringCommand(*bits, "true", _separator=""))

    @staticmethod
    def default() -> dict:
        return {}

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        return self.parse(host_output.decoded(output))

    def parse(self, output: list[str]) -> dict:
        """The reading from the command's decoded lines; ValueError for a stamp that names
        no wheel file (a host's stamp never names a path)."""
        raw: dict[str, dict] = {}
        for line in output:
            kind, _, rest = line.partition(" ")
            name, _, value = rest.partition(" ")
            entry = raw.setdefault(
                name,
                {
                    "unit": None,
                    "stamp": None,
                    "wheels": [],
                    "attempt": False,
                    "result": None,
                    "current": None,
                    "installed": None,
                    "link": None,
                },
            )
            if kind == "unit":
                entry["unit"] = value or None
            elif kind == "stamp":
                try:
                    entry["stamp"] = json.loads(value)
                except ValueError:
                    entry["stamp"] = None
                problem = entry["stamp"] is not None and stamp_problem(entry["stamp"])
                if problem:
                    raise ValueError(f"{wheelhouse_dir(name, '…')}/stamp.json of build {name}: {problem}")
            elif kind == "wheel":
                entry["wheels"].append(host_output.field(value, f"a file name in {wheelhouse_dir(name, '…')}"))
            elif kind == "attempt":
                entry["attempt"] = True
            elif kind == "result":
                entry["result"] = host_output.field(value, f"{work_dir(name, '…')}/result") or None
            elif kind == "current":
                entry["current"] = value or None
            elif kind == "installed":
                entry["installed"] = value
            elif kind == "link":
                entry["link"] = value or None
        found = {}
        for name, entry in raw.items():
            stamp = entry["stamp"]
            if entry["unit"] in ("active", "activating", "deactivating", "reloading"):
                state = "running"
            elif isinstance(stamp, dict) and product(stamp) in entry["wheels"]:
                state = "built"
            elif entry["attempt"] or entry["result"] not in (None, "0"):
                state = "failed"
            else:
                state = "absent"
            found[name] = {
                "state": state,
                "unit": entry["unit"],
                "stamp": stamp if state == "built" else None,
                "result": entry["result"],
                "current": entry["current"],
            }
            if entry["installed"] is not None or entry["link"] is not None:
                # A prefix build: the key root installed, and the one `current` links to.
                found[name].update(installed=entry["installed"], link=entry["link"])
        return found


def fact_arguments(data: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of :class:`SourceBuilds` for a host's enabled builds."""
    builds = wanted(data)
    specs = data["source_builds"]
    arguments: dict[str, Any] = {
        "builds": tuple(
            (name, key, line_prefix(name, specs[name]["package"]) if specs[name]["kind"] == "wheel" else "")
            for name, key in builds.items()
        ),
        "venv": data["python_venv_path"],
    }
    installs = tuple((name, key) for name, key in builds.items() if specs[name]["kind"] == "prefix")
    if installs:
        # Only where a prefix build is enabled: the wheel builds' reading stays as it was.
        arguments["installs"] = installs
    return arguments


def requirement_lines(data: Mapping[str, Any], found: Mapping[str, Any]) -> dict[str, str]:
    """python_stack's requirement line of each enabled build, by the package's normalised
    name: its wheel when the wheelhouse has it, else the wheel the venv holds now (from an
    earlier ref: the venv keeps it until the new one is built), else none."""
    lines = {}
    for name, key in wanted(data).items():
        if data["source_builds"][name]["kind"] != "wheel":
            continue
        entry = found.get(name) or {}
        stamp = entry.get("stamp")
        package = normalise(data["source_builds"][name]["package"])
        if entry.get("state") == "built" and stamp:
            path = f"{wheelhouse_dir(name, key)}/{stamp['wheel']}"
            lines[package] = f"{package} @ file://{path} --hash=sha256:{stamp['sha256']}"
        elif entry.get("current"):
            lines[package] = entry["current"]
    return lines
