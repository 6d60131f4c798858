"""Updates: the deploy, and the parts of the host's one reading it decides from."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import systemd

from sparkrig import atomic, host_output, host_settings, messages, reading
from sparkrig.packages import Candidates
from sparkrig.packages import installed as install_packages
from sparkrig.settings import defaults

from . import boots, known_bad
from .cmdline import KernelCmdline, cmdline_missing
from .facts import (
    AWAITING_REBOOT,
    NOT_INSTALLABLE,
    RECORD,
    Firmware,
    Versions,
    dist_name,
    pending_reboot,
    unexpected,
)
from .operations import (
    APT_CONF,
    APT_CONF_VALIDATOR,
    CMDLINE_VALIDATOR,
    FWUPD_PACKAGE,
    JOURNALD_VALIDATOR,
    KNOWN_BAD_VALIDATOR,
    OOMD_UNITS,
    PIN_VALIDATOR,
    TIMERS,
    UNATTENDED_PACKAGE,
    firmware_applied,
    grub_updated,
    marked,
    oomd_masked,
    render_apt_conf,
    render_cmdline,
    render_pins,
    render_record,
)
from .settings import DEFAULTS, GRUB_DROP_IN, KNOWN_BAD_FILE, PIN_FILE, SETTINGS, parse_hold


def python_names(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """torch and the manifest's vLLM (its name may be a stand-in's), as .dist-info names."""
    manifest = settings.get("python_stack")  # python_stack's setting
    vllm = (manifest.get("vllm") or {}) if isinstance(manifest, Mapping) else {}
    return (dist_name("torch"), dist_name(vllm.get("name") or "vllm"))


def versions_part(settings: Mapping[str, Any]) -> reading.Part:
    """The host's :class:`Versions`, as the deploy and the report read it."""
    settings = {**defaults(SETTINGS), **settings}
    holds = sorted({name for name, version in map(parse_hold, settings["updates_hold"]) if version is None})
    # Every entry's packages, whatever the profile (the report learns a host's profile in the
    # same reading): known_bad.running picks the host's.
    entries = [*known_bad.shipped(), *settings["updates_known_bad"]]
    globs = {"known_bad": known_bad.package_globs(entries)} if known_bad.package_globs(entries) else {}
    return reading.part(
        Versions,
        packages={**dict(settings["updates_packages"]), **globs},
        holds=holds,
        venv=settings.get("python_venv_path", ""),
        python=python_names(settings),
    )


def firmware_part(settings: Mapping[str, Any]) -> reading.Part:
    """The host's :class:`Firmware`, as the report reads it (with the updates on offer when
    ``updates_firmware`` is ``apply``, as the deploy reads it then)."""
    settings = {**defaults(SETTINGS), **settings}
    return reading.part(Firmware, updates=settings["updates_firmware"] == "apply")


# Whether apt could install fwupd at all (an offline box's lists may lack it).
CANDIDATES = reading.part(Candidates, packages=(FWUPD_PACKAGE,))


def boots_part(settings: Mapping[str, Any]) -> reading.Part:
    """The host's :class:`boots.BootHistory`, as the report reads it (the deploy reads none)."""
    settings = {**defaults(SETTINGS), **settings}
    return reading.part(boots.BootHistory, count=settings["updates_boot_count"])


# The kernel's command line: booted with, asked by the drop-in, the boot loader's.
CMDLINE = reading.part(KernelCmdline)

STATE = reading.part(
    atomic.HostState,
    paths=(PIN_FILE, KNOWN_BAD_FILE, APT_CONF, RECORD, GRUB_DROP_IN, boots.JOURNALD_DROP_IN),
    units=(*TIMERS, *OOMD_UNITS, boots.PSTORE_UNIT, "systemd-journald.service"),
    packages=(UNATTENDED_PACKAGE, FWUPD_PACKAGE),
)


@reading.planner
def reads(settings):
    # fwupd is asked (over D-Bus, seconds on a real box) only where the deploy acts on it.
    firmware = [firmware_part(settings)] if settings["updates_firmware"] == "apply" else []
    candidates = [CANDIDATES] if settings["updates_firmware"] != "off" else []
    return [versions_part(settings), STATE, CMDLINE, *candidates, *firmware]


def oomd_off(settings: Mapping[str, Any]) -> bool:
    """Whether systemd-oomd is to be masked (``auto``: where earlyoom is the watchdog)."""
    choice = settings["updates_systemd_oomd"]
    # watchdog_enabled: watchdog's setting (updates.settings imports it, DEFAULTS holds it).
    return choice == "off" or (choice == "auto" and bool(settings.get("watchdog_enabled", True)))


