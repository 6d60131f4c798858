"""The fleet's Prometheus: settings and the checks across the inventory, the scrape targets,
the alert rules under `promtool test rules`, promtool's check before a file takes effect (the
deploy's own command, run here), and the plan for fresh, converged, changed and other hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkrig.operations import prometheus as pm
from sparkrig.operations.prometheus import deploy as pm_deploy
from sparkrig.operations.prometheus.settings import fleet_problems, scrape_targets, serving_targets
from sparkrig.settings import defaults, problems
from tests.unit.pyinfra_fake import HOST_STATE, execute, host_state, plan

DEFAULTS = defaults(pm.SETTINGS)
DATA = Path(__file__).parent / "data" / "prometheus"
ME = "@fake/spark"  # the fake connector's host
ON = {"prometheus_server": ME}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing (Debian's prometheus package: .ci/install installs it)")
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    return found


# Settings --------------------------------------------------------------------


def test_defaults_are_valid_and_off():
    assert problems(pm.SETTINGS, {}) == []
    assert DEFAULTS["prometheus_server"] is None
    assert DEFAULTS["prometheus_listen"] == "127.0.0.1:9090"  # loopback: no authentication


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"prometheus_server": 3}, "allowed is None (no Prometheus) or the inventory name"),
        ({"prometheus_server": "a b"}, "allowed is None (no Prometheus) or the inventory name"),
        ({"prometheus_listen": "9090"}, "allowed is ADDRESS:PORT"),
        ({"prometheus_listen": "0.0.0.0:99999"}, "allowed is ADDRESS:PORT"),
        ({"prometheus_listen": "127.0.0.01:9090"}, "allowed is ADDRESS:PORT"),
        ({"prometheus_listen": "127.0.0.1:9090 --web.enable-admin-api"}, "allowed is ADDRESS:PORT"),
        ({"prometheus_listen": "[::1]:9090"}, "allowed is ADDRESS:PORT"),
        ({"prometheus_scrape_interval_s": 0}, "allowed is an integer from 1 to 3600"),
        ({"prometheus_evaluation_interval_s": "15s"}, "allowed is an integer from 1 to 3600"),
        ({"prometheus_retention_days": 0}, "allowed is an integer from 1 to 3650"),
        ({"prometheus_memory_available_min_bytes": "8G"}, "allowed is an integer number of bytes"),
        ({"prometheus_memory_available_min_bytes": 1024}, "allowed is an integer number of bytes"),
        ({"prometheus_scrape_intervall_s": 5}, "not a sparkrig setting (did you mean prometheus_scrape_interval_s?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(pm.SETTINGS, data)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("listen", ["127.0.0.1:9090", "10.0.0.5:9090", ":9090", "localhost:9090", "0.0.0.0:1"])
def test_listen_addresses_allowed(listen):
    assert problems(pm.SETTINGS, {"prometheus_listen": listen}) == []


def _fleet(**per_host):
    """Three hosts, Prometheus on spark-01, each host's metrics on its own address."""
    hosts = {
        "spark-01": {"prometheus_server": "spark-01", "metrics_listen": "127.0.0.1:9100", "ssh_hostname": "10.0.0.1"},
        "spark-02": {"prometheus_server": "spark-01", "metrics_listen": "192.168.1.2:9100", "ssh_hostname": "s2.lan"},
        "spark-03": {"prometheus_server": "spark-01", "metrics_listen": "0.0.0.0:9200", "ssh_hostname": "s3.lan"},
    }
    for name, data in per_host.items():
        hosts[name] = {**hosts[name], **data}
    return list(hosts.items())


def test_every_host_is_scraped_where_its_node_exporter_listens_and_named_by_its_inventory_name():
    assert scrape_targets(_fleet(), "spark-01") == [
        ("spark-01", "127.0.0.1:9100"),
        ("spark-02", "192.168.1.2:9100"),
        ("spark-03", "s3.lan:9200"),
    ]
    assert fleet_problems(_fleet(), _fleet()) == []


