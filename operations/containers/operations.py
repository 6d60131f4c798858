"""Containers: Docker's daemon.json merged (the nvidia runtime registered), the docker group's
members, and the GPUs' static CDI specification."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File

from sparkrig import atomic, host_output, messages, rendering
from sparkrig.messages import refuse

from .facts import CDI_STATIC_SPEC, DAEMON_JSON, DockerDaemonJson, GroupMembers

DAEMON_JSON_BACKUP = "/etc/docker/daemon.json.sparkrig-old"
NVIDIA_RUNTIME = {"path": "nvidia-container-runtime", "args": []}


def merged_daemon_config(current: Mapping[str, Any], default_runtime: bool) -> dict[str, Any]:
    """``current`` with the nvidia runtime registered (an existing registration kept)
    and ``default-runtime`` set to nvidia, or no longer nvidia; every other key as it was."""
    config = copy.deepcopy(dict(current))
    runtimes = config.setdefault("runtimes", {})
    if not isinstance(runtimes, dict):
        raise ValueError('"runtimes" is not a JSON object')
    runtimes.setdefault("nvidia", copy.deepcopy(NVIDIA_RUNTIME))
    if default_runtime:
        config["default-runtime"] = "nvidia"
    elif config.get("default-runtime") == "nvidia":
        del config["default-runtime"]
    return config


def parse_daemon_json(text: str | None) -> dict[str, Any]:
    """The daemon.json object (``{}`` without a file); ValueError saying why it is unusable."""
    if text is None or not text.strip():
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"it is not valid JSON ({error})") from None
    except RecursionError:
        raise ValueError("it nests deeper than Python's JSON reader goes") from None
    if not isinstance(config, dict):
        raise ValueError("it is not a JSON object")
    return config


def daemon_json_change(text: str | None, default_runtime: bool) -> str | None:
    """The new daemon.json for a host whose file holds ``text`` (``None``: no file), or
    ``None`` when it is right already; ValueError when the file is unusable."""
    current = parse_daemon_json(text)
    wanted = merged_daemon_config(current, default_runtime)
    if text is not None and wanted == current:
        return None
    return json.dumps(wanted, indent=2) + "\n"


# dockerd --validate, or a JSON parse where dockerd is older than 23.0. $1: the new file.
DAEMON_JSON_CHECK = rendering.script("containers/daemon-json-check.sh")


@operation()
def daemon_config(default_runtime: bool = False):
    """
    Merge the nvidia runtime into Docker's daemon.json, keeping every other key.

    + default_runtime: make ``nvidia`` the default runtime (False: make sure it is not)

    **Example:**

    .. code:: python

        containers.daemon_config(default_runtime=True)
    """
    text = host.get_fact(DockerDaemonJson)
    if host_output.fact_failed():  # unreadable: pyinfra has failed this host and said why
        return
    try:
        content = daemon_json_change(text, default_runtime)
    except ValueError as error:
        yield refuse(
            f"{DAEMON_JSON}: {error}; sparkrig merges into it and never overwrites it: fix or remove it, then run again"
        )
        return
    if content is None:
        host.noop(f"{DAEMON_JSON} registers the nvidia runtime")
        return
    yield from atomic.file_commands(
        dest=DAEMON_JSON,
        content=content,
        mode=0o644,
        validate=("sh", "-c", DAEMON_JSON_CHECK, "daemon-json-check"),
        backup=DAEMON_JSON_BACKUP,
    )


@operation()
def group_members(group: str, users: Sequence[str]):
    """
    Add existing users to a group (never removes anyone, never creates a user).

    + group: the group, created as a system group when missing
    + users: user names; a name without an account fails the operation

    **Example:**

    .. code:: python

        containers.group_members(group="docker", users=["alice"])
    """
    found = host.get_fact(GroupMembers, group=group, users=tuple(users))
    missing = [user for user in users if user not in found["users"]]
    if missing:
        yield refuse(f"no such user on this host: {', '.join(missing)} (containers_docker_users)")
        return
    members = found["members"]
    if members is None:
        yield StringCommand("groupadd", "--system", QuoteString(group))
        members = []
    joining = [user for user in users if user not in members]
    if not joining:
        host.noop(f"{', '.join(users)} in group {group}")
        return
    messages.detail(f"adding {', '.join(joining)} to group {group}")
    for user in joining:
        yield StringCommand("gpasswd", "-a", QuoteString(user), QuoteString(group))


@operation()
def static_cdi_spec(path: str = CDI_STATIC_SPEC):
    """
    Generate a CDI specification of the host's GPUs with ``nvidia-ctk`` when there is none.

    + path: where the specification is written

    **Example:**

    .. code:: python

        containers.static_cdi_spec()
    """
    if host.get_fact(File, path=path):
        host.noop(f"{path} exists")
        return
    yield StringCommand("nvidia-ctk", "cdi", "generate", QuoteString(f"--output={path}"))
