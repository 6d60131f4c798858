"""
Updates controls: the kernel, driver and firmware a box must run, holds that hold, unattended
upgrades as the owner set them, and no systemd-oomd beside earlyoom.

What the host must show is worked out here from the settings, independently of the code
that converges (operations/updates/).
"""

from __future__ import annotations

import fnmatch
import json
import re

import pytest

from sparkrig.operations.updates import known_bad
from sparkrig.profile import AUTO, choose_profile

from .reads import need

PIN_FILE = "/etc/apt/preferences.d/sparkrig-holds"
APT_CONF = "/etc/apt/apt.conf.d/99sparkrig-updates"
RECORD = "/var/lib/sparkrig/updates-held"
TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")
# fwupdmgr waits on fwupd over D-Bus: stopped after this long (above D-Bus's 25 s activation).
FWUPD_TIMEOUT_S = 45


def _fwupd_devices() -> str:
    """fwupdmgr's device list, stopped after FWUPD_TIMEOUT_S (read when asked: a test lowers it)."""
    return f"timeout -k 5 {FWUPD_TIMEOUT_S} fwupdmgr get-devices --json"


def _holds(settings) -> tuple[list[str], dict[str, str]]:
    """updates_hold as (names or globs held with apt-mark, {name: pinned version})."""
    marks, pins = [], {}
    for entry in settings["updates_hold"]:
        name, _, version = entry.partition("=")
        if version:
            pins[name] = version
        else:
            marks.append(name)
    return marks, pins


@need
def state(r) -> dict:
    """What the updates controls read of the host."""
    return {
        "kernel": r.run("uname -r"),
        "driver": r.run("cat /proc/driver/nvidia/version"),
        "smi": r.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader"),
        "installed": r.run("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'"),
        "pin_file": r.path(PIN_FILE),
        "pins": r.file(PIN_FILE),
        "apt_config": r.run("apt-config dump"),
        "unattended": r.package("unattended-upgrades"),
        "timers": {timer: r.service(timer) for timer in TIMERS},
        "files": {path: r.path(path) for path in (APT_CONF, RECORD)},
        "oomd": r.service("systemd-oomd.service"),
    }


@need
def firmware(r):
    """fwupd's devices (asked only where updates_expected_firmware expects some), as root."""
    if not r.settings["updates_expected_firmware"]:
        return None
    return r.run(_fwupd_devices(), sudo=True)


def _firmware_devices(answer) -> list[tuple[str, list[str], str]]:
    """(name, GUIDs in lower case, version) of each device fwupdmgr listed; a failure says why."""
    assert answer.rc not in (124, 137), f"fwupdmgr get-devices did not answer in {FWUPD_TIMEOUT_S} s"
    try:
        document = json.loads(answer.stdout)
    except ValueError:
        raise AssertionError(
            f"fwupdmgr get-devices --json exited {answer.rc}, printed {answer.stdout[:200]!r}"
        ) from None
    error = document.get("Error") if isinstance(document, dict) else None
    assert answer.rc == 0 and isinstance(document, dict), (
        f"fwupdmgr get-devices exited {answer.rc}: {error.get('Message') if isinstance(error, dict) else document}"
    )
    found = []
    for device in document.get("Devices", []):
        guids = device.get("Guid", [])
        guids = [guids] if isinstance(guids, str) else guids
        found.append((str(device.get("Name", "")), [str(g).lower() for g in guids], str(device.get("Version", ""))))
    return found


def _loaded_driver(found) -> str | None:
    proc = found["driver"]
    if proc.rc == 0:
        match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+){1,2})\s", proc.stdout)
        assert match, f"/proc/driver/nvidia/version says {proc.stdout[:200]!r}"
        return match[1]
    smi = found["smi"]
    return smi.stdout.split()[0] if smi.rc == 0 and smi.stdout.strip() else None


def test_the_running_kernel_is_the_expected_one(read, settings):
    """Protects against a box that an update moved to another kernel (DGX OS 7.4.0's
    6.17.0-1008 is reported to have broken boots and the driver): every box of a group runs
    the kernel its owner chose."""
    expected = settings["updates_expected_kernel"]
    if not expected:
        pytest.skip("updates_expected_kernel is not set for this host")
    running = read(state)["kernel"].check().strip()
    assert running == expected, f"kernel {running} is running, updates_expected_kernel is {expected}"


def test_the_loaded_driver_is_the_expected_one(read, settings):
    """Protects against a box whose NVIDIA driver differs from its fleet's (or is not loaded
    after a kernel update): CUDA and the containers were chosen for one driver."""
    expected = settings["updates_expected_driver"]
    if not expected:
        pytest.skip("updates_expected_driver is not set for this host")
    loaded = _loaded_driver(read(state))
    assert loaded == expected, (
        f"NVIDIA driver {loaded or '(none loaded)'} is loaded, updates_expected_driver is {expected}"
    )