def test_a_host_without_metrics_listen_is_scraped_at_the_metrics_concerns_default_on_the_server_alone():
    everyone = [("spark-01", {"prometheus_server": "spark-01"})]
    assert scrape_targets(everyone, "spark-01") == [("spark-01", "127.0.0.1:9100")]


def test_ipv6_addresses_and_hosts_without_metrics():
    everyone = _fleet(
        **{
            "spark-02": {"metrics_listen": "[fd00::2]:9100"},
            "spark-03": {"metrics_listen": "127.0.0.1:9100", "metrics_enabled": False},
        }
    )
    assert scrape_targets(everyone, "spark-01") == [("spark-01", "127.0.0.1:9100"), ("spark-02", "[fd00::2]:9100")]
    assert fleet_problems(everyone, everyone) == []


def test_no_server_anywhere_is_no_problem_even_with_metrics_on_loopback():
    everyone = [(n, {"prometheus_server": None}) for n in ("a", "b")]
    assert fleet_problems(everyone, everyone) == []


def test_an_inventory_without_hosts_is_no_problem():
    """inventory/spark.py as shipped (its hosts commented out): pyinfra's debug-inventory
    stopped on an IndexError here."""
    assert fleet_problems([], []) == []


def test_hosts_that_disagree_on_the_server_are_each_named():
    everyone = _fleet(**{"spark-02": {"prometheus_server": "spark-02"}})
    found = fleet_problems(everyone, everyone)
    assert [host for host, _ in found] == ["spark-01", "spark-02", "spark-03"]
    assert (
        "prometheus_server = 'spark-02': allowed is the same host on every host of the inventory "
        "(spark-01 has 'spark-01')"
    ) in found[1][1]


def test_a_server_outside_the_inventory_is_refused():
    everyone = [(n, {**d, "prometheus_server": "spark-09"}) for n, d in _fleet()]
    found = fleet_problems(everyone, everyone)
    assert len(found) == 3
    assert "the inventory name of one of its hosts: spark-01, spark-02, spark-03" in found[0][1]


def test_metrics_on_loopback_on_another_host_than_the_server_is_refused_naming_that_host():
    everyone = _fleet(**{"spark-02": {"metrics_listen": "127.0.0.1:9100"}})
    assert fleet_problems(everyone, everyone) == [
        (
            "spark-02",
            (
                "metrics_listen = '127.0.0.1:9100': allowed is an address spark-01 (prometheus_server) can reach: "
                "not loopback on a host other than it"
            ),
        )
    ]
    # A run that leaves the server out writes no scrape configuration: nothing to refuse.
    assert fleet_problems(everyone[1:], everyone) == []


# The alert rules ---------------------------------------------------------------

TEST_THRESHOLD = 8 << 30  # what sparkrig.rules.test.yml expects


def _rules_dir(tmp_path: Path) -> Path:
    (tmp_path / "sparkrig.rules.yml").write_text(pm_deploy.render_rules(TEST_THRESHOLD))
    shutil.copy(DATA / "sparkrig.rules.test.yml", tmp_path)
    return tmp_path


def test_every_alert_rule_passes_its_promtool_test(tmp_path):
    """`promtool test rules`: for each rule, series that trip it and series that must not,
    and the alert's labels and summary at each evaluation."""
    promtool = _promtool()
    folder = _rules_dir(tmp_path)
    result = subprocess.run(
        [promtool, "test", "rules", "sparkrig.rules.test.yml"], cwd=folder, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_rule_has_a_promtool_test_that_expects_it_to_fire():
    rules = yaml.safe_load(pm_deploy.render_rules(TEST_THRESHOLD))
    alerts = [rule["alert"] for group in rules["groups"] for rule in group["rules"]]
    assert alerts == [
        "SparkMemoryLow",
        "SparkEarlyoomKill",
        "SparkGpuThrottled",
        "SparkComplianceFailed",
        "SparkRebootPending",
        "SparkLargeFreeBlocksExhausted",
        "SparkCmaAccountingBroken",
        "SparkUncleanBoot",
        "SparkHostDown",
        "SparkServingDown",
        "SparkServingStalled",
        "SparkServingRestartLoop",
        "SparkServingStartRefused",
    ]
    tests = yaml.safe_load((DATA / "sparkrig.rules.test.yml").read_text())["tests"]
    firing = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests for case in test["alert_rule_test"] if not case["exp_alerts"]}
    assert firing == quiet == set(alerts)


