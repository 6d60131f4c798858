"""NGC training containers: what the concern reads from a host (Docker's images, the Jupyter
user, its directory and token)."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output

RECIPE_LABEL = "sparkrig.recipe"
TOKEN_DIR = "/var/lib/sparkrig/jupyter"
TOKEN_FILE = f"{TOKEN_DIR}/token"


class NgcHost(FactBase):
    """
    Returns, in one command, what the NGC concern decides from: whether Docker's CLI
    is there, the pinned image's ID (``None``: not present at that digest), the built
    image's ID and recipe label, a user's ``uid:gid`` and home, whether a directory
    exists, and the Jupyter token file's owner, mode and size (``None``: no file).

    .. code:: python

        {"docker": True, "pinned": "sha256:f93e…", "built": {"id": "sha256:1c2d…",
         "recipe": "9f86…"}, "user": {"uid": 1000, "gid": 1000, "home": "/home/spark"},
         "directory": True, "token": {"user": "spark", "mode": 0o600, "size": 64}}
    """

    def command(
        self, pinned: str = "", built: str = "", user: str = "", directory: str = "", token: str = TOKEN_FILE
    ) -> StringCommand:
        bits: list = ["command -v docker >/dev/null && echo docker=1;"]
        if pinned:
            bits += [
                "docker image inspect --format",
                QuoteString("pinned={{.Id}}"),
                QuoteString(pinned),
                "2>/dev/null;",
            ]
        if built:
            label = '{{index .Config.Labels "' + RECIPE_LABEL + '"}}'
            bits += [
                "docker image inspect --format",
                QuoteString(f"built={{{{.Id}}}} {label}"),
                QuoteString(built),
                "2>/dev/null;",
            ]
        if user:
            bits += ["echo user=$(getent passwd", QuoteString(user), "| cut -d: -f3,4,6);"]
        if directory:
            bits += ["[ -d", QuoteString(directory), "] && echo directory=1;"]
        bits += ["[ -f", QuoteString(token), "] && echo token=$(stat -c '%U %a %s'", QuoteString(token), ");", "true"]
        return StringCommand(*bits)

    @host_output.parses
    def process(self, output: list[str]):
        values = {}
        for line in output:
            key, _, value = line.partition("=")
            values[key] = value.strip()
        built = values.get("built", "").split()
        user = values.get("user", "").split(":")
        token = values.get("token", "").split()
        return {
            "docker": values.get("docker") == "1",
            "pinned": values.get("pinned") or None,
            "built": {"id": built[0], "recipe": built[1] if len(built) > 1 else ""} if built else None,
            "user": {"uid": int(user[0]), "gid": int(user[1]), "home": user[2]} if len(user) == 3 else None,
            "directory": values.get("directory") == "1",
            "token": {"user": token[0], "mode": int(token[1], 8), "size": int(token[2])} if len(token) == 3 else None,
        }
