"""
The fleet's Prometheus controls: on the host prometheus_server names, Prometheus runs, listens
where the settings say (loopback by default), loaded its configuration, and scrapes every host
of the inventory, each one up.

Which hosts it must scrape is the inventory itself, read here; what Prometheus sees is asked of
it through its own HTTP API (its active targets), not read from its files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from .conftest import inventory_hosts as _inventory_hosts
from .conftest import inventory_name
from .reads import need
from .targets import LAB_INVENTORY, REPO, inventory_host_data

SERVICE = "prometheus.service"
JOB = "sparkrig"
FILES = ("/etc/prometheus/prometheus.yml", "/etc/prometheus/sparkrig.rules.yml", "/etc/default/prometheus")
# What the controls ask Prometheus' HTTP API, in one python (its start is most of the read's
# cost): the job's active targets and Prometheus' own metrics (it does not scrape itself),
# each answered or failed on its own, as JSON. Where a target is not up, or the job lists no
# target while the inventory serves hosts (argv[4]: how many), the targets are read
# again each second, at most argv[3] s, until every one is up: one failed scrape (a node
# exporter the converge just restarted, a host slow under load) is not yet a host down, as the
# fleet's own SparkHostDown alert waits two minutes of it, and a Prometheus the converge just
# started lists no target until its first discovery (an empty list, seen in the lab seconds
# after the first converge). A fleet that is all up is answered at once, and so is a host
# missing from a job that lists others (the configuration lacks it: waiting changes nothing).
API = """
import json, sys, time, urllib.request
url, job, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
expected = int(sys.argv[4])
def targets():
    with urllib.request.urlopen(url + "/api/v1/targets?state=active", timeout=10) as answer:
        found = json.load(answer)["data"]["activeTargets"]
    return [t for t in found if t.get("labels", {}).get("job") == job]
def metrics():
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        return answer.read().decode()
def answer(read):
    try:
        return read(), None
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"
started = time.monotonic()
found, failed = answer(targets)
def waiting(found):
    return (expected and not found) or any(t.get("health") != "up" for t in found)
while found is not None and time.monotonic() - started < limit and waiting(found):
    time.sleep(1)
    found, failed = answer(targets)
own, own_failed = answer(metrics)
json.dump({"targets": found, "targets_error": failed, "metrics": own, "metrics_error": own_failed}, sys.stdout)
"""


def api_answer(answer, part: str):
    """One part of :data:`API`'s answer (``targets``, ``metrics``); AssertionError saying why
    Prometheus did not give it."""
    found = json.loads(answer.check())
    if found.get(part) is None:
        raise AssertionError(f"Prometheus' API did not answer its {part}: {found.get(part + '_error')}")
    return found[part]


def api_url(listen: str) -> str:
    """Prometheus' HTTP API as its own host reaches it: every address (':PORT') through loopback."""
    address, port = listen.rsplit(":", 1)
    return f"http://{address or '127.0.0.1'}:{port}"


@pytest.fixture
def server(request, host, settings):
    if settings["prometheus_server"] != inventory_name(host):
        pytest.skip(f"Prometheus runs on {settings['prometheus_server']} (prometheus_server), not here")


@pytest.fixture(scope="session")
def inventory_hosts(request, host_data) -> dict[str, dict]:
    """Every host of the inventory (a --limit may leave some out of host_data)."""
    if request.config.sparkrig_targets == "inventory":
        return _inventory_hosts(request.config, limit=[])
    return inventory_host_data(str(REPO / LAB_INVENTORY)) if request.config.sparkrig_targets == "lab" else {}


@need
def state(r) -> dict:
    """What the Prometheus controls read of the host (the API only where it runs)."""
    if r.settings["prometheus_server"] != r.name:
        return {}
    url = api_url(r.settings["prometheus_listen"])
    return {
        "service": r.service("prometheus"),
        "files": {path: r.path(path) for path in FILES},
        "cmdline": r.run(f"tr '\\0' '\\n' < /proc/$(systemctl show --property MainPID --value {SERVICE})/cmdline"),
        "api": r.run(
            "python3 -I -c %s %s %s %s %s",
            API,
            url,
            JOB,
            str(fresh_scrape_wait_s(r.settings)),
            str(len(serving(r.inventory))),
        ),
    }


