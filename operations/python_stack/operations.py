"""Python stack: the operations that install uv and make the virtualenv hold its lock, and
the commands they run."""

from __future__ import annotations

import posixpath
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig import atomic, host_output, messages, rendering, wheelhouse
from sparkrig import parts as sparkrig_parts
from sparkrig.python_wheels import offline_wheels
from sparkrig.stack_locks import REFRESH, digest, host_lock, indexes, lock_name, locks_dir, read_lock
from sparkrig.venv import STATE_DIR, UV, UV_CACHE, UV_ENV, UV_TOOL

from .facts import OFFLINE_DIR, UV_LINK, PythonStack, major_minor, plan_clean

UV_REQUIREMENTS = "/opt/sparkrig/uv-requirements.txt"
STAGE = "/var/lib/sparkrig/stage"  # root's: files on their way to a directory of another user
PUT_AS_OWNER = rendering.script("python_stack/put-as-owner.sh")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SYNC_TIMEOUT_S = 3600  # a venv sync downloads the stack (torch alone is over a GB) at most this long
# The largest file a sync may write (RLIMIT_FSIZE): a wheel's CUDA libraries run to GBs each.
SYNC_FILE_BYTES = 32 << 30


def as_owner(owner: str, *argv: Any) -> list[Any]:
    """``argv`` run as ``owner`` with uv's environment (runuser: no password, no PAM session)."""
    return ["runuser", "-u", QuoteString(owner), "--", "env", *UV_ENV, *argv]


def render_uv_requirements(version: str, hashes: Sequence[str]) -> str:
    return rendering.render("python_stack/uv-requirements.txt.j2", version=version, hashes=hashes)


@operation()
def uv_tool(version: str, index_url: str, present: str | None = None, link: bool = True):
    """
    Install uv ``version`` into its own tool environment from a package index, checked
    against the hashes of :data:`UV_REQUIREMENTS`.

    + version: the uv release
    + index_url: the package index pip installs it from
    + present: the version the host has now (``None``: none); nothing happens when equal
    + link: make ``/usr/local/bin/uv`` a link to it (when that name is free or already ours)

    A new tool environment is built beside the old one and swapped in only once its
    uv runs, so a failed upgrade leaves the old uv working.

    **Example:**

    .. code:: python

        uv_tool(name="uv 0.13.9", version="0.13.9", index_url="https://pypi.org/simple")
    """
    if present != version:
        messages.detail(f"uv {version} (this host has {present or 'none'})")
        new = QuoteString(f"{UV_TOOL}.sparkrig-new")
        python = QuoteString(f"{UV_TOOL}.sparkrig-new/bin/python")
        yield StringCommand(
            "rm -rf",
            new,
            "&& python3 -I -m venv",
            new,
            # Debian's and Ubuntu's pip read the system store; say so for any other pip.
            f"&& {{ [ ! -f {CA_BUNDLE} ] || export PIP_CERT={CA_BUNDLE}; }}",
            "&&",
            python,
            "-I -m pip install --quiet --disable-pip-version-check --no-cache-dir",
            "--require-hashes --only-binary :all: --index-url",
            QuoteString(index_url),
            "-r",
            QuoteString(UV_REQUIREMENTS),
            "&&",
            QuoteString(f"{UV_TOOL}.sparkrig-new/bin/uv"),
            "--version",
            "&& rm -rf",
            QuoteString(UV_TOOL),
            "&& mv",
            new,
            QuoteString(UV_TOOL),
        )
    if link:
        yield StringCommand("[ -e", QuoteString(UV_LINK), "] || ln -s", QuoteString(UV), QuoteString(UV_LINK))


def virtualenv_arguments(data: Mapping[str, Any], built: Mapping[str, str]) -> dict[str, Any]:
    """The arguments of :func:`virtualenv` for a host's resolved settings ``data``, with
    the requirement lines of its built wheels (``built``, see :func:`host_lock`)."""
    manifest = data["python_stack"]
    arch = data["hardware_profiles"][data["hardware_profile"]]["arch"]
    profiles = data["python_stack_profiles"]
    text = read_lock(locks_dir(data["python_stack_locks"]) / lock_name(manifest, profiles, arch)) or ""
    arguments = {
        "path": data["python_venv_path"],
        "owner": data["python_venv_owner"],
        "python": manifest["python"],
        "lock": host_lock(text, built),
        "index_url": data["python_index_url"],
        "extra_index_urls": sorted(set(indexes(manifest).values())),
        "python_preference": data["python_venv_python_preference"],
        "wheels": {},
    }
    if data["python_offline"] and text:
        arguments["wheels"] = offline_wheels(
            text, arch, manifest["python"], Path(data["python_offline_cache"]).expanduser()
        )
        arguments["lock"] = offline_lock(arguments["lock"])
    return arguments