def test_the_firmware_is_the_expected_version(read, settings):
    """Protects against a box whose firmware (system firmware, EC, ConnectX-7, NVMe) is not the
    version its fleet was proven with: a firmware update changes a box under its jobs as a
    kernel does, and boxes of one kind at different firmware behave differently."""
    expected = settings["updates_expected_firmware"]
    if not expected:
        pytest.skip("updates_expected_firmware is not set for this host")
    devices = _firmware_devices(read(firmware))
    named = sorted({name for name, _guids, version in devices if version})
    wrong = []
    for device, version in expected.items():
        matching = [(name, found) for name, guids, found in devices if name == device or device.lower() in guids]
        if not matching:
            reported = f"fwupd reports: {', '.join(named)}" if named else "fwupd reports no devices"
            wrong.append(f"firmware device {device!r} is not present ({reported})")
        wrong += [
            f"firmware of {name} is {found or '(no version)'}, updates_expected_firmware says {version}"
            for name, found in matching
            if found != version
        ]
    assert not wrong, "; ".join(wrong)


def _known_bad(settings, identity) -> list[dict]:
    """The known-bad entries for this host's hardware profile (the shipped list, data, and the
    owner's); with "auto" and no matching profile, the entries that name no profile."""
    name = settings["hardware_profile"]
    if name == AUTO:
        name = choose_profile(settings["hardware_profiles"], identity)[0]
    return known_bad.applicable({**settings, "hardware_profile": name or AUTO})


@need
def installed_versions(r):
    """Every installed package and its version."""
    return r.run("dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n'")


@need
def known_bad_firmware(r):
    """fwupd's devices, asked (as root) only where a known-bad entry names firmware."""
    entries = [*known_bad.shipped(), *r.settings["updates_known_bad"]]
    if not any(e["kind"] == "firmware" and e.get("running") for e in entries):
        return None
    return r.run(_fwupd_devices(), sudo=True)


def test_no_known_bad_version_runs_or_is_installed(read, settings, identity):
    """Protects against a kernel, driver or firmware version known to break this kind of box
    (kernel 7.0.0-1019 on a GB10: NCCL fails with ENOMEM across nodes): a box that runs one,
    or has one installed for its next boot, fails naming the entry, why, and where to read more;
    a rollout stops at its batch."""
    entries = _known_bad(settings, identity)
    found = read(state)
    kernel = found["kernel"].check().strip()
    driver = _loaded_driver(found) or ""
    installed = {}
    for line in read(installed_versions).check().splitlines():
        words = line.split()
        if len(words) == 3 and words[0][1:2] == "i":
            installed[words[1]] = words[2]
    answer = read(known_bad_firmware)
    devices = [] if answer is None else _firmware_devices(answer)
    wrong = []
    for entry in entries:
        glob, seen = entry.get("running"), []
        if glob and entry["kind"] == "kernel" and fnmatch.fnmatchcase(kernel, glob):
            seen.append(f"running kernel {kernel}")
        if glob and entry["kind"] == "driver" and driver and fnmatch.fnmatchcase(driver, glob):
            seen.append(f"running driver {driver}")
        if glob and entry["kind"] == "firmware":
            seen += [
                f"firmware {name} {version}"
                for name, guids, version in devices
                if entry["device"] in (name, *guids) and version and fnmatch.fnmatchcase(version, glob)
            ]
        for package, version in entry.get("packages", {}).items():
            seen += [
                f"installed {name} {have}"
                for name, have in sorted(installed.items())
                if fnmatch.fnmatchcase(name, package) and fnmatch.fnmatchcase(have, version)
            ]
        if seen:
            wrong.append(
                f"known-bad {entry['name']}: {', '.join(seen)}: {entry['reason']} ({' '.join(entry['links'])})"
            )
    assert not wrong, "; ".join(wrong)


# What grub-mkconfig reads of the kernel's command line: /etc/default/grub, then its drop-ins.
EFFECTIVE_CMDLINE = (
    "sh -c 'GRUB_CMDLINE_LINUX=; GRUB_CMDLINE_LINUX_DEFAULT=; "
    "[ -f /etc/default/grub ] && . /etc/default/grub; "
    'for f in /etc/default/grub.d/*.cfg; do [ -f "$f" ] && . "$f"; done; '
    'printf "%s %s\\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"\''
)


@need
def kernel_cmdline(r):
    """The command line the kernel booted with, the one GRUB's configuration gives, and whether
    a boot loader applies it (read only where updates_kernel_cmdline asks something)."""
    wanted = r.settings["updates_kernel_cmdline"]
    if not (wanted.get("add") or wanted.get("remove")):
        return None
    return {
        "proc": r.run("cat /proc/cmdline"),
        "config": r.run(EFFECTIVE_CMDLINE),
        "loader": r.run("command -v update-grub"),
    }


