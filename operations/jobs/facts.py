"""Job wrappers: what the concern reads from a host besides its files (the shared model cache)."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output


class ModelCache(FactBase):
    """
    Returns the shared model cache directory (mode, owner, group; ``"link"`` when it is a
    symbolic link, ``None`` when missing) and its group (``None`` when missing).

    .. code:: python

        {"directory": {"mode": 0o2775, "user": "root", "group": "sparkrig-models"},
         "group": {"gid": 998, "members": ["spark"]}}
    """

    def command(self, path: str, group: str) -> StringCommand:
        q, g = QuoteString(path), QuoteString(group)
        return StringCommand(
            "if [ -L",
            q,
            "]; then echo link; elif [ -d",
            q,
            "]; then echo dir $(stat -c '%a %U %G'",
            q,
            ");",
            "else echo nodir; fi; echo group $(getent group",
            g,
            "|| true)",
        )

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found: dict = {"directory": None, "group": None}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "link":
                found["directory"] = "link"
            elif kind == "dir":
                mode, user, group = rest.split(" ")
                found["directory"] = {"mode": int(mode, 8), "user": user, "group": group}
            elif kind == "group" and rest:
                _name, _x, gid, members = rest.split(":")
                found["group"] = {"gid": int(gid), "members": [m for m in members.split(",") if m]}
            elif kind not in ("nodir", "group"):
                raise ValueError(f"unexpected line {line!r}")
        return found

    @staticmethod
    def default() -> dict:
        return {"directory": None, "group": None}