def offline_lock(text: str) -> str:
    """A lock for ``--offline --no-index``: each wheel locked by its URL (vLLM's) named by its
    copy in :data:`OFFLINE_DIR` instead, its hashes kept (uv fetches no URL offline, and
    --find-links serves only what is locked by name)."""

    def local(match: re.Match) -> str:
        return f" @ file://{OFFLINE_DIR}/{urllib.parse.unquote(match[1])}"  # as offline_wheels names it

    return re.sub(r" @ https?://[^\s]*/([^/\s]+\.whl)(?=\s)", local, text)


@operation()
def virtualenv(
    path: str,
    owner: str,
    python: str,
    lock: str,
    index_url: str = "https://pypi.org/simple",
    extra_index_urls: Sequence[str] = (),
    python_preference: str = "system",
    wheels: Mapping[str, str] | None = None,
):
    """
    Make the virtualenv at ``path`` hold exactly ``lock``, a lock made on the controller.

    + path: the venv's directory
    + owner: the user who owns the venv and runs uv
    + python: the venv's Python, major.minor; a venv of another Python is made anew
    + lock: the lock's text (``uv pip compile --generate-hashes`` output; every file's sha256)
    + index_url: where the locked files are downloaded from
    + extra_index_urls: the indexes the manifest names for some packages alone (torch, vLLM)
    + python_preference: uv's ``--python-preference`` when the venv is made
    + wheels: offline: every locked wheel, file name: path on the controller; uploaded to
      :data:`OFFLINE_DIR` when missing there, and installed with ``--offline --no-index``;
      without them, :data:`OFFLINE_DIR` is removed

    Reads the host with :class:`PythonStack`. The lock is uploaded when its sha256 differs;
    ``uv pip sync --require-hashes`` runs when it was, or when uv's dry run of it would
    change anything. Hosts never resolve. A failed step leaves the next run to redo it.

    **Example:**

    .. code:: python

        virtualenv(
            name="ML venv",
            path="/opt/sparkrig/venv",
            owner="spark",
            python="3.12",
            lock=open("group_data/python_stack.locks/aarch64-py3.12.txt").read(),
        )
    """
    yield from virtualenv_commands(path, owner, python, lock, index_url, extra_index_urls, python_preference, wheels)