def _cmdline_wrong(words, add, remove) -> list[str]:
    wrong = [f"{word} is missing" for word in add if word not in words]
    return wrong + [f"{w} is present" for w in words for name in remove if w == name or w.startswith(f"{name}=")]


def test_the_kernel_command_line_is_as_set(read, settings):
    """Protects against a kernel booted without the parameter that keeps it working (kho=off
    against kernel 7.0.0-1019's CMA breakage on GB10), or with one the owner removed: GRUB's
    configuration must say it, and the running kernel must have booted with it."""
    wanted = settings["updates_kernel_cmdline"]
    add, remove = list(wanted.get("add", [])), list(wanted.get("remove", []))
    if not (add or remove):
        pytest.skip("updates_kernel_cmdline adds and removes nothing on this host")
    found = read(kernel_cmdline)
    config = found["config"].check().split()
    wrong = _cmdline_wrong(config, add, remove)
    assert not wrong, f"GRUB's configuration (/etc/default/grub and grub.d): {'; '.join(wrong)}"
    if found["loader"].rc != 0:
        pytest.skip(
            "no boot loader here (update-grub absent, as in a container): GRUB's configuration says "
            "updates_kernel_cmdline (checked); /proc/cmdline is not compared"
        )
    running = found["proc"].check().split()
    wrong = _cmdline_wrong(running, add, remove)
    assert not wrong, f"/proc/cmdline: {'; '.join(wrong)}: GRUB says it, the kernel did not boot with it (reboot)"


@need
def meminfo(r):
    """/proc/meminfo (its CMA lines)."""
    return r.run("cat /proc/meminfo")


