"""Versions across a fleet: one row per host, one column per version, differing cells marked;
then each GPU's state (temperature, power, SM clock, the GPU policy's cap, active clock event
reasons).

    sparkrig report INVENTORY [--limit GROUP_OR_HOST] [--json] [--html PAGE]

Each host is read once, with one remote command: the :class:`sparkrig.operations.updates.facts.Versions`
part of the host's one reading, with the arguments its settings give (as a deploy reads
it), fwupd's view of its firmware (:class:`sparkrig.operations.updates.facts.Firmware`,
unless ``updates_firmware`` is off), what it is (its hardware profile) and the GPU policy's
:class:`sparkrig.operations.gpu_policy.facts.GpuState` (read-only), and NCCL's builds
(:class:`sparkrig.nccl.NcclBuilds`: the venv's wheel, the system's libnccl2, a prefix build, each
by its version and sha256; the nccl column is marked on every node of a cluster whose nodes
differ, and on a host with one version in two builds, each named after the table). A cell that
differs from what most hosts have is marked with ``*`` (never a GPU state cell); a firmware
device whose version differs from most hosts of the same hardware profile is marked in the
firmware table after the versions ("fwupd reports no devices" where it shows none). A host that cannot
be reached or read gets one line saying why, and the exit status is 1. ``--html PAGE`` also
writes the fleet page (:mod:`sparkrig.tools.fleet_page`) with these versions; the compliance suite's
``--fleet-page`` writes it with every control's outcome too.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from sparkrig import host_output, nccl, reading
from sparkrig import profile as profiles
from sparkrig.connection import from_slash
from sparkrig.host_output import printable
from sparkrig.operations import declaring
from sparkrig.operations.gpu_policy.deploy import GPU
from sparkrig.operations.updates import boots, known_bad
from sparkrig.operations.updates.deploy import boots_part, firmware_part, versions_part
from sparkrig.operations.updates.facts import AWAITING_REBOOT, pending_reboot
from sparkrig.settings import resolved, validate_hosts
from sparkrig.tools import cli, fleet_page
from sparkrig.tools.inventory import REPO, limit_hosts

COLUMNS = (
    "os",
    "dgx_os",
    "kernel",
    "kernel_pkgs",
    "driver",
    "driver_pkgs",
    "cuda",
    "docker",
    "toolkit",
    "torch",
    "vllm",
    "reboot",
    "firmware",
    "known_bad",
    "nccl",
    "boots",
)
# The GPU's state, after the versions: never marked (it differs from host to host by nature).
GPU_COLUMNS = fleet_page.STATE_COLUMNS
MARK = "*"
WAITING = "(installed, runs after a reboot)"
NONE = "-"
NO_DEVICES = "fwupd reports no devices"


def _versions(installed: Mapping[str, str]) -> str:
    """Installed packages' versions, each once (a kernel's image and meta package share one)."""
    return " ".join(sorted(set(installed.values()))) or NONE


def firmware_summary(firmware: Mapping[str, Any] | None) -> str:
    """One host's firmware cell, from its :class:`sparkrig.operations.updates.facts.Firmware`
    (None: not read, ``updates_firmware = "off"``)."""
    if firmware is None:
        return NONE
    if firmware["fwupd"] == "absent":
        return "fwupd not installed" + (f": {firmware['error']}" if firmware["error"] else "")
    if firmware["fwupd"] == "error":
        return f"not read: {firmware['error']}"
    count = len(firmware["devices"])
    return f"{count} device{'s' * (count != 1)}" if count else NO_DEVICES


def device_label(device: Mapping[str, Any]) -> str:
    """A firmware device as the report names it: its name, and its first GUID where fwupd gave
    one (the same model of device on another host has the same GUID)."""
    return f"{device['name']} {{{device['guids'][0]}}}" if device["guids"] else device["name"]


def firmware_cells(firmware: Mapping[str, Any] | None) -> dict[str, str]:
    """Each device's firmware version (two devices of one model: both versions)."""
    found: dict[str, set[str]] = {}
    for device in (firmware or {}).get("devices", []):
        found.setdefault(device_label(device), set()).add(device["version"])
    return {label: " ".join(sorted(versions)) for label, versions in found.items()}


def awaiting_reboot(firmware: Mapping[str, Any] | None) -> list[str]:
    """The devices whose firmware fwupd installed and that run it only after a reboot (its
    UpdateState pending or needs-reboot): what the host runs is not what it has."""
    return sorted(
        {device_label(d) for d in (firmware or {}).get("devices", []) if d.get("update_state") in AWAITING_REBOOT}
    )


