"""Updates: the versions a fleet wants alike and the host's holds, read in one command, and
what they mean (a pending reboot, an unexpected kernel or driver)."""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output, rendering, user_files

from .settings import _DRIVER_VERSION, _KERNEL_RELEASE, _PACKAGE, PACKAGE_COLUMNS

RECORD = "/var/lib/sparkrig/updates-held"
NVIDIA_PROC = "/proc/driver/nvidia/version"
REBOOT_REQUIRED = "/run/reboot-required"


def _sh_glob_words(names: Iterable[str]) -> list:
    return [QuoteString(name) for name in names]


# For `sh -c SCRIPT`: the venv's torch and vLLM versions (as sparkrig-python-versions VENV
# NAME...), the loaded driver, and CUDA's version. torch's METADATA is about 30 KB.
METADATA_LIMIT = 1 << 20
_PYTHON_VERSIONS = rendering.script(
    "updates/python-versions.sh.j2",
    limit=METADATA_LIMIT,
    user_read=user_files.user_read('"$dir/METADATA"', METADATA_LIMIT),
    field=host_output.FIELD,
)
# A distribution's version as METADATA gives it (PEP 440's characters): anything else fails
# that host, naming the file, rather than reaching a report or a plan.
_PYTHON_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
_DRIVER = rendering.script("updates/driver.sh")
_FIRMWARE = rendering.script("updates/firmware.sh")
_CUDA = rendering.script("updates/cuda.sh")


def dist_name(name: str) -> str:
    """A distribution's name as its ``.dist-info`` directory spells it (PEP 427)."""
    return re.sub(r"[-_.]+", "_", name).lower()


