"""
Serving controls: each model the settings list is served by its unit, enabled and answering
where it was told to listen and nowhere else, its key root's alone, the probe's timer running,
and one completion coming back.

What each unit must be is worked out here from the settings (serving_models), independently
of the code that converges (operations/serving/).
"""

from __future__ import annotations

import ipaddress
import re

import pytest

from .reads import need

PROBE_TIMER = "sparkrig-serving-probe.timer"
HELPER = "/usr/local/sbin/sparkrig-serving"
DRAIN = "/var/lib/sparkrig/drain"


@pytest.fixture
def models(settings):
    found = settings.get("serving_models") or []
    if not found:
        pytest.skip("serving_models is empty for this host: it serves no model")
    return found


def _unit(name: str) -> str:
    return f"spark-serve-{name}.service"


@need
def state(r) -> dict:
    """What the serving controls read of the host."""
    return {
        "units": r.run(
            "systemctl show --property Id,ActiveState,UnitFileState,MainPID 'spark-serve-*.service' %s", PROBE_TIMER
        ),
        "listeners": r.run("ss -Hltnp", sudo=True),
        "keys": r.run(
            'for f in /etc/sparkrig/serving/*.key; do [ -e "$f" ] && stat -c \'%n %a %U %G %F\' "$f"; done; true',
            sudo=True,
        ),
        "drain": r.run("test -e %s && echo drained || echo serving", DRAIN),
    }


@need
def llama_server(r) -> dict | None:
    """What llama.cpp's server (serving_llama_server) and its directory are, where a model of
    this host is served by llama.cpp: path, owner's uid, mode, kind (links not followed)."""
    if not any(m.get("engine") == "llama.cpp" for m in r.settings.get("serving_models") or []):
        return None
    path = r.settings.get("serving_llama_server") or "/usr/local/bin/llama-server"
    return {"path": path, "stat": r.run("stat -c '%%n|%%u|%%a|%%F' -- %s %s", path, path.rsplit("/", 1)[0] or "/")}


def _shown(text: str) -> dict[str, dict[str, str]]:
    """systemctl show's blocks, by unit."""
    units: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in fields:
            units[fields["Id"]] = fields
    return units


def test_each_model_is_served_by_its_unit_enabled_and_active(read, models):
    """Protects against an endpoint that is gone after a reboot or a crash nobody noticed: each
    model's unit starts at boot and runs now (stopped only while the host is drained)."""
    found = read(state)
    units = _shown(found["units"].check())
    drained = found["drain"].check().strip() == "drained"
    for model in models:
        unit = units.get(_unit(model["name"]), {})
        assert unit.get("UnitFileState") == "enabled", f"{_unit(model['name'])}: {unit.get('UnitFileState')}"
        if not drained:
            assert unit.get("ActiveState") == "active", f"{_unit(model['name'])} is {unit.get('ActiveState')}"


def test_the_probe_timer_is_active(read, models):
    """Protects against an engine that hangs with requests waiting and is never restarted: the
    forward-progress probe's timer is enabled and running."""
    unit = _shown(read(state)["units"].check()).get(PROBE_TIMER, {})
    assert (unit.get("ActiveState"), unit.get("UnitFileState")) == ("active", "enabled"), unit


def test_each_endpoint_listens_where_configured_and_nowhere_else(read, models):
    """Protects against an endpoint on every address: each model's port is listened on at its
    listen address alone (the loopback unless the settings say otherwise)."""
    found = read(state)
    if found["drain"].check().strip() == "drained":
        pytest.skip("the host is drained: its endpoints are stopped")
    listeners = found["listeners"].check().splitlines()
    for model in models:
        port = model["port"]
        seen = set()
        for line in listeners:
            fields = line.split()
            if len(fields) < 4:
                continue
            address, _, got = fields[3].rpartition(":")
            if got == str(port):
                # ss writes "*" for every address of both families.
                seen.add("::" if address == "*" else address.strip("[]").split("%")[0])
        wanted = model.get("listen", "127.0.0.1")
        assert seen, f"nothing listens on port {port} ({model['name']})"
        assert {str(ipaddress.ip_address(a)) for a in seen} == {str(ipaddress.ip_address(wanted))}, (
            f"{model['name']}: port {port} listened on at {sorted(seen)}, configured {wanted}"
        )


def test_each_key_file_is_roots_alone(read, models):
    """Protects against an API key another local user can read (and so use, or leak): each
    keyed model's key is a regular file, root's, mode 0600."""
    keyed = {f"/etc/sparkrig/serving/{m['name']}.key" for m in models if m.get("key")}
    if not keyed:
        pytest.skip("no model of this host has key: True")
    lines = read(state)["keys"].check().splitlines()
    found = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines if " " in line}
    for path in sorted(keyed):
        assert found.get(path) == "600 root root regular file", f"{path}: {found.get(path, 'missing')}"


def test_llama_cpps_server_is_roots_alone(read, models):
    """Protects against a llama-server another user can change: what a llama.cpp model's unit
    runs, under root's memory guard and readiness, is a regular file root owns and only root may
    write, in a directory the same holds for."""
    found = read(llama_server)
    if found is None:
        pytest.skip("no model of this host is served by llama.cpp")
    lines = found["stat"].stdout.strip().splitlines()
    assert len(lines) == 2, f"{found['path']}: {found['stat'].stderr.strip() or 'not found'}"
    for line, kind in zip(lines, ("regular file", "directory"), strict=True):
        path, uid, mode, what = line.split("|", 3)
        assert what == kind, f"{path} is a {what}, not a {kind}"
        assert uid == "0", f"{path} is owned by uid {uid}, not root"
        assert not int(mode, 8) & 0o022, f"{path} is writable by group or others (mode {mode})"


@pytest.mark.action
def test_one_completion_answers(host, models, settings):
    """Protects against an endpoint whose port is open and whose /health says 200 while it
    produces nothing: one completion of one token comes back from each model."""
    drained = host.run("test -e %s", DRAIN).rc == 0
    if drained:
        pytest.skip("the host is drained: its endpoints are stopped")
    for model in models:
        with host.sudo():
            result = host.run("/usr/bin/python3 -I %s complete %s", HELPER, model["name"])
        assert result.rc == 0, f"{model['name']}: {result.stdout.strip()} {result.stderr.strip()}"
        assert re.search(r"one completion of one token answered", result.stdout), result.stdout
