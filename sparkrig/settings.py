"""
Settings: the schema every sparkrig setting is declared in, and its validation.

Each concern module declares its settings, once, as a tuple of :class:`Setting`
named ``SETTINGS``: key, default, documentation and check. Its ``@deploy`` takes
its ``data_defaults`` from them, and the settings reference (``docs/settings.md``)
is generated from them: ``sparkrig reference`` writes it, and a unit
test fails while it is stale. :func:`validate_hosts` checks every host of a run
before any host is contacted (``config.py`` calls :func:`validate_on_init`), so
a bad value stops ``pyinfra`` with one message that names the host, the key and
what is allowed.
"""

from __future__ import annotations

import copy
import difflib
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import yaml
from pyinfra.api.exceptions import PyinfraError

# A check receives the value and every resolved setting of the host (for
# settings that depend on another, such as a profile name and the profile
# table); it returns None when the value is fine, else what is allowed.
Check = Callable[[Any, Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Setting:
    """One setting: its key, default, documentation (what it does and why) and check."""

    key: str
    default: Any
    doc: str
    check: Check


class SettingsError(PyinfraError):
    """A setting has a value sparkrig does not allow; raised before any change."""


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A login name as useradd accepts it by default (at most 32 characters).
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# A docker image reference: [registry[:port]/]path[:tag][@sha256:digest].
IMAGE_REFERENCE = re.compile(
    r"([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?"
)
# systemd's size suffixes (base 1024), as MemoryMin=/MemoryMax= read them.
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


# Checks --------------------------------------------------------------------


def absolute_path(value: Any, _data: Mapping[str, Any]) -> str | None:
    ok = (
        isinstance(value, str)
        and value.startswith("/")
        and posixpath.normpath(value) == value
        and not any(c in value for c in "\n\0'\"\\$`")
    )
    return None if ok else "a normalised absolute path without quotes, '$', '`' or '\\'"


def controller_path(value: Any, _data: Mapping[str, Any]) -> str | None:
    """A directory on the controller (``~`` is the controller user's home)."""
    ok = (
        isinstance(value, str)
        and (value.startswith("/") or value.startswith("~/"))
        and posixpath.normpath(value) == value
        and value.isprintable()
    )
    return None if ok else "a normalised absolute path on the controller, or one starting with ~/"


_MEMORY_MAX = re.compile(r"(infinity|([1-9]|[1-9][0-9]|100)%|([1-9][0-9]{0,14})([KMGT]?))")
# Largest byte count spark-run's shell arithmetic takes (64-bit, with headroom).
MAX_BYTES = 1 << 62


def memory_max_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        "systemd's MemoryMax= as sparkrig takes it: bytes with an optional K, M, G or T "
        "suffix (base 1024, at most 4 EiB) like '100G', a whole percentage of physical "
        "memory from '1%' to '100%', or 'infinity'"
    )
    match = _MEMORY_MAX.fullmatch(value) if isinstance(value, str) else None
    if not match:
        return allowed
    if match[3] and int(match[3]) * SIZE_UNITS[match[4]] > MAX_BYTES:
        return allowed
    return None


def boolean(value: Any, _data: Mapping[str, Any]) -> str | None:
    return None if isinstance(value, bool) else "True or False"


def int_range(low: int, high: int, what: str) -> Check:
    def check(value: Any, _data: Mapping[str, Any]) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        return None if ok else f"an integer from {low} to {high} ({what})"

    return check


def one_of(*choices: str) -> Check:
    def check(value: Any, _data: Mapping[str, Any]) -> str | None:
        return None if value in choices else "one of " + ", ".join(repr(c) for c in choices)

    return check


def one_of_keys(table_key: str) -> Check:
    def check(value: Any, data: Mapping[str, Any]) -> str | None:
        choices = sorted(data.get(table_key) or {})
        if isinstance(value, str) and value in choices:
            return None
        return f"one of the profiles in {table_key}: {', '.join(choices) or '(none defined)'}"

    return check


def env_value_problem(value: Any) -> str | None:
    """Why ``value`` cannot be written to an env file both sh and systemd read."""
    if not isinstance(value, str):
        return "a string"
    if any(c in value for c in "'\n\r\0"):
        return "a string without single quotes, newlines or NUL bytes"
    return None


def mapping_of(allowed: str, entry_problem: Callable[[Any, Any], "str | None"]) -> Check:
    """A check for a mapping whose every entry passes ``entry_problem(key, value)``
    (which returns None, or what is wrong with that entry)."""

    def check(value: Any, _data: Mapping[str, Any]) -> str | None:
        if not isinstance(value, Mapping):
            return allowed
        for name, item in value.items():
            problem = entry_problem(name, item)
            if problem:
                return f"{allowed} ({problem})"
        return None

    return check


env_mapping = mapping_of(
    "a mapping of environment variable names ([A-Za-z_][A-Za-z0-9_]*) to strings without single quotes or newlines",
    lambda name, item: (
        f"bad entry: {name!r}"
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name) or env_value_problem(item)
        else None
    ),
)