def firmware_drift(cells: Mapping[str, Mapping[str, str]], profile: Mapping[str, str]) -> dict[str, list[str]]:
    """For each host, the devices whose firmware version is not the one most hosts of its
    hardware profile have (with no single most common version, every version not shared by
    all of them): the same device, on boxes of one kind, at different versions."""
    found: dict[str, list[str]] = {name: [] for name in cells}
    for kind in sorted(set(profile[name] for name in cells)):
        group = {name: devices for name, devices in cells.items() if profile[name] == kind}
        for device in sorted({d for devices in group.values() for d in devices}):
            counts = Counter(devices[device] for devices in group.values() if device in devices)
            if len(counts) < 2:
                continue
            (top, n), *rest = counts.most_common()
            tie = bool(rest) and rest[0][1] == n
            for name, devices in group.items():
                if device in devices and (tie or devices[device] != top):
                    found[name].append(device)
    return found


def _each(gpus: Sequence[Mapping[str, Any]], cell) -> str:
    """One cell over every GPU of a host (GPUs apart by spaces), ``-`` where none answered."""
    return " ".join(cell(g) for g in gpus) or NONE


def _n(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def gpu_cells(state: Mapping[str, Any] | None) -> dict[str, str]:
    """A host's GPU cells, from its :class:`GpuState` (None: not read)."""
    gpus = (state or {}).get("gpus") or []
    record = ((state or {}).get("applied") or {}).get("settings", {}).get("clock_max_mhz")
    cap = (
        NONE
        if record is None
        else f"{record['value']} MHz" + ("" if record["ok"] else f" failed (exit {record['exit']})")
    )
    return {
        "gpu_temp": _each(gpus, lambda g: f"{_n(g['temperature_c'])} °C"),
        "gpu_power": _each(gpus, lambda g: f"{_n(g['power_draw_w'])}/{_n(g['power_limit_w'])} W"),
        "gpu_clock": _each(gpus, lambda g: f"{_n(g['clocks_sm_mhz'])}/{_n(g['clocks_max_sm_mhz'])} MHz"),
        "gpu_cap": cap if gpus else NONE,
        "gpu_reasons": _each(gpus, lambda g: ",".join(g["reasons"] or []) or "none"),
    }


def nccl_cell(builds: Mapping[str, Mapping[str, Any]] | None) -> str:
    """A host's NCCL builds (:class:`sparkrig.nccl.NcclBuilds`): where each comes from, the
    version its library says and the start of its sha256 (``venv 2.28.9+cuda13.0@1c8618b8``)."""
    return (
        " ".join(
            f"{key.split(' ')[0]} {nccl.line_version(build)}@{build['sha256'][:8]}"
            for key, build in sorted((builds or {}).items())
        )
        or NONE
    )


def nccl_problems(facts: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """For each host, what is wrong with its NCCL: the nodes of its cluster whose builds
    differ (every node of that cluster gets the line), and one version in two builds on the
    host itself."""
    found: dict[str, list[str]] = {name: [] for name in facts}
    clusters: dict[str, dict[str, Any]] = {}
    for name, value in facts.items():
        if value.get("cluster"):
            clusters.setdefault(value["cluster"], {})[name] = value.get("nccl") or {}
    for cluster, nodes in sorted(clusters.items()):
        differing = nccl.cluster_differences(nodes)
        if differing:
            for name in nodes:
                found[name].append(f"cluster {cluster}: NCCL differs across its nodes: " + "; ".join(differing))
    for name, value in facts.items():
        builds = value.get("nccl") or {}
        for a, b in nccl.twins(builds):
            found[name].append(
                f"one NCCL version, two builds: {a} is {nccl.describe(builds[a])}, {b} is {nccl.describe(builds[b])}"
            )
    return found


def row(
    facts: Mapping[str, Any],
    firmware: Mapping[str, Any] | None = None,
    gpu: Mapping[str, Any] | None = None,
    bad: Sequence[str] = (),
    builds: Mapping[str, Any] | None = None,
    history: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """One host's cells, from its :class:`sparkrig.operations.updates.facts.Versions`,
    :class:`sparkrig.operations.updates.facts.Firmware` (None: not read), :class:`GpuState`,
    the known-bad versions it runs (``bad``: :func:`known_bad.running`'s lines), its NCCL
    builds (:class:`sparkrig.nccl.NcclBuilds`) and how its last boots ended (``history``:
    :class:`boots.BootHistory`, None: not read)."""
    os_release, dgx, packages = facts["os"], facts["dgx"], facts["packages"]
    python = facts["python"]
    vllm = [version for name, version in python.items() if name != "torch"]
    return {
        "os": " ".join(filter(None, (os_release.get("ID"), os_release.get("VERSION_ID")))) or NONE,
        "dgx_os": dgx.get("DGX_OTA_VERSION") or dgx.get("DGX_SWBUILD_VERSION") or NONE,
        "kernel": facts["kernel"] or NONE,
        "kernel_pkgs": _versions(packages["kernel"]),
        "driver": facts["driver"] or NONE,
        "driver_pkgs": _versions(packages["driver"]),
        "cuda": facts["cuda"] or NONE,
        "docker": _versions(packages["docker"]),
        "toolkit": _versions(packages["toolkit"]),
        "torch": python.get("torch") or NONE,
        "vllm": " ".join(sorted(set(vllm))) or NONE,
        "reboot": "pending" if pending_reboot(facts) or (firmware and firmware["reboot"]) else NONE,
        "firmware": firmware_summary(firmware),
        "known_bad": " ".join(known_bad.names(bad)) or NONE,
        "nccl": nccl_cell(builds),
        "boots": boots.summary(history) if history else NONE,
        **gpu_cells(gpu),
    }


def differing(
    rows: Mapping[str, Mapping[str, str]],
    drift: Mapping[str, Sequence[str]] | None = None,
    nccl_lines: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[str]]:
    """For each host, the columns whose value is not the one most hosts have (with no single
    most common value, every cell of that column that is not shared by all); the firmware
    column where the host has firmware drift (:func:`firmware_drift`: by device and hardware
    profile, not by its summary); the NCCL column where :func:`nccl_problems` found one (a
    cluster's nodes must be alike; hosts of different clusters may differ)."""
    found: dict[str, list[str]] = {name: [] for name in rows}
    for name, cells in rows.items():
        if (drift or {}).get(name):
            found[name].append("firmware")
        if (nccl_lines or {}).get(name):
            found[name].append("nccl")
        if cells.get("known_bad", NONE) != NONE:  # marked wherever it is, however many hosts run it
            found[name].append("known_bad")
        if any(end in cells.get("boots", "").split(", ") for end in boots.UNCLEAN):  # wherever one is
            found[name].append("boots")
    for column in COLUMNS:
        if column in ("firmware", "known_bad", "nccl", "boots"):
            continue
        counts = Counter(cells[column] for cells in rows.values())
        if len(counts) < 2:
            continue
        (top, n), *rest = counts.most_common()
        tie = bool(rest) and rest[0][1] == n
        for name, cells in rows.items():
            if tie or cells[column] != top:
                found[name].append(column)
    return found


def table(
    rows: Mapping[str, Mapping[str, str]],
    errors: Mapping[str, str],
    firmware: Mapping[str, Mapping[str, Any]] | None = None,
    bad: Mapping[str, Sequence[str]] | None = None,
    nccl_lines: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The fleet as a text table, a legend, and one line per host that could not be read;
    with ``firmware`` (host -> its ``firmware`` of the JSON report), each host's devices after
    the table, drift marked."""
    firmware = firmware or {}
    marks = differing(rows, {name: f["drift"] for name, f in firmware.items()}, nccl_lines)
    header = ["host", *COLUMNS, *GPU_COLUMNS]
    lines = [
        [name, *(printable(cells[c]) + (f" {MARK}" if c in marks[name] else "") for c in (*COLUMNS, *GPU_COLUMNS))]
        for name, cells in rows.items()
    ]
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    out = ["  ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip() for r in [header, *lines]]
    if any(marks.values()):
        bad_marked = any("known_bad" in columns for columns in marks.values())
        nccl_marked = any("nccl" in columns for columns in marks.values())
        boots_marked = any("boots" in columns for columns in marks.values())
        out.append(
            f"{MARK}: differs from most hosts"
            + "; known_bad: a known-bad version runs or is installed" * bad_marked
            + "; nccl: a cluster's nodes differ, or one version is two builds on a host" * nccl_marked
            + f"; boots (oldest first): one ended uncleanly ({', '.join(boots.UNCLEAN)})" * boots_marked
        )
    out += [f"{name}: {printable(line)}" for name, lines in (bad or {}).items() for line in lines]
    out += [f"{name}: {printable(line)}" for name, lines in (nccl_lines or {}).items() for line in lines]
    out += [f"{name}: not read: {printable(why)}" for name, why in errors.items()]
    if firmware:
        out += ["", *firmware_table(firmware)]
    return "\n".join(out)


def firmware_table(firmware: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each host's firmware devices (name {GUID}, version), drifting ones marked; a host whose
    fwupd shows none says so."""
    lines = [["host", "profile", "firmware device", "version"]]
    for name, found in firmware.items():
        if not found["devices"]:
            lines.append([name, found["profile"], found["summary"], ""])
        for device, version in found["devices"].items():
            waiting = device in found.get("awaiting_reboot", ())
            mark = f" {MARK}" if device in found["drift"] and not waiting else ""
            lines.append([name, found["profile"], device, version + mark + (f" {WAITING}" if waiting else "")])
    lines = [[printable(cell) for cell in line] for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    out = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    if any(set(found["drift"]) - set(found.get("awaiting_reboot", ())) for found in firmware.values()):
        out.append(f"{MARK}: firmware differs from most hosts of its hardware profile")
    if any(found.get("awaiting_reboot") for found in firmware.values()):
        out.append(f"{WAITING}: firmware installed by fwupd, running only after a reboot (drift until then)")
    return out


def page_hosts(report: Mapping[str, Any]) -> dict[str, fleet_page.Host]:
    """The fleet page's hosts from this tool's ``--json`` report: versions, marks, when read,
    and why a host was not read."""
    hosts = {
        name: fleet_page.Host(
            versions=value["versions"],
            differs=value["differs"],
            versions_read=report.get("read", ""),
            firmware=value.get("firmware") or {},
        )
        for name, value in report["hosts"].items()
    }
    for name, why in report["errors"].items():
        hosts[name] = fleet_page.Host(versions_error=why)
    return hosts


def read_fleet(inventory: str, limit: Sequence[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """Each host's :class:`Versions`, :class:`Firmware` (unless ``updates_firmware`` is off)
    and hardware profile, in one command per host (hosts in parallel), and why a host could
    not be read. Settings are validated first, as a deploy validates them."""
    # Imported here, when the fleet is read: pyinfra's CLI modules patch this process for
    # gevent, as the pyinfra command does.
    from gevent import pool  # noqa: PLC0415
    from pyinfra.api import Config, State  # noqa: PLC0415
    from pyinfra.api.connect import connect_all  # noqa: PLC0415
    from pyinfra.api.exceptions import PyinfraError  # noqa: PLC0415
    from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state  # noqa: PLC0415
    from pyinfra_cli.inventory import make_inventory  # noqa: PLC0415

    # As the pyinfra command sets itself up (pyinfra_cli.cli): the inventory file runs in
    # a state and config of its own.
    state = State(check_for_changes=False)
    state.cwd = str(REPO)
    ctx_state.set(state)
    config = Config()
    ctx_config.set(config)
    inventory_obj = make_inventory(inventory, cwd=str(REPO))
    ctx_inventory.set(inventory_obj)
    chosen = set(limit_hosts({h.name: list(h.groups) for h in inventory_obj}, limit))
    hosts = [h for h in inventory_obj if h.name in chosen]
    declaring()  # every concern's settings, as the deploy validates them
    validate_hosts([(h.name, h.data.dict()) for h in hosts], [(h.name, h.data.dict()) for h in inventory_obj])
    state.init(inventory_obj, config, initial_limit=hosts)
    from_slash(inventory_obj)  # as config.py makes a deploy's commands run from /
    facts: dict[str, dict] = {}
    errors: dict[str, str] = {}
    try:
        connect_all(state)
    except PyinfraError as error:  # pyinfra gives up when no host (or too few) could be reached
        return {}, {h.name: f"could not connect ({error})" for h in hosts}

    def read(host) -> None:
        if host not in state.activated_hosts:
            errors[host.name] = "could not connect (see above)"
            return
        with ctx_state.use(state), ctx_host.use(host):
            settings = resolved(host.data.dict())
            part = versions_part(settings)
            firmware = firmware_part(settings) if settings["updates_firmware"] != "off" else None
            builds = reading.part(nccl.NcclBuilds, venv=settings["python_venv_path"])
            history = boots_part(settings) if settings["updates_boot_history"] else None
            parts = [
                part,
                profiles.IDENTITY,
                builds,
                *([firmware] if firmware else []),
                *([history] if history else []),
            ]
            try:
                values = reading.read([*parts, GPU])
            except Exception as error:  # a host that fails is reported, never the fleet
                errors[host.name] = host_output.failure() or f"{type(error).__name__}: {error}"
                return
            if host in state.failed_hosts:
                errors[host.name] = host_output.failure() or "its output could not be read (see above)"
            else:
                profile = host_profile(settings, values[profiles.IDENTITY])
                entries = known_bad.applicable({**settings, "hardware_profile": profile})
                facts[host.name] = {
                    "versions": values[part],
                    "firmware": values[firmware] if firmware else None,
                    "profile": profile,
                    "gpu": values[GPU],
                    "known_bad": known_bad.running(entries, values[part], values[firmware] if firmware else None),
                    "nccl": values[builds],
                    "cluster": settings["cluster_name"],
                    "boots": values[history] if history else None,
                }

    workers = pool.Pool(32)
    for host in hosts:
        workers.spawn(read, host)
    workers.join()
    ordered = {h.name: facts[h.name] for h in hosts if h.name in facts}
    return ordered, {h.name: errors[h.name] for h in hosts if h.name in errors}


def host_profile(settings: Mapping[str, Any], identity: Mapping[str, Any]) -> str:
    """The host's hardware profile: its setting, or for "auto" the one profile the box matches
    ("unmatched" where none or several do: such hosts are compared among themselves)."""
    chosen = settings["hardware_profile"]
    if chosen != "auto":
        return chosen
    return profiles.choose_profile(settings["hardware_profiles"], identity)[0] or "unmatched"


def build(facts: Mapping[str, Mapping[str, Any]], errors: Mapping[str, str], read: str) -> dict[str, Any]:
    """The JSON report from each host's readings (:func:`read_fleet`)."""
    cells = {name: firmware_cells(value["firmware"]) for name, value in facts.items()}
    drift = firmware_drift(cells, {name: value["profile"] for name, value in facts.items()})
    waiting = {name: awaiting_reboot(value["firmware"]) for name, value in facts.items()}
    drift = {name: sorted({*drift[name], *waiting[name]}) for name in drift}
    rows = {
        name: row(
            value["versions"],
            value["firmware"],
            value.get("gpu"),
            value.get("known_bad", ()),
            value.get("nccl"),
            value.get("boots"),
        )
        for name, value in facts.items()
    }
    problems = nccl_problems(facts)
    marks = differing(rows, drift, problems)
    return {
        "columns": [*COLUMNS, *GPU_COLUMNS],
        "hosts": {
            name: {
                "versions": rows[name],
                "differs": marks[name],
                "facts": facts[name]["versions"],
                "gpu": facts[name].get("gpu"),
                "known_bad": list(facts[name].get("known_bad", ())),
                "nccl": {"builds": facts[name].get("nccl") or {}, "problems": problems[name]},
                "boots": facts[name].get("boots"),
                "firmware": {
                    "profile": facts[name]["profile"],
                    "summary": rows[name]["firmware"],
                    "devices": cells[name],
                    "drift": drift[name],
                    "awaiting_reboot": waiting[name],
                    "facts": facts[name]["firmware"],
                },
            }
            for name in rows
        },
        "errors": dict(errors),
        "read": read,
    }


@cli.command("report", "each host's versions and GPU state, one row per host, differing cells marked")
def main(argv: Sequence[str] | None = None) -> int:
    # As pyinfra's CLI does: the hosts are read concurrently on gevent.
    from gevent import monkey  # noqa: PLC0415 - patches this process: only when the command runs

    monkey.patch_all()
    parser = cli.parser("report", __doc__)
    parser.add_argument("inventory", help="pyinfra inventory, e.g. inventory/spark.py")
    parser.add_argument("--limit", action="append", default=[], help="as pyinfra's --limit (group or host glob)")
    parser.add_argument("--json", action="store_true", help="print JSON: each host's cells, marks and facts")
    parser.add_argument("--html", metavar="PAGE", help="also write the fleet page (one HTML file) to PAGE")
    args = parser.parse_args(argv)
    facts, errors = read_fleet(args.inventory, args.limit)
    report = build(facts, errors, fleet_page.now())
    if args.html:
        fleet_page.write(
            args.html,
            fleet_page.render(
                page_hosts(report), columns=(*COLUMNS, *GPU_COLUMNS), source=f"sparkrig report {args.inventory}"
            ),
        )
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(
            table(
                {name: value["versions"] for name, value in report["hosts"].items()},
                errors,
                {
                    name: value["firmware"]
                    for name, value in report["hosts"].items()
                    if value["firmware"]["facts"] is not None
                },
                {name: value["known_bad"] for name, value in report["hosts"].items() if value["known_bad"]},
                {name: v["nccl"]["problems"] for name, v in report["hosts"].items() if v["nccl"]["problems"]},
            )
        )
        if args.html:
            print(f"fleet page: {args.html}")
    return 1 if errors else 0


if __name__ == "__main__":
    from gevent import monkey

    monkey.patch_all()
    sys.exit(main())