def _cma(text: str) -> dict[str, int]:
    """CmaTotal and CmaFree of /proc/meminfo, in KiB (none where the kernel has no CMA)."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] in ("CmaTotal:", "CmaFree:") and words[1].isdigit() and words[2] == "kB":
            found[words[0][:-1]] = int(words[1])
    return found


def test_cma_free_is_never_above_cma_total(read, profile):
    """Protects against the kernel whose CMA accounting is broken (7.0.0-1019 on GB10: CmaFree
    above CmaTotal, and NCCL's ibv_reg_mr fails with ENOMEM across nodes), and a box whose CMA
    area is not what its hardware profile expects (where the profile says, cma_total_kib)."""
    cma = _cma(read(meminfo).check())
    if not cma:
        pytest.skip("/proc/meminfo has no CMA lines (a kernel without CMA)")
    assert set(cma) == {"CmaTotal", "CmaFree"}, f"/proc/meminfo has only {sorted(cma)}"
    assert cma["CmaFree"] <= cma["CmaTotal"], (
        f"CmaFree {cma['CmaFree']} kB is above CmaTotal {cma['CmaTotal']} kB: the CMA accounting of a broken "
        "kernel (7.0.0-1019 on GB10: NCCL fails with ENOMEM); boot the previous kernel or add kho=off"
    )
    expected = profile.get("cma_total_kib")
    if expected is not None:
        assert cma["CmaTotal"] == expected, (
            f"CmaTotal is {cma['CmaTotal']} kB, the hardware profile expects {expected} kB"
        )


def test_held_packages_are_held(read, settings):
    """Protects against an upgrade the owner did not decide: every installed package that
    updates_hold names (or matches) is held in dpkg, which apt and unattended-upgrades honour."""
    marks, _pins = _holds(settings)
    if not marks:
        pytest.skip("updates_hold holds nothing with apt-mark on this host")
    found = read(state)
    installed = found["installed"].check().splitlines()
    names = [line.split()[-1] for line in installed if line[1:2] == "i"]
    # dpkg's selection, the first letter of its status ("h": hold), is what apt-mark
    # showhold prints: read once, with the packages, instead of a second apt program.
    held = {line.split()[-1] for line in installed if line[:1] == "h"}
    wanted = {name for name in names if any(fnmatch.fnmatchcase(name, glob) for glob in marks)}
    assert wanted <= held, f"installed but not held: {sorted(wanted - held)}"


def test_pinned_packages_are_pinned_by_a_root_owned_file(read, settings):
    """Protects against a pin that is missing or that someone else can rewrite: apt installs
    whatever a preferences file says, as root."""
    _marks, pins = _holds(settings)
    found = read(state)
    pin_file = found["pin_file"]
    if not pins:
        assert not pin_file.exists, f"{PIN_FILE} exists, but updates_hold pins nothing"
        return
    assert (pin_file.user, pin_file.group) == ("root", "root") and pin_file.mode & 0o022 == 0
    records = [
        dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith("#"))
        for block in found["pins"].check().split("\n\n")
        if block.strip("\n# ")
    ]
    found = {r["Package"]: r["Pin"].removeprefix("version ") for r in records if r}
    assert found == pins
    weak = {r["Package"]: r["Pin-Priority"] for r in records if r and r["Pin-Priority"] != "1000"}
    assert not weak, f"pins below priority 1000 (apt may move them): {weak}"


def test_unattended_upgrades_are_as_the_owner_set_them(read, settings):
    """Protects against upgrades nobody decided (the default on GPU boxes is off) and against
    timers that disagree with apt's settings."""
    mode = settings["updates_unattended"]
    found = read(state)
    dump = found["apt_config"].check()
    value = re.findall(r'^APT::Periodic::Unattended-Upgrade "([^"]*)";$', dump, re.MULTILINE)
    wanted = "0" if mode == "off" else "1"
    assert value and value[-1] == wanted, (
        f"updates_unattended is {mode!r}, so apt-config should say APT::Periodic::Unattended-Upgrade "
        f'"{wanted}"; it says ' + (f'"{value[-1]}"' if value else "nothing (no file of apt.conf.d sets it)")
    )
    if mode != "off":
        assert found["unattended"].is_installed, f"updates_unattended is {mode!r}: unattended-upgrades is not installed"
    for timer in TIMERS:
        service = found["timers"][timer]
        enabled = service.said_enabled
        if enabled in ("", "not-found", "masked"):
            continue
        assert (service.is_running, enabled == "enabled") == (mode != "off",) * 2, (
            f"{timer}: {enabled}, updates_unattended is {mode!r}"
        )


def test_updates_files_are_root_owned_and_not_writable_by_others(read):
    """Protects against privilege escalation: apt runs as root whatever these files say."""
    for path in (APT_CONF, RECORD):
        f = read(state)["files"][path]
        if path == RECORD and not f.exists:
            continue
        assert f.is_file, f"{path} is missing"
        assert (f.user, f.group) == ("root", "root") and f.mode & 0o022 == 0, f"{path}: {f.user} {f.mode:o}"


def test_systemd_oomd_does_not_run_beside_earlyoom(read, settings):
    """Protects against a second OOM killer that kills a user's whole session (every job and
    shell in it) under memory pressure, racing earlyoom, which kills the one preferred process."""
    choice = settings["updates_systemd_oomd"]
    if choice == "keep" or (choice == "auto" and not settings["watchdog_enabled"]):
        pytest.skip(f"updates_systemd_oomd is {choice!r} here: systemd-oomd is the owner's")
    service = read(state)["oomd"]
    said = service.said_enabled
    assert said in ("", "not-found", "masked"), f"systemd-oomd.service is {said}"
    assert not service.is_running, "systemd-oomd is running beside earlyoom"


JOURNALD_DROP_IN = "/etc/systemd/journald.conf.d/90-sparkrig-persistent.conf"


@need
def journal(r):
    """journald's configuration as journald merges it, sparkrig's drop-in, systemd-pstore
    (read only where updates_boot_history keeps the journal)."""
    if not r.settings["updates_boot_history"]:
        return None
    return {
        "systemd": r.path("/run/systemd/system"),
        "config": r.run("systemd-analyze cat-config systemd/journald.conf"),
        "drop_in": r.path(JOURNALD_DROP_IN),
        "pstore": r.service("systemd-pstore.service"),
    }


def test_the_journal_is_kept_across_boots_and_crash_dumps_collected(read, settings):
    """Protects against a box that dies and leaves no trace: without the journal of the boot
    that ended (and the kernel's dump of a panic), nobody can tell a panic from an OOM storm
    from lost power, and `sparkrig report` cannot say how the boot ended."""
    if not settings["updates_boot_history"]:
        pytest.skip("updates_boot_history is False here: the journal is the owner's")
    found = read(journal)
    if not found["systemd"].is_directory:
        pytest.skip("systemd does not run here (no /run/systemd/system): there is no journal to keep")
    drop_in = found["drop_in"]
    assert drop_in.is_file, f"{JOURNALD_DROP_IN} is missing"
    assert drop_in.user == "root" and drop_in.mode & 0o022 == 0, f"{JOURNALD_DROP_IN}: {drop_in.user} {drop_in.mode:o}"
    # The last Storage= journald reads wins (its drop-ins after journald.conf, in order).
    storage = [
        line.split("=", 1)[1].strip() for line in found["config"].check().splitlines() if line.startswith("Storage=")
    ]
    assert storage[-1:] == ["persistent"], f"journald's Storage is {storage[-1] if storage else 'auto (unset)'}"
    said = found["pstore"].said_enabled
    assert said in ("", "not-found", "enabled", "static", "indirect"), (
        f"systemd-pstore.service is {said}: the kernel's crash dumps are not collected"
    )