class Versions(FactBase):
    """
    Returns the versions a fleet wants alike, and the host's holds.

    + packages: column -> package names or globs (``updates_packages``)
    + holds: the names or globs of ``updates_hold`` held with apt-mark (installed matches listed)
    + venv: the Python venv whose torch and vLLM are read
    + python: the distributions read in it (normalised names)

    .. code:: python

        {"os": {"ID": "ubuntu", "VERSION_ID": "24.04", "PRETTY_NAME": "Ubuntu 24.04.3 LTS"},
         "dgx": {"DGX_SWBUILD_VERSION": "7.2.3", "DGX_OTA_VERSION": "7.4.0"},
         "kernel": "6.17.0-1008-nvidia", "boot_kernels": ["6.17.0-1008-nvidia"],
         "reboot_required": False,
         "packages": {"kernel": {"linux-image-6.17.0-1008-nvidia": "6.17.0-1008.8"}, ...},
         "hold_matches": {"nvidia-driver-580-open": "580.95.05-0ubuntu1"},
         "held": ["nvidia-driver-580-open"], "record": [...],
         "driver": "580.95.05", "cuda": "13.0.2", "python": {"torch": "2.11.0", "vllm": "0.20.2"}}
    """

    def command(
        self,
        packages: Sequence = (),
        holds: Sequence[str] = (),
        venv: str = "",
        python: Sequence[str] = (),
    ) -> StringCommand:
        bits: list = [
            "sed -n 's/^\\(ID\\|VERSION_ID\\|PRETTY_NAME\\)=/os \\1=/p' /etc/os-release;",
            "if [ -f /etc/dgx-release ]; then sed -n 's/^\\(DGX_[A-Z_]*VERSION\\)=/dgx \\1=/p'",
            "/etc/dgx-release; fi;",
            "echo kernel $(uname -r);",
            'for f in /boot/vmlinuz-*; do [ -f "$f" ] && echo boot "${f#/boot/vmlinuz-}"; done;',
            f"if [ -e {REBOOT_REQUIRED} ]; then echo reboot; fi;",
        ]
        for column, names in dict(packages).items():
            if names:
                bits += [
                    f"dpkg-query -W -f='pkg {column} ${{db:Status-Abbrev}} ${{Package}} ${{Version}}\\n'",
                    *_sh_glob_words(names),
                    "2>/dev/null;",
                ]
        if holds:
            bits += [
                "dpkg-query -W -f='pkg hold ${db:Status-Abbrev} ${Package} ${Version}\\n'",
                *_sh_glob_words(holds),
                "2>/dev/null;",
            ]
        bits += [
            'dpkg --get-selections | awk \'$2 == "hold" { sub(/:.*/, "", $1); print "held", $1 }\';',
            f"if [ -f {RECORD} ]; then sed 's/^/record /' {RECORD}; fi;",
            "sh -c",
            QuoteString(_DRIVER),
            ";",
            "sh -c",
            QuoteString(_CUDA),
            ";",
        ]
        if venv and python:
            bits += [
                "sh -c",
                QuoteString(_PYTHON_VERSIONS),
                "sparkrig-python-versions",
                QuoteString(venv),
                *[QuoteString(name) for name in python],
                ";",
            ]
        return StringCommand(*bits, "true")

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found = self.default()
        cuda_json: list[str] = []
        cuda_dir = None
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "os" or kind == "dgx":
                key, _, value = rest.partition("=")
                words = shlex.split(value)
                found[kind][key] = words[0] if words else ""
            elif kind == "kernel":
                if not _KERNEL_RELEASE.fullmatch(rest):
                    raise ValueError(f"uname -r printed {rest!r}")
                found["kernel"] = rest
            elif kind == "boot":
                found["boot_kernels"].append(rest)
            elif kind == "reboot":
                found["reboot_required"] = True
            elif kind == "pkg":
                # "kernel ii  NAME VERSION" ("hi": held; no version: known, not installed)
                words = rest.split()
                if len(words) not in (3, 4):
                    raise ValueError(f"dpkg-query printed {rest[:120]!r}")
                column, status, name, version = (words + [""])[:4]
                if column not in (*PACKAGE_COLUMNS, "hold", "known_bad"):
                    raise ValueError(f"dpkg-query printed {rest[:120]!r}")
                if status[1:2] == "i" and version:
                    target = found["hold_matches"] if column == "hold" else found["packages"].setdefault(column, {})
                    target[name] = version
            elif kind == "held":
                found["held"].append(rest)
            elif kind == "record":
                if not _PACKAGE.fullmatch(rest):
                    raise ValueError(f"{RECORD} holds {rest!r}")
                found["record"].append(rest)
            elif kind == "nvproc":
                match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+){1,2})\s", rest + " ")
                if not match:
                    raise ValueError(f"{NVIDIA_PROC} says {rest[:120]!r}")
                found["driver"] = match[1]
            elif kind == "nvsmi":
                versions = set(rest.split())
                if len(versions) != 1 or not _DRIVER_VERSION.fullmatch(next(iter(versions))):
                    raise ValueError(f"nvidia-smi said {rest[:120]!r}")
                found["driver"] = versions.pop()
            elif kind == "cudadir":
                cuda_dir = rest
            elif kind == "cudajson":
                cuda_json.append(rest)
            elif kind == "python":
                name, where, said = rest.split(" ")
                metadata = f"{host_output.field(where, f'a .dist-info of {name}')}/METADATA"
                version = host_output.field(said, metadata)
                if version and not _PYTHON_VERSION.fullmatch(version):
                    raise ValueError(f"{metadata}: its Version {version[:80]!r} is not a version")
                found["python"][name] = version or "?"
            else:
                raise ValueError(f"unexpected line {line[:120]!r}")
        if cuda_json:
            found["cuda"] = str(json.loads("\n".join(cuda_json))["cuda"]["version"])
        elif cuda_dir:
            match = re.fullmatch(r".*/cuda-([0-9]+\.[0-9]+)", cuda_dir)
            found["cuda"] = match[1] if match else None
        return found

    @staticmethod
    def default() -> dict:
        return {
            "os": {},
            "dgx": {},
            "kernel": None,
            "boot_kernels": [],
            "reboot_required": False,
            "packages": {column: {} for column in PACKAGE_COLUMNS},
            "hold_matches": {},
            "held": [],
            "record": [],
            "driver": None,
            "cuda": None,
            "python": {},
        }


# fwupd ----------------------------------------------------------------------------------

# fwupdmgr is killed after this long: above D-Bus's own 25 s activation timeout, so that a
# daemon that cannot start is reported in fwupd's words, and a wedged one still ends.
FWUPD_TIMEOUT_S = 45
FWUPD_JSON_LIMIT = 4 << 20  # the script's cap on each JSON document (a real box's is ~20 KB)
# fwupd's FwupdUpdateState, as older releases send it (a number) and newer ones (its name).
UPDATE_STATES = ("unknown", "pending", "success", "failed", "needs-reboot", "failed-transient")
# The states in which an installed update takes effect only at the next boot.
AWAITING_REBOOT = ("pending", "needs-reboot")
_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DEVICE_ID = re.compile(r"[0-9a-f]{40}")
_FLAG = re.compile(r"[a-z0-9-]{1,64}")
_TEXT_LIMIT = 256