def env_mapping_except(managed: Iterable[str]) -> Check:
    """:data:`env_mapping` for a file sparkrig writes, refusing the variables it sets itself."""
    names = frozenset(managed)

    def check(value: Any, data: Mapping[str, Any]) -> str | None:
        allowed = env_mapping(value, data)
        if allowed:
            return allowed
        clash = sorted(set(value) & names)
        if clash:
            return f"variables other than the ones sparkrig manages ({', '.join(clash)} is managed)"
        return None

    return check


# Validation ----------------------------------------------------------------


def defaults(settings: Iterable[Setting]) -> dict[str, Any]:
    """The ``data_defaults`` of a deploy: each setting's key and default."""
    return {setting.key: setting.default for setting in settings}


def resolve(settings: Iterable[Setting], data: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting's effective value for a host: its data over the defaults."""
    settings = tuple(settings)
    resolved = defaults(settings)
    resolved.update({s.key: data[s.key] for s in settings if s.key in data})
    return resolved


def resolved(data: Mapping[str, Any]) -> dict[str, Any]:
    """Every sparkrig setting's effective value for a host (``host.data.dict()``)."""
    return resolve(all_settings(), data)


# A URL's user information (``scheme://user:token@host``): a secret that would reach build
# scripts, unit files and command lines. Refused in every setting, whatever its check says.
_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@]+@")