def virtualenv_commands(
    path: str,
    owner: str,
    python: str,
    lock: str,
    index_url: str = "https://pypi.org/simple",
    extra_index_urls: Sequence[str] = (),
    python_preference: str = "system",
    wheels: Mapping[str, str] | None = None,
):
    """The commands of :func:`virtualenv` (for :func:`synced`, which works out its arguments
    when it runs)."""
    wheels = wheels or {}
    found = host_output.direct_fact(PythonStack, venv=path, owner=owner, wheels=OFFLINE_DIR if wheels else "")
    if found is None:
        return
    messages.detail(f"virtualenv {path}: Python {python}, owner {owner}")
    state = posixpath.join(path, STATE_DIR)
    lock_path = posixpath.join(state, "requirements.lock")
    q_path, q_state = QuoteString(path), QuoteString(state)
    q_group = QuoteString(f"{owner}:")  # the owner and their login group
    venv_python = QuoteString(posixpath.join(path, "bin", "python"))
    changed = False

    if not lock:
        yield messages.refuse(f"no lock for this host on the controller: run `{REFRESH}`")
        return
    if not found["owner_exists"]:
        yield messages.refuse(f"python_venv_owner {owner} is no user on this host: create it first")
        return
    if found["cache_owner"] != owner:
        changed = True
        yield StringCommand("mkdir -p", QuoteString(UV_CACHE), "&& chown -hR", q_group, QuoteString(UV_CACHE))

    fresh = not found["usable"] or major_minor(found["python"]) != python
    if fresh and found["occupied"] and found["python"] is None:
        yield messages.refuse(
            f"{path} is a non-empty directory but no virtualenv (no pyvenv.cfg): sparkrig "
            "makes its venv only in an empty or new directory, or over an earlier venv"
        )
        return
    if fresh:
        changed = True
        yield StringCommand(
            # Root makes the directory, never through a link (-h: the links inside are the owner's).
            "{ [ ! -L",
            q_path,
            "] || {",
            messages.refuse(f"{path} is a symbolic link: sparkrig makes its venv only in a directory"),
            "; }; }",
            "&& mkdir -p",
            q_path,
            "&& chown -hR",
            q_group,
            q_path,
            "&&",
            *as_owner(
                owner,
                QuoteString(UV),
                "venv --no-config --clear --python",
                QuoteString(python),
                "--python-preference",
                QuoteString(python_preference),
                q_path,
            ),
        )
    elif found["owner"] != owner:
        changed = True
        yield StringCommand("chown -hR", q_group, q_path)

    missing = sorted(set(wheels) - set(found["wheels"]))
    extra = sorted(set(found["wheels"]) - set(wheels))
    if missing or extra:
        changed = True
        yield StringCommand("mkdir -p", QuoteString(OFFLINE_DIR), "&& chmod 755", QuoteString(OFFLINE_DIR))
        for name in missing:
            temp = f"{OFFLINE_DIR}/.{name}.sparkrig-new"
            yield atomic.Upload(wheels[name], temp)
            yield StringCommand(
                "chmod 644", QuoteString(temp), "&& mv -f", QuoteString(temp), QuoteString(f"{OFFLINE_DIR}/{name}")
            )
        if extra:
            yield StringCommand("rm -f", *[QuoteString(f"{OFFLINE_DIR}/{name}") for name in extra])
    elif not wheels and found["offline_dir"]:
        # python_offline was turned off: the controller's copies of the locked wheels (torch's
        # alone is over a GB) would stay for good. Root's directory, below root's /var/lib/sparkrig.
        changed = True
        yield StringCommand("rm -rf", QuoteString(OFFLINE_DIR))

    stale_lock = fresh or found["lock"] != digest(lock)
    if stale_lock:
        changed = True
        # Uploaded into a root-owned directory, then put in place by the owner: the venv is
        # theirs, and root never writes or chowns through a path they can change.
        staged = f"{STAGE}/requirements-{digest(path)[:16]}.lock"
        yield StringCommand("install -d -m 755 -o root -g root", QuoteString(STAGE), "&& rm -f", QuoteString(staged))
        yield atomic.Upload(BytesIO(lock.encode()), staged)
        yield StringCommand(
            "chmod 644",
            QuoteString(staged),
            "&& runuser -u",
            QuoteString(owner),
            "-- sh -c",
            QuoteString(PUT_AS_OWNER),
            "put",
            q_state,
            QuoteString(staged),
            "requirements.lock",
            "; s=$?; rm -f",
            QuoteString(staged),
            "; exit $s",
        )

    if stale_lock or missing or not plan_clean(found, lock):
        if not fresh and not found["root_python"]:
            # uv's sync starts the venv's interpreter as its owner: a program of theirs there
            # (not the link uv venv made to root's python) could hold the sync for its hour.
            yield messages.refuse(
                f"the interpreter of {path} (its bin/ link) is not one only root may change: sparkrig "
                "syncs only a venv whose interpreter is the one uv venv linked (remove the venv to have it made again)"
            )
            return
        changed = True
        if wheels:
            source = ["--offline --no-index --find-links", QuoteString(OFFLINE_DIR)]
        else:
            source = ["--index-url", QuoteString(index_url)]
            for url in extra_index_urls:
                source += ["--extra-index-url", QuoteString(url)]
            if extra_index_urls:
                # Resolved on the controller with each named index explicit; here every
                # file is pinned by sha256, so any index may only hand over those files.
                source.append("--index-strategy unsafe-best-match")
        # uv starts the venv's python, the owner's program: contained, so that it can
        # neither hold this command's output open nor leave a process behind.
        sync = StringCommand(
            *as_owner(
                owner,
                QuoteString(UV),
                "pip sync --no-config --quiet --require-hashes",
                *source,
                "--python",
                venv_python,
                QuoteString(lock_path),
            )
        )
        yield StringCommand(sparkrig_parts.contained(sync, SYNC_TIMEOUT_S, file_bytes=SYNC_FILE_BYTES))

    if not changed:
        host.noop(f"virtualenv {path} holds its lock")


@operation()
def synced(settings: Mapping[str, Any]):
    """
    Make the venv hold its lock and the built wheels there are when this operation runs
    (source builds of this deploy may have added one): :func:`virtualenv`, its arguments
    worked out at that moment. The source builds call it through sparkrig/wheelhouse.py.

    + settings: the host's settings (sparkrig.host_settings)

    **Example:**

    .. code:: python

        synced(name="Built wheels into the venv", settings=host_settings.current())
    """
    yield from virtualenv_commands(**virtualenv_arguments(settings, wheelhouse.built_lines(settings)))