def _text(value: Any, what: str) -> str:
    """A string of fwupd's JSON as written (host_output.parses refuses one that is unclean)."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > _TEXT_LIMIT:
        raise ValueError(
            f"fwupd's {what} is not a string of at most {_TEXT_LIMIT} characters: "
            f"{host_output.printable(str(value)[:80])}"
        )
    return value


def _shown(value: Any, what: str) -> str:
    """A string of fwupd's JSON that is only shown (a device's name, its vendor, an error
    message): any string a device or its plugin reports, escaped here (``\\x1b``), so the
    deploy's operation names, the rollout's messages and the reports carry no control byte."""
    return host_output.printable(_text(value, what))


def _update_state(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"fwupd's UpdateState is {value!r}")
    if isinstance(value, int):
        if not 0 <= value < len(UPDATE_STATES):
            raise ValueError(f"fwupd's UpdateState is {value!r}")
        return UPDATE_STATES[value]
    if not _FLAG.fullmatch(value):
        raise ValueError(f"fwupd's UpdateState is {value[:80]!r}")
    return value


def fwupd_device(entry: Any) -> dict:
    """One device of fwupd's JSON (``fwupdmgr get-devices --json``), checked: its name, device
    id, GUIDs, version, vendor, plugin, flags and update state; ValueError naming the field
    that is not what fwupd writes."""
    if not isinstance(entry, dict):
        raise ValueError(f"a device of fwupd's is not an object: {str(entry)[:80]!r}")
    device_id = _text(entry.get("DeviceId"), "DeviceId")
    if not _DEVICE_ID.fullmatch(device_id):
        raise ValueError(f"fwupd's DeviceId is {device_id[:80]!r}")
    guids, flags = entry.get("Guid", []), entry.get("Flags", [])
    if isinstance(guids, str):  # one GUID, as some releases write it
        guids = [guids]
    if not isinstance(guids, list) or not all(isinstance(g, str) and _GUID.fullmatch(g) for g in guids):
        raise ValueError(f"fwupd's Guid of {device_id} is {str(guids)[:120]!r}")
    if not isinstance(flags, list) or not all(isinstance(f, str) and _FLAG.fullmatch(f) for f in flags):
        raise ValueError(f"fwupd's Flags of {device_id} are {str(flags)[:120]!r}")
    return {
        "name": _shown(entry.get("Name"), "Name") or device_id[:12],
        "id": device_id,
        "guids": [g.lower() for g in guids],
        "version": _text(entry.get("Version"), "Version"),
        "vendor": _shown(entry.get("Vendor"), "Vendor"),
        "plugin": _shown(entry.get("Plugin"), "Plugin"),
        "flags": flags,
        "update_state": _update_state(entry.get("UpdateState")),
    }


def fwupd_json(text: str, what: str) -> dict:
    """fwupdmgr's JSON document, as an object; ValueError when it is not one."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ValueError(f"fwupdmgr {what} --json printed no JSON ({error}): {text[:80]!r}") from None
    if not isinstance(document, dict):
        raise ValueError(f"fwupdmgr {what} --json printed {text[:80]!r}")
    return document


def fwupd_error(document: Mapping[str, Any], what: str, status: int, limit_s: int) -> str:
    """Why fwupdmgr gave no devices, in its words where it said them."""
    if status in (124, 137):
        return f"fwupdmgr {what} did not answer in {limit_s} s: stopped"
    said = document.get("Error")
    message = said.get("Message") if isinstance(said, dict) else None
    return f"fwupdmgr {what} exited {status}" + (f": {_shown(message, 'Error')}" if message else "")


def fwupd_devices(document: Mapping[str, Any], what: str) -> list[dict]:
    """The devices of a fwupdmgr JSON document that carry a firmware version (not a container's CPU)."""
    entries = document.get("Devices", [])
    if not isinstance(entries, list):
        raise ValueError(f"fwupdmgr {what} --json: Devices is {str(entries)[:80]!r}")
    return [device for device in map(fwupd_device, entries) if device["version"]]


# Why fwupd is absent where apt has no candidate for it (said by the report and the deploy).
NOT_INSTALLABLE = "fwupd cannot be installed here (apt has no candidate for it: offline, or not in the package lists)"