def holds_credentials(value: Any) -> bool:
    """Whether ``value`` (a string, or lists and mappings of them) holds a URL with user information."""
    if isinstance(value, str):
        return bool(_CREDENTIALS.search(value))
    if isinstance(value, Mapping):
        return any(holds_credentials(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_credentials(v) for v in value)
    return False


def allowed_text(setting: Setting, data: Mapping[str, Any]) -> str:
    """:func:`allowed`, named here because ``problems`` has a local of that name."""
    return allowed(setting, data)


def problems(settings: Iterable[Setting], data: Mapping[str, Any]) -> list[str]:
    """Every problem with one host's data, one line each, empty when valid."""
    settings = tuple(settings)
    resolved = resolve(settings, data)
    known = {s.key for s in settings}
    # Keys are namespaced by concern (cuda_env_*, swap_*, ...): an unknown key under
    # a known namespace is a typo, reported with the closest known key.
    prefixes = tuple({key.split("_", 1)[0] + "_" for key in known})
    found = []
    for key in sorted(k for k in data if isinstance(k, str) and k.startswith(prefixes)):
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            found.append(f"{key}: not a sparkrig setting{hint}")
    for setting in settings:
        value = resolved[setting.key]
        if holds_credentials(value):
            found.append(
                f"{setting.key} holds a URL with credentials (user:token@, not repeated here): allowed is "
                f"{allowed_text(setting, resolved)} without them; a URL reaches files and command lines other "
                "local users can read: give the hosts their credentials another way (netrc, git's credential store)"
            )
            continue
        allowed = setting.check(value, resolved)
        if allowed:
            found.append(f"{setting.key} = {value!r}: allowed is {allowed}")
    return found


# What each imported concern declared, by module name, in the order they were imported:
# the shared layer learns the concerns from them and never imports one.
_DECLARED: dict[str, tuple[tuple[Setting, ...], tuple[Callable, ...]]] = {}


def declare(module: str, settings: tuple[Setting, ...], fleet_checks: tuple[Callable, ...] = ()) -> None:
    """Record a concern's settings and fleet checks (each concern calls it once, as it is
    imported). A key another module already declared is an error: one declaration each."""
    taken = {s.key: name for name, (declared, _) in _DECLARED.items() if name != module for s in declared}
    clashes = sorted(s.key for s in settings if s.key in taken)
    if clashes:
        raise ValueError(f"{module} declares {', '.join(clashes)}, already declared by {taken[clashes[0]]}")
    _DECLARED[module] = (tuple(settings), tuple(fleet_checks))


def all_settings() -> tuple[Setting, ...]:
    """The settings of every concern imported so far, in the order they were imported."""
    return tuple(setting for settings, _ in _DECLARED.values() for setting in settings)


def validate_hosts(
    hosts: Iterable[tuple[str, Mapping[str, Any]]],
    inventory: Iterable[tuple[str, Mapping[str, Any]]] | None = None,
) -> None:
    """Raise one :class:`SettingsError` listing every bad setting of every host.

    ``hosts`` are the hosts of the run; ``inventory`` every host of the inventory (default:
    the same). Once each host's values are valid, each concern's ``FLEET_CHECKS`` see them
    all together (a cluster's addresses unique across its nodes, one subnet per link):
    each is called with the run's and the inventory's (name, data with every setting
    resolved) and returns (host, problem) pairs.
    """
    hosts = list(hosts)
    settings = all_settings()
    lines = [f"  host {name!r}: {problem}" for name, data in hosts for problem in problems(settings, data)]
    if not lines:
        everyone = hosts if inventory is None else list(inventory)
        # Each host's data with every setting resolved (ssh_hostname and such stay).
        resolved = {name: {**data, **resolve(settings, data)} for name, data in everyone}
        targeted = [(name, resolved.get(name) or {**data, **resolve(settings, data)}) for name, data in hosts]
        for _, checks in _DECLARED.values():
            for check in checks:
                lines += [f"  host {name!r}: {problem}" for name, problem in check(targeted, list(resolved.items()))]
    if lines:
        raise SettingsError(
            "invalid sparkrig settings, nothing was changed on any host "
            f"(every setting is documented in {REFERENCE}):\n" + "\n".join(lines)
        )


def validate_on_init(state) -> None:
    """Make pyinfra validate every targeted host's settings before it connects to any.

    pyinfra loads ``config.py`` before it builds the inventory, and initialises the
    state (inventory, ``--limit``) right before it connects. Validation runs at the
    end of that initialisation, so an error stops the run with no host contacted.
    """
    init = state.init

    def init_then_validate(*args, **kwargs):
        init(*args, **kwargs)
        validate_hosts(
            [(host.name, host.data.dict()) for host in state.inventory if state.is_host_in_limit(host)],
            [(host.name, host.data.dict()) for host in state.inventory],
        )

    state.init = init_then_validate


# The reference ----------------------------------------------------------------

REFERENCE = "docs/settings.md"


class _NotAValue:
    """What no check accepts: asking a check about it makes it say what it allows."""

    def __repr__(self) -> str:
        return "<not a value>"


def allowed(setting: Setting, data: Mapping[str, Any]) -> str:
    """What ``setting`` allows, in its check's own words (as a bad value is told)."""
    try:
        said = setting.check(_NotAValue(), data)
    except Exception:  # a check that cannot even look at a foreign object
        said = None
    return said or "any value"


def _default(value: Any) -> str:
    text = repr(value)
    if len(text) <= 90:
        return f"`{text}`"
    if isinstance(value, Mapping):
        return f"{len(value)} entries: " + ", ".join(f"`{key}`" for key in value)
    return f"{len(value)} items (see the module)"


def reference(concerns: Sequence[ModuleType]) -> str:
    """``docs/settings.md``: the settings of ``concerns`` (modules that declared them), each
    one's default, what is allowed and what it does."""
    data = defaults(all_settings())
    out = [
        "# Settings reference",
        "",
        "Generated from each concern's `SETTINGS` by `uv run sparkrig reference`; do not",
        "edit (a unit test fails while it is stale). Set a key in `group_data/all.py` for every host,",
        "in `group_data/<group>.py` for a group, or in the inventory's host data for one host. Every",
        "value is checked before any host is contacted; a bad one stops the run with one message",
        "naming the host, the key and what is allowed.",
    ]
    for concern in concerns:
        title = (concern.__doc__ or concern.__name__).strip().splitlines()[0].rstrip(".:,")
        name = concern.__name__
        # The checkout's path: a concern's settings module, or the shared layer's module.
        module = (
            f"operations/{name.removeprefix('sparkrig.operations.')}/settings.py"
            if name.startswith("sparkrig.operations.")
            else name.replace(".", "/") + ".py"
        )
        out += ["", f"## {title}", "", f"`{module}`"]
        for setting in concern.SETTINGS:
            out += [
                "",
                f"### `{setting.key}`",
                "",
                f"Default: {_default(setting.default)}. Allowed: {allowed(setting, data)}.",
                "",
                setting.doc,
            ]
    return "\n".join(out) + "\n"


# libyaml's safe loader where PyYAML was built with it: a quarter of the pure-Python one's time.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_READ: dict[tuple[str, int, int], Any] = {}


def yaml_file(path: os.PathLike | str) -> Any:
    """A YAML file of the controller's, parsed once per run however often it is asked for (the
    settings' defaults, each host's inventory data and the checks each read group_data's
    manifests: eight parses of two files in a no-change run of the lab). Each caller gets its
    own copy, free to change it; a file changed since is read again."""
    found = os.stat(path)
    key = (os.fspath(path), found.st_mtime_ns, found.st_size)
    if key not in _YAML_READ:
        with open(path, encoding="utf-8") as stream:
            _YAML_READ[key] = yaml.load(stream, Loader=_YAML_LOADER)
    return copy.deepcopy(_YAML_READ[key])
