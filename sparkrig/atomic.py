"""
Atomic, validated file writes: the one way sparkrig puts a file on a host.

The new content is uploaded beside its destination (same directory, so the
final ``mv`` is an atomic rename), given its owner and mode, validated with a
command of the caller's choosing, and only then renamed over the old file (a
copy of which may be kept as a backup). A file whose content, owner and mode
already match costs one remote command and changes nothing.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, FileUploadCommand, QuoteString, StringCommand, operation
from pyinfra.operations import files, systemd

from .host_output import fact_failed, parses


def file_sha256(path: Path) -> str:
    """The sha256 of a file on the controller, read in blocks (wheels run to gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class FileDigest(FactBase):
    """
    Returns the sha256, mode, owner and group of a regular file, or ``None`` when
    there is no regular file at ``path``.

    .. code:: python

        {"sha256": "9f86d08…", "mode": 0o644, "user": "root", "group": "root"}
    """

    def command(self, path: str) -> StringCommand:
        path_arg = QuoteString(path)
        return StringCommand(
            "if [ -f",
            path_arg,
            "]; then stat -c '%a %U %G'",
            path_arg,
            "&& sha256sum",
            path_arg,
            "; fi",
        )

    @parses
    def process(self, output: list[str]):
        if len(output) < 2:
            return None
        mode, user, group = output[0].split()
        return {
            "sha256": output[1].split()[0],
            "mode": int(mode, 8),
            "user": user,
            "group": group,
        }


class HostState(FactBase):
    """
    Returns, in one command, what a concern's converged state is made of: the sha256,
    mode, owner and group of files (``None`` where no regular file is), whether units
    are active and enabled (``systemctl is-active`` / ``is-enabled``), and the version of
    installed packages (``None`` where not installed).

    .. code:: python

        {"files": {"/etc/default/earlyoom": {"sha256": "9f…", "mode": 0o644,
                                             "user": "root", "group": "root"}},
         "units": {"earlyoom.service": {"active": "active", "enabled": "enabled"}},
         "packages": {"earlyoom": "1.7-1"}}
    """

    def command(
        self, paths: Sequence[str] = (), units: Sequence[str] = (), packages: Sequence[str] = ()
    ) -> StringCommand:
        bits: list = []
        for path in paths:
            q = QuoteString(path)
            bits += [
                "if [ -f",
                q,
                "]; then echo file $(stat -c '%a %U %G'",
                q,
                ")",
                "$(sha256sum <",
                q,
                "| cut -d' ' -f1)",
                q,
                "; else echo nofile",
                q,
                "; fi;",
            ]
        for unit in units:
            q = QuoteString(unit)
            bits += [
                "a=$(systemctl is-active",
                q,
                "2>/dev/null); e=$(systemctl is-enabled",
                q,
                "2>/dev/null); echo unit ${a:-unknown} ${e:-unknown}",
                q,
                ";",
            ]
        if packages:
            bits += [
                "dpkg-query -W -f='package ${db:Status-Abbrev} ${Version} ${Package}\\n'",
                *[QuoteString(p) for p in packages],
                "2>/dev/null;",
            ]
        return StringCommand(*bits, "true")

    @parses
    def process(self, output: list[str]) -> dict:
        found: dict = {"files": {}, "units": {}, "packages": {}}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "file":
                mode, user, group, sha, path = rest.split(" ", 4)
                found["files"][path] = {"sha256": sha, "mode": int(mode, 8), "user": user, "group": group}
            elif kind == "nofile":
                found["files"][rest] = None
            elif kind == "unit":
                active, enabled, unit = rest.split(" ", 2)
                found["units"][unit] = {"active": active, "enabled": enabled}
            elif kind == "package":
                # "ii  1.7-1 earlyoom": the status abbreviation ends in a space.
                words = rest.split()
                found["packages"][words[-1]] = words[-2] if words[0] == "ii" and len(words) == 3 else None
        return found

    @staticmethod
    def default() -> dict:
        return {"files": {}, "units": {}, "packages": {}}


def up_to_date(
    state: Mapping | None, content: str | bytes, mode: int | str = 0o644, user: str = "root", group: str = "root"
) -> bool:
    """Whether a file of :class:`HostState` (or :class:`FileDigest`) already has this
    content, mode and owner: :func:`file` would change nothing."""
    data = content.encode() if isinstance(content, str) else content
    return bool(state) and (state["sha256"], state["mode"], state["user"], state["group"]) == (
        hashlib.sha256(data).hexdigest(),
        _mode(mode),
        user,
        group,
    )


def _mode(mode: int | str) -> int:
    return mode if isinstance(mode, int) else int(str(mode), 8)


def temp_path(dest: str) -> str:
    """Where the new content waits beside ``dest`` (hidden, no .conf/.sh suffix)."""
    directory, name = posixpath.split(dest)
    return posixpath.join(directory, f".{name}.sparkrig-new")


# Uploads ------------------------------------------------------------------------------
# pyinfra uploads a root-bound file through /tmp/pyinfra-<sha1 of its destination>, created
# by the login user with the default mode (0644): any local user can read it, or create
# that path first and make the update fail (or, with fs.protected_regular off, replace its
# content). Every sparkrig upload is an Upload instead.

# The connector arguments that change who runs a command: the staging runs without them.
_AS_LOGIN_USER = {"_sudo": False, "_sudo_user": None, "_su_user": None, "_doas": False, "_dzdo": False}
_STAGE = re.compile(r"/[A-Za-z0-9._/-]+")


class Upload(FileUploadCommand):
    """Put ``src`` (a controller file's path, or a file object) at ``dest`` as root, through
    a fresh directory nobody else can enter or predict: the login user makes it
    (``umask 077; mktemp -d``: 0700, a random name), uploads into it (SFTP runs as the login
    user), and root copies the file to ``dest`` and removes the directory. A new ``dest`` is
    made 0600: the caller sets its mode."""

    def execute(self, state, host, connector_arguments):
        connector_arguments.update(self.connector_arguments)
        mine = {**connector_arguments, **_AS_LOGIN_USER}
        shown = {"print_output": state.print_output, "print_input": state.print_input}
        ok, output = host.connector.run_shell_command(StringCommand("umask 077 && mktemp -d"), **shown, **mine)
        stage = output.stdout.strip() if ok else ""
        if not _STAGE.fullmatch(stage):
            logger.error(
                f"{host.print_prefix}sparkrig: no private directory to upload {self.dest} through: "
                f"{output.stderr or stage!r}"
            )
            return False
        staged = f"{stage}/file"
        if not host.connector.put_file(self.src, staged, **shown, **mine):
            host.connector.run_shell_command(StringCommand("rm -rf", QuoteString(stage)), **mine)
            return False
        ok, output = host.connector.run_shell_command(
            StringCommand(
                "umask 077 && cp",
                QuoteString(staged),
                QuoteString(self.dest),
                "; s=$?; rm -rf",
                QuoteString(stage),
                "; exit $s",
            ),
            **shown,
            **connector_arguments,
        )
        if not ok:
            logger.error(f"{host.print_prefix}sparkrig: upload of {self.dest} failed: {output.stderr}")
        return ok


@operation()
def file(
    dest: str,
    content: str | bytes,
    mode: int | str = 0o644,
    user: str = "root",
    group: str = "root",
    validate: tuple[str, ...] | None = None,
    backup: str | None = None,
    current: Mapping | None | str = "read",
):
    """
    Write a file atomically, validating it before it replaces the old one.

    + dest: absolute path of the file on the host
    + content: the file's whole content
    + mode: octal mode, as an int (``0o644``) or a string (``"644"``)
    + user: owner of the file
    + group: group of the file
    + validate: a command run on the new file before it takes effect, the file's
      path appended as its last argument; a failure leaves the old file in place
    + backup: where the old file is copied (``cp -p``) after the new one validated and
      before it replaces the old one; only when the content changes and an old file exists
    + current: the file as the deploy read it (its :class:`HostState` entry, ``None`` for no
      file), so the operation decides from that reading; ``"read"`` (the default) reads it

    **Example:**

    .. code:: python

        atomic.file(
            name="sshd drop-in",
            dest="/etc/ssh/sshd_config.d/50-sparkrig.conf",
            content=text,
            mode="600",
            validate=("sshd", "-t", "-f"),
        )
    """
    yield from file_commands(dest, content, mode, user, group, validate, backup, current)


def file_commands(
    dest: str,
    content: str | bytes,
    mode: int | str = 0o644,
    user: str = "root",
    group: str = "root",
    validate: tuple[str, ...] | None = None,
    backup: str | None = None,
    current: Mapping | None | str = "read",
):
    """The commands of :func:`file`, for an operation of another module that writes a file as
    one of its steps (``yield from atomic.file_commands(...)``)."""
    data = content.encode() if isinstance(content, str) else content
    digest = hashlib.sha256(data).hexdigest()
    wanted_mode = _mode(mode)
    if current == "read":
        current = host.get_fact(FileDigest, path=dest)
        if fact_failed():
            return
    owner = f"{user}:{group}"

    if current and current["sha256"] == digest:
        if (current["mode"], current["user"], current["group"]) == (wanted_mode, user, group):
            host.noop(f"file {dest} is up to date")
            return
        yield StringCommand("chown", owner, QuoteString(dest), "&& chmod", f"{wanted_mode:o}", QuoteString(dest))
        return

    temp = QuoteString(temp_path(dest))
    if current is None:
        yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(dest)))
    yield Upload(BytesIO(data), temp_path(dest))
    check = (
        ["&& {", *[QuoteString(part) for part in validate], temp, "|| { rm -f", temp, "; false; }; }"]
        if validate
        else []
    )
    keep = ["&& cp -p", QuoteString(dest), QuoteString(backup)] if backup and current else []
    yield StringCommand(
        "chown",
        owner,
        temp,
        "&& chmod",
        f"{wanted_mode:o}",
        temp,
        *check,
        *keep,
        "&& mv -f",
        temp,
        QuoteString(dest),
    )


