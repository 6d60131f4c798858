"""Serving: what the concern reads from a host besides its files (each model's directory, who
holds each port, the endpoint units on the host)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output

KINDS = ("dir", "link", "fifo", "file", "other", "missing")
_UNIT = re.compile(r"[A-Za-z0-9_.@-]+\.service")
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,47}")


class ServingHost(FactBase):
    """
    Returns what each model's directory is (``dir``, ``link``, ``fifo``, ``file``, ``other``,
    ``missing``: never followed, never read), the models whose port something listens on,
    whether the probe's timer is enabled, and the endpoint unit files on the host.

    ``models`` are (name, path, port); a path ``~USER/...`` is under USER's home.

    .. code:: python

        {"models": {"small": "dir"}, "ports_held": ["small"],
         "unit_files": ["spark-serve-small.service"], "probe_timer": True}
    """

    def command(self, models: Sequence[tuple[str, str, int]] = (), unit_prefix: str = "spark-serve-") -> StringCommand:
        bits: list = []
        for name, path, port in models:
            if path.startswith("~"):
                user, _, rest = path[1:].partition("/")
                bits += [
                    'p="$(getent passwd',
                    QuoteString(user),
                    '| cut -d: -f6)";',
                    'p="$p"/' + _quoted(rest) + ";",
                ]
            else:
                bits += ["p=" + _quoted(path) + ";"]
            n = QuoteString(name)
            bits += [
                'if [ -L "$p" ]; then k=link; elif [ -d "$p" ]; then k=dir; elif [ -p "$p" ]; then k=fifo;',
                'elif [ -f "$p" ]; then k=file; elif [ -e "$p" ]; then k=other; else k=missing; fi;',
                "echo model $k",
                n,
                ";",
                f"[ -z \"$(timeout 5 ss -Hltn 'sport = :{int(port)}' 2>/dev/null)\" ] || echo held",
                n,
                ";",
            ]
        prefix = _quoted(f"/etc/systemd/system/{unit_prefix}")
        bits += [
            f'for f in {prefix}*.service; do [ -f "$f" ] && echo unitfile "${{f##*/}}"; done;',
            "[ -f /etc/systemd/system/sparkrig-serving-probe.timer ] && echo probe;",
        ]
        return StringCommand(*bits, "true")

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found = self.default()
        for line in output:
            words = line.split(" ")
            if words[0] == "model" and len(words) == 3 and words[1] in KINDS and _NAME.fullmatch(words[2]):
                found["models"][words[2]] = words[1]
            elif words[0] == "held" and len(words) == 2 and _NAME.fullmatch(words[1]):
                found["ports_held"].append(words[1])
            elif words[0] == "unitfile" and len(words) == 2 and _UNIT.fullmatch(words[1]):
                found["unit_files"].append(words[1])
            elif line == "probe":
                found["probe_timer"] = True
            else:
                raise ValueError(f"unexpected line {line!r}")
        return found

    @staticmethod
    def default() -> dict:
        return {"models": {}, "ports_held": [], "unit_files": [], "probe_timer": False}


def _quoted(text: str) -> str:
    """``text`` single-quoted for sh (settings keep quotes out of paths)."""
    return "'" + text.replace("'", "'\\''") + "'"