@deploy("Updates", data_defaults=DEFAULTS)
def updates():
    """
    Check the expected kernel and driver, hold packages, set unattended upgrades and
    systemd-oomd as the settings say.

    Settings: ``updates_hold``, ``updates_unattended``, ``updates_expected_kernel``,
    ``updates_expected_driver``, ``updates_stop_on_unexpected``, ``updates_systemd_oomd``,
    ``updates_packages``, ``updates_firmware``, ``updates_boot_history``; see docs/settings.md.
    """
    # The parts the reading's planner saw (the venv's path, the manifest's vLLM,
    # watchdog_enabled): no command of their own.
    settings = host_settings.current()
    facts = reading.value(versions_part(settings))
    state = reading.value(STATE)
    if host_output.fact_failed():
        return
    # Known-bad versions: pinned away before anything here installs, said where one is present.
    entries = known_bad.applicable(settings)
    known_pins = known_bad.render_pins(entries)
    known_state = state["files"].get(KNOWN_BAD_FILE)
    atomic.file_if_changed(
        name=f"Known-bad versions never installed ({KNOWN_BAD_FILE})",
        absent=f"No known-bad pins ({KNOWN_BAD_FILE})",
        dest=KNOWN_BAD_FILE,
        current=known_state,
        content=known_pins,
        validate=KNOWN_BAD_VALIDATOR,
    )
    for line in known_bad.running(entries, facts):
        messages.detail(f"updates: {line}")
    wrong = unexpected(settings, facts)
    if wrong and settings["updates_stop_on_unexpected"]:
        messages.refused(
            name="The box runs the expected kernel and driver (updates_stop_on_unexpected)",
            message="; ".join(wrong) + ": nothing changed on this host (updates_stop_on_unexpected)",
        )
        return
    for line in wrong:
        messages.detail(f"updates: {line}")
    reboot = pending_reboot(facts)
    if reboot:
        messages.detail(f"updates: a reboot is pending ({reboot})")

    # Holds: pins, then apt-mark, then what was released is upgraded.
    holds = settings["updates_hold"]
    pins = render_pins(holds)
    atomic.file_if_changed(
        name=f"Version pins ({PIN_FILE})",
        absent=f"No version pins ({PIN_FILE})",
        dest=PIN_FILE,
        current=state["files"].get(PIN_FILE),
        content=pins,
        validate=PIN_VALIDATOR,
    )
    versions = dict(map(parse_hold, holds))
    marks = [name for name, version in versions.items() if version is None]
    wanted = {name for name in facts["hold_matches"] if any(fnmatch.fnmatchcase(name, g) for g in marks)}
    pinned = {name for name, version in versions.items() if version and not set(name) & set("*?")}
    held, record = set(facts["held"]), set(facts["record"])
    to_hold = sorted(wanted - held)
    # Released: what sparkrig held or pinned and the setting no longer names. It stays in
    # the record until its upgrade went through, so a failed upgrade is tried again.
    released = sorted(record - wanted - pinned)
    unhold = sorted(set(released) & held)
    if to_hold or unhold:
        marked(name="Packages held as updates_hold says (apt-mark)", hold=to_hold, unhold=unhold)
    if released:
        messages.detail(f"updates: released, upgrading: {' '.join(released)}")
        install_packages(name="Upgrade what a released hold kept back", packages=released, only_upgrade=True)
    new_record = (wanted & (record | set(to_hold))) | pinned
    record_text = render_record(new_record) if new_record else None
    atomic.file_if_changed(
        name=f"What sparkrig holds ({RECORD})",
        absent=f"What sparkrig holds ({RECORD})",
        dest=RECORD,
        current=state["files"].get(RECORD),
        content=record_text,
    )

    # Unattended upgrades and the timers that run them.
    mode = settings["updates_unattended"]
    conf = render_apt_conf(mode, holds)
    if mode != "off" and state["packages"].get(UNATTENDED_PACKAGE) is None:
        install_packages(name="Install unattended-upgrades", packages=[UNATTENDED_PACKAGE])
    conf_state = state["files"].get(APT_CONF)
    atomic.file_if_changed(
        name=f"Unattended upgrades as updates_unattended says ({APT_CONF})",
        dest=APT_CONF,
        current=conf_state,
        content=conf,
        validate=APT_CONF_VALIDATOR,
    )
    running = mode != "off"
    for timer in host.loop(TIMERS):
        unit = state["units"].get(timer, {})
        if unit.get("enabled") not in ("enabled", "disabled"):
            continue  # absent (or masked by the owner): nothing to keep consistent
        if (unit.get("active") == "active", unit.get("enabled") == "enabled") != (running, running):
            systemd.service(
                name=f"{timer} runs as updates_unattended says",
                service=timer,
                running=running,
                enabled=running,
            )

    # systemd-oomd.
    if oomd_off(settings):
        present = [
            u
            for u in OOMD_UNITS
            if state["units"].get(u, {}).get("enabled") not in (None, "unknown", "not-found", "masked")
            or state["units"].get(u, {}).get("active") == "active"
        ]
        if present:
            oomd_masked(name="systemd-oomd is masked (earlyoom is the watchdog)", units=present)

    kernel_cmdline(settings, state)
    boot_history(settings, state)
    firmware(settings, state)


