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
# stat's %F, its spaces made '_' (the fact's line is split on spaces).
_STAT_KINDS = {
    "regular_file": "file",
    "regular_empty_file": "file",
    "directory": "dir",
    "symbolic_link": "link",
    "fifo": "fifo",
}


class ServingHost(FactBase):
    """
    Returns what each model's directory (or GGUF file) is (``dir``, ``link``, ``fifo``,
    ``file``, ``other``, ``missing``: never followed, never read), the models whose port
    something listens on, whether the probe's timer is enabled, the endpoint unit files on the
    host, and, given ``server`` (llama.cpp's llama-server), what that program and its directory
    are: kind, owner's uid and mode (never followed, never run).

    ``models`` are (name, path, port); a path ``~USER/...`` is under USER's home.

    .. code:: python

        {"models": {"small": "dir"}, "ports_held": ["small"],
         "unit_files": ["spark-serve-small.service"], "probe_timer": True,
         "server": {"kind": "file", "uid": 0, "mode": 0o755},
         "server_dir": {"kind": "dir", "uid": 0, "mode": 0o755}}
    """

    def command(
        self,
        models: Sequence[tuple[str, str, int]] = (),
        unit_prefix: str = "spark-serve-",
        server: str | None = None,
    ) -> StringCommand:
        bits: list = []
        if server:
            # The program and its directory as they are, links not followed (stat's %F of a
            # link is the link's): a program another user may swap is never run.
            directory = server.rsplit("/", 1)[0] or "/"
            for word, path in (("server", server), ("serverdir", directory)):
                bits += [
                    f"echo {word} $(stat -c '%u %a %F' --",
                    _quoted(path),
                    "2>/dev/null | tr ' ' _ | sed 's/_/ /;s/_/ /' || true);",
                ]
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
            elif words[0] in ("server", "serverdir") and len(words) in (1, 4):
                key = "server" if words[0] == "server" else "server_dir"
                if len(words) == 1:
                    found[key] = {"kind": "missing", "uid": None, "mode": None}
                elif words[1].isdigit() and re.fullmatch(r"[0-7]{1,4}", words[2]):
                    kind = _STAT_KINDS.get(words[3], "other")
                    found[key] = {"kind": kind, "uid": int(words[1]), "mode": int(words[2], 8)}
                else:
                    raise ValueError(f"unexpected line {line!r}")
            else:
                raise ValueError(f"unexpected line {line!r}")
        return found

    @staticmethod
    def default() -> dict:
        return {
            "models": {},
            "ports_held": [],
            "unit_files": [],
            "probe_timer": False,
            "server": None,
            "server_dir": None,
        }


def _quoted(text: str) -> str:
    """``text`` single-quoted for sh (settings keep quotes out of paths)."""
    return "'" + text.replace("'", "'\\''") + "'"