def test_the_memory_threshold_setting_is_the_rules_threshold(tmp_path):
    """With the threshold just under the test's 8 GB sample, the memory alert waits one more
    evaluation: promtool's test then fails at 30 s, where it expected the alert."""
    promtool = _promtool()
    folder = _rules_dir(tmp_path)
    (folder / "sparkrig.rules.yml").write_text(pm_deploy.render_rules(7_000_000_000))
    result = subprocess.run(
        [promtool, "test", "rules", "sparkrig.rules.test.yml"], cwd=folder, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "SparkMemoryLow" in result.stdout + result.stderr, result.stdout


def test_the_rendered_configuration_passes_promtool_and_names_every_host(tmp_path):
    promtool = _promtool()
    (tmp_path / "sparkrig.rules.yml").write_text(pm_deploy.render_rules(TEST_THRESHOLD))
    targets = scrape_targets(_fleet(), "spark-01")
    text = pm_deploy.render_config(targets, 2, 1).replace(pm_deploy.RULES, str(tmp_path / "sparkrig.rules.yml"))
    (tmp_path / "prometheus.yml").write_text(text)
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(text)
    assert config["global"] == {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    assert [(c["labels"]["instance"], c["targets"]) for c in job["static_configs"]] == [
        (name, [address]) for name, address in targets
    ]


# The deploy ---------------------------------------------------------------------

RULES_TEXT = pm_deploy.render_rules(DEFAULTS["prometheus_memory_available_min_bytes"])
CONFIG_TEXT = pm_deploy.render_config([(ME, "127.0.0.1:9100")], 15, 15)
DEFAULT_TEXT = pm_deploy.render_default_file(pm_deploy.prometheus_args("127.0.0.1:9090", 15))


def _host(installed=True, running=True, enabled=True, rules=RULES_TEXT, config=CONFIG_TEXT, default=DEFAULT_TEXT):
    return {
        HOST_STATE: host_state(
            files={pm_deploy.RULES: rules, pm_deploy.CONFIG: config, pm_deploy.DEFAULT_FILE: default},
            units={pm_deploy.SERVICE: (running, enabled)},
            packages={pm_deploy.PACKAGE: "2.42.0+ds-5+deb12u1" if installed else None},
        ),
        "--property SubState": ["Id=prometheus.service", f"SubState={'running' if running else 'dead'}"],
        "--property UnitFileState": ["Id=prometheus.service", f"UnitFileState={'enabled' if enabled else 'disabled'}"],
    }


def _commands(ops) -> dict[str, list[str]]:
    return {op.name.removeprefix("Fleet Prometheus | "): op.commands for op in ops}


def test_a_fresh_server_installs_masked_writes_checked_files_then_starts():
    debian = "# Debian's own\n"
    ops = execute(
        pm.prometheus,
        data=ON,
        responses=_host(installed=False, running=False, enabled=False, rules=None, config=debian, default='ARGS=""\n'),
    )
    commands = _commands(ops)
    assert list(commands) == [
        "Prometheus waits for its configuration (masked while installed)",
        "Install Prometheus",
        f"Alert rules ({pm_deploy.RULES}), checked by promtool",
        f"Scrape configuration ({pm_deploy.CONFIG}), checked by promtool",
        f"Prometheus' arguments ({pm_deploy.DEFAULT_FILE})",
        "Prometheus may start (unmasked)",
        "Prometheus is enabled and running",
    ]
    assert commands["Prometheus waits for its configuration (masked while installed)"] == [
        "systemctl mask prometheus.service"
    ]
    assert commands["Install Prometheus"][0].endswith("install --no-install-recommends prometheus")
    assert commands[f"Alert rules ({pm_deploy.RULES}), checked by promtool"][-1] == (
        "chown root:root /etc/prometheus/.sparkrig.rules.yml.sparkrig-new && chmod 644 "
        "/etc/prometheus/.sparkrig.rules.yml.sparkrig-new && { promtool check rules "
        "/etc/prometheus/.sparkrig.rules.yml.sparkrig-new || { rm -f /etc/prometheus/.sparkrig.rules.yml.sparkrig-new"
        " ; false; }; } && mv -f /etc/prometheus/.sparkrig.rules.yml.sparkrig-new /etc/prometheus/sparkrig.rules.yml"
    )
    assert (
        "{ promtool check config /etc/prometheus/.prometheus.yml.sparkrig-new ||"
        in commands[f"Scrape configuration ({pm_deploy.CONFIG}), checked by promtool"][-1]
    )
    assert (
        ops[4]
        .uploads["/etc/default/.prometheus.sparkrig-new"]
        .decode()
        .endswith('ARGS="--web.listen-address=127.0.0.1:9090 --storage.tsdb.retention.time=15d"\n')
    )
    assert ops[3].uploads["/etc/prometheus/.prometheus.yml.sparkrig-new"].decode() == CONFIG_TEXT


def test_a_converged_server_gets_no_operation():
    assert execute(pm.prometheus, data=ON, responses=_host()) == []
    assert plan(pm.prometheus, data=ON, responses=_host()) == []


def test_other_hosts_and_a_fleet_without_prometheus_read_and_do_nothing():
    assert execute(pm.prometheus, data={"prometheus_server": "spark-01"}, responses=_host(installed=False)) == []
    assert execute(pm.prometheus, responses=_host(installed=False)) == []
    assert pm_deploy.reads(DEFAULTS) == []


def test_a_new_threshold_rewrites_the_rules_and_reloads_without_a_restart():
    ops = execute(pm.prometheus, data={**ON, "prometheus_memory_available_min_bytes": 1 << 30}, responses=_host())
    commands = _commands(ops)
    assert list(commands) == [
        f"Alert rules ({pm_deploy.RULES}), checked by promtool",
        "Reload Prometheus: its configuration changed",
    ]
    assert "< 1073741824\n" in ops[0].uploads["/etc/prometheus/.sparkrig.rules.yml.sparkrig-new"].decode()
    assert commands["Reload Prometheus: its configuration changed"] == ["systemctl reload prometheus.service"]


def test_a_new_listen_address_restarts():
    ops = execute(pm.prometheus, data={**ON, "prometheus_listen": "10.0.0.1:9090"}, responses=_host())
    assert list(_commands(ops)) == [
        f"Prometheus' arguments ({pm_deploy.DEFAULT_FILE})",
        "Restart Prometheus: its arguments changed",
    ]


def test_a_run_cut_off_after_the_mask_is_finished_by_the_next():
    """Installed and masked (the last run stopped at a file promtool refused): unmasked, started."""
    responses = _host()
    responses[HOST_STATE] = [
        line.replace("unit active enabled", "unit inactive masked") for line in responses[HOST_STATE]
    ]
    assert list(_commands(execute(pm.prometheus, data=ON, responses=responses))) == [
        "Prometheus may start (unmasked)",
        "Prometheus is enabled and running",
    ]


def test_a_stopped_prometheus_is_started():
    assert _commands(execute(pm.prometheus, data=ON, responses=_host(running=False))) == {
        "Prometheus is enabled and running": ["systemctl start prometheus.service"]
    }


# promtool's check, before a file takes effect: the deploy's own command, run here --------


def _write_command(tmp_path: Path, dest: str, responses: dict, data: dict) -> tuple[str, str, bytes]:
    """The deploy's write of ``dest`` (its upload's bytes and the command that checks and moves
    it), with /etc/prometheus moved to ``tmp_path``."""
    for op in execute(pm.prometheus, data=data, responses=responses):
        for uploaded, content in op.uploads.items():
            if uploaded == pm_deploy.atomic.temp_path(dest):
                command = op.commands[-1].replace("/etc/prometheus", str(tmp_path))
                return (
                    str(tmp_path / Path(uploaded).name),
                    command,
                    content.replace(b"/etc/prometheus", str(tmp_path).encode()),
                )
    raise AssertionError(f"no write of {dest}")


@pytest.fixture
def root():
    if os.geteuid() != 0:
        pytest.skip("the deploy's command gives the file to root:root: run as root (as ./test does)")


def test_a_configuration_promtool_refuses_never_replaces_the_live_one(tmp_path, root):
    _promtool()
    (tmp_path / "sparkrig.rules.yml").write_text(RULES_TEXT)
    live = tmp_path / "prometheus.yml"
    live.write_text("# the live one\n")
    temp, command, content = _write_command(tmp_path, pm_deploy.CONFIG, _host(config="# old\n"), ON)
    Path(temp).write_bytes(content.replace(b"scrape_interval: 15s", b"scrape_interval: 15 seconds"))
    refused = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert refused.returncode != 0
    assert live.read_text() == "# the live one\n" and not Path(temp).exists()
    Path(temp).write_bytes(content)
    subprocess.run(["sh", "-c", command], check=True, capture_output=True)
    assert live.read_bytes() == content


def test_rules_promtool_refuses_never_replace_the_live_ones(tmp_path, root):
    _promtool()
    live = tmp_path / "sparkrig.rules.yml"
    live.write_text(RULES_TEXT)
    temp, command, content = _write_command(
        tmp_path, pm_deploy.RULES, _host(), {**ON, "prometheus_memory_available_min_bytes": 1 << 30}
    )
    Path(temp).write_bytes(content.replace(b"increase(", b"increase(("))
    refused = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert refused.returncode != 0, refused.stdout
    assert live.read_text() == RULES_TEXT and not Path(temp).exists()
    Path(temp).write_bytes(content)
    subprocess.run(["sh", "-c", command], check=True, capture_output=True)
    assert live.read_bytes() == content


def test_each_served_model_is_scraped_where_it_listens_and_the_configuration_passes_promtool(tmp_path):
    """vLLM's own /metrics: a model on the loopback from the server alone, one on another
    address at that address (its allow names the server), one on every address at its host."""
    everyone = [
        ("spark-01", {"serving_models": [{"name": "small", "port": 8000}]}),
        ("spark-02", {"serving_models": [{"name": "big", "port": 8001, "listen": "10.0.0.2"}]}),
        (
            "spark-03",
            {"ssh_hostname": "10.0.0.3", "serving_models": [{"name": "any", "port": 8002, "listen": "0.0.0.0"}]},
        ),
        ("spark-04", {"serving_models": [{"name": "hidden", "port": 8003}]}),
        # llama.cpp's key guards its /metrics: Prometheus would get 401, so it is not a target.
        (
            "spark-05",
            {"serving_models": [{"name": "g", "engine": "llama.cpp", "port": 8004, "listen": "10.0.0.5", "key": True}]},
        ),
    ]
    found = serving_targets(everyone, "spark-01")
    assert found == [
        ("spark-01", "small", "127.0.0.1:8000"),
        ("spark-02", "big", "10.0.0.2:8001"),
        ("spark-03", "any", "10.0.0.3:8002"),
    ]
    (tmp_path / "prometheus.yml").write_text(pm_deploy.render_config([("spark-01", "127.0.0.1:9100")], 15, 15, found))
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert config["scrape_configs"][1]["job_name"] == "sparkrig-serving"
    promtool = _promtool()
    (tmp_path / "sparkrig.rules.yml").write_text(pm_deploy.render_rules(TEST_THRESHOLD))
    text = (tmp_path / "prometheus.yml").read_text().replace(pm_deploy.RULES, str(tmp_path / "sparkrig.rules.yml"))
    (tmp_path / "prometheus.yml").write_text(text)
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