def file_if_changed(
    name: str, dest: str, content: str | bytes | None, current: Mapping | None, absent: str = "", **options
):
    """Write a file as :func:`file` does (``options``: its ``mode``, ``user``, ``group``,
    ``validate``, ``backup``), decided from the deploy's reading: ``current`` is the file's
    :class:`HostState` entry (``None``: no file). A file that already has this content, mode
    and owner adds no operation. ``content`` None: no file wanted, one found is removed by an
    operation named ``absent``. Returns the operation (for ``_if=`` of a restart), or None
    when the file was as wanted."""
    if content is None:
        return files.file(name=absent, path=dest, present=False) if current is not None else None
    owner = {key: options[key] for key in ("mode", "user", "group") if key in options}
    if up_to_date(current, content, **owner):
        return None
    return file(name=name, dest=dest, content=content, current=current, **options)


def unit_file(name: str, dest: str, content: str, validate: tuple[str, ...], reload_name: str, state: Mapping | None):
    """A systemd unit file or drop-in: written (validated, atomically) only when its
    :class:`HostState` entry ``state`` differs, then ``systemctl daemon-reload`` if the
    write changed it. Returns the file operation, or None when the file was up to date."""
    op = file_if_changed(name=name, dest=dest, content=content, current=state, validate=validate)
    if op is not None:
        systemd.daemon_reload(name=reload_name, _if=op.did_change)
    return op


def unit_file_validator(sections: Sequence[str], keys: Mapping[str, str]) -> tuple[str, ...]:
    """A ``validate=`` command for :func:`atomic.file` that accepts a unit file (or drop-in)
    holding only comments, blank lines, the given ``[sections]`` and ``KEY=VALUE`` lines
    whose value matches ``keys[KEY]`` (a POSIX extended regex): a strict parse where
    ``systemd-analyze verify`` would only warn about unknown keys and bad values.
    """
    patterns = [r"^$", r"^#", rf"^\[({'|'.join(sections)})\]$"]
    patterns += [rf"^{key}=({value})$" for key, value in keys.items()]
    # grep exits 1 when every line matched a pattern: anything else (a stray line: 0,
    # an unreadable file: 2) fails the validation.
    script = 'grep -Ev "$@"; [ $? -eq 1 ]'
    return ("sh", "-c", script, "sh", *[arg for pattern in patterns for arg in ("-e", pattern)])