def boot_history(settings: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """The journal kept across boots (sparkrig's journald drop-in, validated, atomic; journald
    restarted to take it) and systemd-pstore enabled where the host has it and it is disabled."""
    wanted = settings["updates_boot_history"]
    written = atomic.file_if_changed(
        name=f"The journal kept across boots ({boots.JOURNALD_DROP_IN})",
        dest=boots.JOURNALD_DROP_IN,
        current=state["files"].get(boots.JOURNALD_DROP_IN),
        content=boots.render_journald() if wanted else None,
        absent=f"No journald drop-in ({boots.JOURNALD_DROP_IN})",
        validate=JOURNALD_VALIDATOR,
    )
    if not wanted:
        return
    if written is not None:
        if state["units"].get("systemd-journald.service", {}).get("active") == "active":
            systemd.service(name="journald takes the drop-in", service="systemd-journald", restarted=True)
    # Only where the host has the unit and it is off: static or masked is the owner's.
    if state["units"].get(boots.PSTORE_UNIT, {}).get("enabled") == "disabled":
        systemd.service(name="Kernel crash dumps collected (systemd-pstore)", service=boots.PSTORE_UNIT, enabled=True)


def kernel_cmdline(settings: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """The GRUB drop-in for ``updates_kernel_cmdline`` (validated, atomic), and update-grub
    where a boot loader applies it and its generated configuration does not say it yet."""
    wanted = settings["updates_kernel_cmdline"]
    add, remove = list(wanted.get("add", [])), list(wanted.get("remove", []))
    content = render_cmdline(wanted)
    current = state["files"].get(GRUB_DROP_IN)
    line = reading.value(CMDLINE)
    if host_output.fact_failed():
        return
    changed = (
        atomic.file_if_changed(
            name=f"The kernel's command line as updates_kernel_cmdline says ({GRUB_DROP_IN})",
            absent=f"No kernel command line drop-in ({GRUB_DROP_IN})",
            dest=GRUB_DROP_IN,
            current=current,
            content=content,
            validate=CMDLINE_VALIDATOR,
        )
        is not None
    )
    # A drop-in that a failed update-grub never took is applied again.
    stale = line["generated"] is not None and bool(cmdline_missing(line["generated"], add, remove))
    if not line["loader"]:
        if content is not None:
            messages.detail(
                "updates: no boot loader here (update-grub absent): the drop-in is written, nothing applies it"
            )
        return
    if changed or stale:
        grub_updated(name="GRUB's configuration regenerated for the kernel's command line (update-grub)")
    for reason in cmdline_missing(line["running"], add, remove):
        messages.detail(f"updates: a reboot is pending (kernel command line: {reason})")


def firmware(settings: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """fwupd installed where firmware is read; with ``apply``, the updates it offers
    installed (a device whose update awaits a reboot is left alone: the reboot applies it)."""
    mode = settings["updates_firmware"]
    if mode == "off":
        return
    if state["packages"].get(FWUPD_PACKAGE) is None:
        # Reading firmware never fails the deploy: where apt cannot install fwupd, the
        # report says so and the rest of the concern goes on; only "apply" insists.
        if mode == "report" and reading.value(CANDIDATES).get(FWUPD_PACKAGE) is None:
            messages.detail(f"updates: firmware not read: {NOT_INSTALLABLE}")
            return
        install_packages(name="Install fwupd (updates_firmware)", packages=[FWUPD_PACKAGE], optional=mode == "report")
    if mode != "apply" or state["packages"].get(FWUPD_PACKAGE) is None:
        return  # a fresh fwupd is read at the next run (its metadata comes with its refresh timer)
    found = reading.value(firmware_part(settings))
    if host_output.fact_failed():
        return
    if found["fwupd"] == "error":
        messages.detail(f"updates: firmware not read: {found['error']}")
        return
    if found["reboot"]:
        messages.detail(f"updates: a reboot is pending ({found['reboot']})")
    waiting = {d["id"] for d in found["devices"] if d["update_state"] in AWAITING_REBOOT}
    offered = [u for u in found["updates"] if u["id"] not in waiting]
    if offered:
        what = ", ".join(f"{u['name']} {u['version']} -> {u['available']}" for u in offered)
        messages.detail(f"updates: firmware updates: {what}; a reboot applies them")
        firmware_applied(
            name=f"Firmware updated through fwupd ({what}), reboot marked", devices=[u["id"] for u in offered]
        )