class Firmware(FactBase):
    """
    Returns fwupd's view of the box (``fwupdmgr get-devices --json``, run as root from /, killed
    after ``timeout_s``): the devices that carry a firmware version (system firmware, EC,
    ConnectX-7, NVMe...), and with ``updates`` the updates fwupd's metadata offers for them.

    ``reboot`` says why the box needs a reboot for its firmware ("" when it does not): an
    update fwupd installed that takes effect at the next boot (a device's UpdateState
    ``pending`` or ``needs-reboot``). **The rollout reads it** (tools/rollout.py, drained
    reboots): a host whose ``reboot`` is not empty needs a reboot, as ``/run/reboot-required``
    says for packages (``updates_firmware = "apply"`` also writes that file after an update).

    .. code:: python

        {"fwupd": "read",  # "absent" (not installed; "error" says when apt cannot install it) or "error"
         "error": "",
         "devices": [{"name": "System Firmware", "id": "a45d...", "guids": ["37c9..."],
                      "version": "2.91", "vendor": "NVIDIA", "plugin": "uefi_capsule",
                      "flags": ["internal", "updatable"], "update_state": ""}],
         "updates": [{"name": "System Firmware", "id": "a45d...", "version": "2.91", "available": "2.92"}],
         "reboot": ""}
    """

    def command(self, updates: bool = False, timeout_s: int = FWUPD_TIMEOUT_S) -> StringCommand:
        whats = ["get-devices", *(["get-updates"] if updates else [])]
        return StringCommand("sh -c", QuoteString(_FIRMWARE), "sparkrig-firmware", str(int(timeout_s)), *whats)

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found = self.default()
        for line in output:
            words = line.split(" ")
            if words[0] == "absent" and len(words) <= 2:
                found["fwupd"] = "absent"
                found["error"] = NOT_INSTALLABLE if words[1:] == ["(none)"] else ""
                continue
            if (
                len(words) != 5
                or words[0] != "fwupd"
                or words[1] not in ("get-devices", "get-updates")
                or not words[2].isdigit()
                or not words[3].isdigit()
            ):
                raise ValueError(f"unexpected line {line[:120]!r}")
            _, what, status, limit, encoded = words
            text = base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
            document = fwupd_json(text, what) if text.strip() else {}
            if what == "get-devices":
                if int(status) != 0:
                    found["fwupd"], found["error"] = "error", fwupd_error(document, what, int(status), int(limit))
                    continue
                found["fwupd"], found["devices"] = "read", fwupd_devices(document, what)
            elif int(status) == 0:  # 2: nothing to do (no update); others: no updates known
                for device in fwupd_devices(document, what):
                    releases = [r for r in document_releases(document, device["id"]) if r]
                    if releases:
                        found["updates"].append(
                            {
                                "name": device["name"],
                                "id": device["id"],
                                "version": device["version"],
                                "available": releases[0],
                            }
                        )
        found["reboot"] = firmware_reboot(found["devices"]) or ""
        return found

    @staticmethod
    def default() -> dict:
        return {"fwupd": "absent", "error": "", "devices": [], "updates": [], "reboot": ""}


def document_releases(document: Mapping[str, Any], device_id: str) -> list[str]:
    """The release versions fwupd's get-updates offers a device, newest first."""
    for entry in document.get("Devices", []):
        if isinstance(entry, dict) and entry.get("DeviceId") == device_id:
            releases = entry.get("Releases", [])
            if not isinstance(releases, list):
                raise ValueError(f"fwupd's Releases of {device_id} are {str(releases)[:80]!r}")
            return [_text(r.get("Version"), "a release's Version") if isinstance(r, dict) else "" for r in releases]
    return []


def firmware_reboot(devices: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the box needs a reboot for its firmware (an installed update that takes effect at
    the next boot), or None."""
    waiting = [f"{d['name']} ({d['update_state']})" for d in devices if d["update_state"] in AWAITING_REBOOT]
    return f"fwupd: firmware awaits a reboot: {', '.join(waiting)}" if waiting else None


# What the facts mean ---------------------------------------------------------------------


def _version_key(text: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


class BootId(FactBase):
    """Returns the host's boot id (/proc/sys/kernel/random/boot_id): new at every boot, as a rollout tells one."""

    command = "cat /proc/sys/kernel/random/boot_id"

    @host_output.parses
    def process(self, output: list[str]) -> str:
        if len(output) != 1 or not re.fullmatch(r"[0-9a-f-]{36}", output[0]):
            raise ValueError(f"boot_id reads {output[:1]!r}")
        return output[0]


def reboot_reasons(facts: Mapping[str, Any], firmware_pending: Sequence[str] = ()) -> list[str]:
    """Why a host needs a reboot, one reason each: a newer kernel installed than the one running,
    /run/reboot-required, each firmware update staged for the next boot (``firmware_pending``)."""
    boot = sorted(facts["boot_kernels"], key=_version_key)
    found = []
    if boot and facts["kernel"] and boot[-1] != facts["kernel"]:
        found.append(f"kernel {boot[-1]} is installed, {facts['kernel']} is running")
    if facts["reboot_required"]:
        found.append(f"{REBOOT_REQUIRED} exists")
    return found + [f"firmware: {line}" for line in firmware_pending]


def pending_reboot(facts: Mapping[str, Any]) -> str | None:
    """Why a reboot is pending (a newer kernel installed than the one running first), or None."""
    reasons = reboot_reasons(facts)
    return reasons[0] if reasons else None


def unexpected(settings: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    """Each expected version the host does not run, naming both."""
    found = []
    kernel, driver = settings["updates_expected_kernel"], settings["updates_expected_driver"]
    if kernel and facts["kernel"] != kernel:
        found.append(f"kernel {facts['kernel']} is running, updates_expected_kernel is {kernel}")
    if driver and facts["driver"] != driver:
        found.append(
            f"NVIDIA driver {facts['driver'] or '(none loaded)'} is loaded, updates_expected_driver is {driver}"
        )
    return found
