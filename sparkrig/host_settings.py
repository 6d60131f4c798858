"""
One host's settings for one deploy, built once and read-only: :func:`current`.

Every declared setting (:func:`sparkrig.settings.all_settings`) resolved over its default
(validated before any host was contacted, sparkrig.settings.validate_on_init), and the
hardware profile resolved: ``"auto"``
is chosen from what the box said in its first reading (:mod:`sparkrig.profile`), never
written back anywhere. Every concern's ``@deploy`` takes this object once and hands its
operations the values they need as parameters; nothing writes into pyinfra's ``host.data``
(tests/repo/test_values.py).

.. code:: python

    settings = host_settings.current()
    settings.swap_disable           # a setting, as an attribute or settings["swap_disable"]
    settings.hardware_profile       # "auto" already resolved: a name in hardware_profiles
    profile = host_settings.profile_or_refuse(settings, "ngc")  # or None, this host refused
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from pyinfra import host

from . import profile as profiles
from . import reading
from .messages import refused
from .settings import all_settings, resolve


class HostSettings(Mapping):
    """A host's resolved settings, read-only: a mapping, and each key as an attribute.

    ``profile`` is the resolved hardware profile's fields (None when ``"auto"`` matched no
    single profile: ``profile_problem`` says why)."""

    __slots__ = ("_values", "profile", "profile_problem")

    def __init__(
        self, values: Mapping[str, Any], profile: Mapping[str, Any] | None = None, profile_problem: str | None = None
    ) -> None:
        object.__setattr__(self, "_values", MappingProxyType(dict(values)))
        object.__setattr__(self, "profile", None if profile is None else MappingProxyType(dict(profile)))
        object.__setattr__(self, "profile_problem", profile_problem)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"no sparkrig setting {key!r} (is its concern imported?)") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("a host's settings are read-only: set them in the inventory or group_data")

    def __repr__(self) -> str:
        return f"HostSettings({dict(self._values)!r})"


def declared(data: Mapping[str, Any]) -> HostSettings:
    """A host's settings from its data alone (``hardware_profile`` may still be ``"auto"``):
    what the reading's planners see, before any host is read."""
    return HostSettings(resolve(all_settings(), data))


def current() -> HostSettings:
    """The current host's settings, built on first use (the profile resolved from the host's
    one reading) and the same object for the rest of the run. They were validated before any
    host was contacted: sparkrig.operations.install(), from the deploy's config.py."""
    found = getattr(host, "_sparkrig_settings", None)  # kept on pyinfra's Host, never in its data
    if found is not None:
        return found
    values = resolve(all_settings(), host.data.dict())
    if "hardware_profile" not in values:  # no declared concern knows the hardware (a user's deploy of swap() alone)
        host._sparkrig_settings = HostSettings(values)
        return host._sparkrig_settings
    name = values["hardware_profile"]
    problem = None
    if name == profiles.AUTO:
        name, problem = profiles.choose_profile(values["hardware_profiles"], reading.value(profiles.IDENTITY))
    chosen = values["hardware_profiles"][name] if name else None
    settings = HostSettings({**values, "hardware_profile": name or profiles.AUTO}, chosen, problem)
    host._sparkrig_settings = settings
    return settings


def known(other) -> HostSettings:
    """Another host's settings as far as this run knows them: the built ones once its deploy
    has built them, else from its data alone (``hardware_profile`` may be ``"auto"``)."""
    found = getattr(other, "_sparkrig_settings", None)
    return found if found is not None else declared(other.data.dict())


def profile_or_refuse(settings: HostSettings, concern: str) -> Mapping[str, Any] | None:
    """The host's hardware profile; or, where ``"auto"`` matched no single profile, None, and
    this host refused with why (the concern then does nothing more on it)."""
    if settings.profile is None:
        refused(
            name="The box's hardware profile is known",
            message=f"{concern} needs the hardware profile of the box: {settings.profile_problem}",
        )
    return settings.profile