def serving(inventory: Mapping[str, dict] | None) -> list[str]:
    """The hosts of the inventory whose metrics its Prometheus scrapes (none where the suite
    has no inventory: a --hosts target)."""
    return [name for name, data in (inventory or {}).items() if data.get("metrics_enabled", True)]


def fresh_scrape_wait_s(settings) -> int:
    """How long a target that is not up is given to be scraped again, successfully: several
    intervals and the scrape's timeout (min(10, interval), as the deploy sets it), at least
    30 s and at most a minute."""
    interval = int(settings["prometheus_scrape_interval_s"])
    return min(60, max(30, 2 * interval + min(10, interval)))


def test_prometheus_is_enabled_and_running(read, server):
    """Protects against a fleet nobody watches between compliance runs: no memory alert
    before a box freezes, no host-down alert after."""
    service = read(state)["service"]
    assert service.is_enabled, "Prometheus would not start at boot"
    assert service.is_running, f"{SERVICE} is not running (journalctl -u {SERVICE} says why)"


def test_prometheus_listens_where_the_settings_say(read, settings, server):
    """Protects against an unauthenticated API (every metric of the fleet, the admin's queries)
    open on every address when the owner kept it on loopback: read from the running process."""
    argv = read(state)["cmdline"].check().splitlines()
    assert f"--web.listen-address={settings['prometheus_listen']}" in argv, argv


@pytest.mark.parametrize("path", FILES)
def test_prometheus_configuration_is_root_owned_and_not_writable_by_others(read, server, path):
    """Protects against someone other than root choosing what Prometheus scrapes, which
    alerts exist, or where its API listens."""
    f = read(state)["files"][path]
    assert f.is_file, f"{path} is missing"
    assert (f.user, f.group) == ("root", "root")
    assert f.mode & 0o022 == 0, f"{path} has mode {f.mode:o}"


def test_prometheus_loaded_its_configuration(read, server):
    """Protects against a configuration on disk that the running Prometheus refused at its
    last reload (it then keeps the old targets and rules, silently)."""
    own = api_answer(read(state)["api"], "metrics").splitlines()
    assert "prometheus_config_last_reload_successful 1" in own, [
        line for line in own if line.startswith("prometheus_config_last_reload")
    ]


def test_every_host_of_the_inventory_is_scraped_and_up(read, settings, server, inventory_hosts):
    """Protects against a host missing from the fleet's Prometheus, or one it cannot reach (a
    firewall, node exporter down or on loopback): its memory and kills would go unseen. A host
    that is not up, or every host while Prometheus lists none yet (the converge just started
    it), is given a bounded wait for a successful scrape, and a failure names the host that is
    not up and Prometheus' reason."""
    if not inventory_hosts:
        pytest.skip("the suite has no inventory (a --hosts target): which hosts to expect is unknown")
    problems = scrape_problems(api_answer(read(state)["api"], "targets"), serving(inventory_hosts))
    assert not problems, f"{settings['prometheus_server']}'s Prometheus: " + "; ".join(problems)


def scrape_problems(targets: list[dict], serving: list[str]) -> list[str]:
    """What is wrong with the scraping of each host, one entry a host: a serving host that is no
    target, or whose last scrape failed (when, and Prometheus' error), and a target that is no
    serving host of the inventory."""
    by_instance = {t.get("labels", {}).get("instance", "?"): t for t in targets}
    problems = []
    for name in serving:
        target = by_instance.get(name)
        if target is None:
            problems.append(f"{name} is not scraped (no target: converge the Prometheus host again)")
        elif target.get("health") != "up":
            # Prometheus' error may quote what the target answered: one line, bounded.
            error = " ".join(str(target.get("lastError") or "no error given").split())[:200]
            problems.append(
                f"{name} is {target.get('health', 'not up')} ({target.get('scrapeUrl', '?')}, last scrape "
                f"{str(target.get('lastScrape', 'never'))[:19]}: {error}; "
                f"check {name}'s node exporter and firewall)"
            )
    extra = sorted(set(by_instance) - set(serving))
    if extra:
        problems.append(f"scraped but not a serving host of the inventory: {', '.join(extra)}")
    return problems
