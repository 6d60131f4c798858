"""Fleet tooling: --limit as pyinfra reads it, a batch's deploy results, the per-host table (the rollout's
batches, budget and state: test_rollout.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkrig.tools.rollout import PYINFRA, failed_hosts, limit_hosts
from tests.compliance import conftest
from tests.compliance.conftest import HostTable, found, host_of, multiplexed
from tests.support import REPO, host_table, inventory_host_data

GROUPS = {"spark-01": ["sparks"], "spark-02": ["sparks"], "ws-01": ["workstations"], "spark-03": ["sparks"]}


@pytest.mark.parametrize(
    ("limit", "chosen"),
    [
        ([], ["spark-01", "spark-02", "ws-01", "spark-03"]),
        (["workstations"], ["ws-01"]),
        (["spark-0[12]"], ["spark-01", "spark-02"]),
        (["ws-01,spark-03"], ["ws-01", "spark-03"]),
        (["ws-01", "sparks"], ["spark-01", "spark-02", "ws-01", "spark-03"]),
    ],
)
def test_limit_picks_groups_and_host_globs_in_inventory_order(limit, chosen):
    assert limit_hosts(GROUPS, limit) == chosen


def test_a_limit_that_matches_nothing_is_an_error():
    with pytest.raises(ValueError, match="--limit 'gpu-boxes' matches no host or group"):
        limit_hosts(GROUPS, ["gpu-boxes"])


def test_a_batch_fails_on_an_operation_error_or_an_unreached_host():
    report = {
        "results": {
            "operations": [
                {"name": "x", "success": ["a"], "no_change": ["b"], "error": []},
                {"name": "y", "success": [], "no_change": ["a"], "error": ["b"]},
            ],
            "failed_hosts": ["b", "c"],
        }
    }
    assert failed_hosts(["a", "b", "c"], report) == ["b", "c"]  # c: failed, never reached
    assert failed_hosts(["a"], report) == []
    assert failed_hosts(["a"], {"results": None}) == ["a"]  # pyinfra stopped before running


def test_a_host_with_nothing_to_do_converged_and_an_unreachable_one_failed(tmp_path):
    """pyinfra's own --json report of a host that gets no operation (as with swap_disable
    False and nothing else to do) and of a host whose SSH port is closed."""
    (tmp_path / "inventory.py").write_text(
        'here = [("@local", {})]\ngone = [("127.0.0.1", {"ssh_port": 1, "ssh_connect_retries": 0})]\n'
    )
    (tmp_path / "deploy.py").write_text('from pyinfra import host\nhost.noop("nothing to do")\n')
    result = subprocess.run(
        [PYINFRA, "-y", "--json", "inventory.py", "deploy.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(result.stdout)
    assert report["results"]["operations"] == []
    assert failed_hosts(["@local", "127.0.0.1"], report) == ["127.0.0.1"]


def test_host_ids_are_read_from_testinfra_ids():
    names = ["lab-deb12", "lab-deb12-b"]
    assert host_of("tests/compliance/test_swap.py::test_x[ssh://lab-deb12]", names) == "lab-deb12"
    assert host_of("tests/compliance/test_swap.py::test_x[ssh://lab-deb12-b]", names) == "lab-deb12-b"
    # Another parameter after testinfra's id, joined by "-": the longest known name wins.
    assert host_of("tests/compliance/test_jobs.py::test_y[ssh://lab-deb12-b-spark-run]", names) == "lab-deb12-b"
    assert host_of("tests/compliance/test_jobs.py::test_y[ssh://lab-deb12-spark-run]", names) == "lab-deb12"
    assert host_of("tests/compliance/test_swap.py::test_x[local]", ["@local"]) == "@local"
    assert host_of("tests/compliance/test_jobs.py::test_y[local-spark-run]", ["@local"]) == "@local"
    assert host_of("tests/compliance/test_swap.py::test_x[local]", names) is None  # no @local in the inventory
    assert host_of("tests/unit/test_swap.py::test_y[1]", names) is None
    # A name that is only the start of another's, or one the id holds later, is not a fit.
    assert host_of("tests/compliance/test_swap.py::test_x[ssh://lab-deb12x]", names) is None
    assert host_of("tests/compliance/test_jobs.py::test_y[ssh://h-lab-deb12]", set(names)) is None


def test_the_table_reads_a_report_s_host_from_the_names_it_has_now():
    # Each control's host is read once (its three phases report): the names set later count.
    table, nodeid = HostTable(["lab-deb12"]), "tests/compliance/test_jobs.py::test_y[ssh://lab-deb12-b-spark-run]"
    assert table.key(nodeid) == ("lab-deb12", "test_jobs.py::test_y[ssh://lab-deb12-b-spark-run]")
    table.names = ["lab-deb12", "lab-deb12-b"]
    assert table.key(nodeid)[0] == "lab-deb12-b"
    table.add(_report(nodeid, "call", "passed"))
    assert list(table.outcomes) == ["lab-deb12-b"]


def _report(nodeid, when, outcome, message=""):
    crash = SimpleNamespace(reprcrash=SimpleNamespace(message=message)) if message else None
    return SimpleNamespace(
        nodeid=nodeid,
        when=when,
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        passed=outcome == "passed",
        longrepr=crash,
    )


def test_the_table_counts_each_control_once_by_its_worst_phase():
    table = HostTable(["h1", "h2"])
    a, b = "tests/compliance/test_swap.py::test_off[ssh://{}]", "tests/compliance/test_jobs.py::test_gpu[ssh://{}]"
    for host in ("h1", "h2"):
        table.add(_report(a.format(host), "setup", "passed"))
        table.add(
            _report(
                a.format(host),
                "call",
                "passed" if host == "h1" else "failed",
                "AssertionError: /proc/swaps lists /swap.img\nassert 1 == 0",
            )
        )
        table.add(_report(a.format(host), "teardown", "passed"))
        table.add(_report(b.format(host) + f"@{host}", "setup", "skipped"))  # as xdist's loadgroup ids
    lines = table.lines()
    assert lines[0].split() == ["host", "passed", "failed", "skipped"]
    assert lines[1].split() == ["h1", "1", "0", "1"]
    assert lines[2].split() == ["h2", "0", "1", "1"]
    assert lines[3:] == ["failed controls:", "  h2: test_swap.py::test_off[ssh://h2]: /proc/swaps lists /swap.img"]


# A failed control's message as pytest reports it (reprcrash.message): the assertion's message,
# its continuation lines indented by two, then pytest's explanation. The stderr is a lab Debian 12
# host's (docker.io 20.10.24), captured after `hostname deb` (a name that does not resolve) from
# `sudo docker run --runtime=nvidia ubuntu:24.04 true` (no registry reachable), 2026-11-25.
DOCKER_PULL_FAILED = (
    "AssertionError: docker run --runtime=nvidia ubuntu:24.04 true failed: "
    "sudo: unable to resolve host deb: Name or service not known\n"
    "  Unable to find image 'ubuntu:24.04' locally\n"
    '  docker: Error response from daemon: Get "https://registry-1.docker.io/v2/": dial tcp: '
    "lookup registry-1.docker.io on 10.255.255.53:53: no such host.\n"
    "  See 'docker run --help'.\n"
    "  \n"
    "assert 125 == 0\n"
    " +  where 125 = CommandResult(backend=<testinfra.backend.ssh.SshBackend object at 0x7f1c>, "
    "exit_status=125, command=b'sudo docker run --runtime=nvidia ubuntu:24.04 true', _stdout=b'', "
    "_stderr=b'sudo: unable to resolve host deb: Name or service not known\\n').rc"
)


@pytest.mark.parametrize(
    ("message", "line"),
    [
        (
            DOCKER_PULL_FAILED,
            "docker run --runtime=nvidia ubuntu:24.04 true failed: docker: Error response from daemon: Get "
            '"https://registry-1.docker.io/v2/": dial tcp: '
            "lookup registry-1.docker.io on 10.255.255.53:53: no such host.",
        ),
        # sudo's warning alone: nothing else said why, so it stays.
        (
            "AssertionError: docker run --runtime=nvidia ubuntu:24.04 true failed: sudo: unable to resolve host "
            "deb: Name or service not known\n  \nassert 1 == 0",
            "docker run --runtime=nvidia ubuntu:24.04 true failed: sudo: unable to resolve host deb: "
            "Name or service not known",
        ),
        # Newer Docker (25+) ends with "Run '... --help' for more information".
        (
            "AssertionError: docker run --gpus all ubuntu:24.04 nvidia-smi -L failed: docker: Error response from "
            'daemon: could not select device driver "" with capabilities: [[gpu]]\n  \n'
            "  Run 'docker run --help' for more information\nassert 125 == 0",
            "docker run --gpus all ubuntu:24.04 nvidia-smi -L failed: docker: Error response from daemon: could not "
            'select device driver "" with capabilities: [[gpu]]',
        ),
        # A one-line finding stays as it was, and so does pytest.fail's.
        ("AssertionError: swap is active: /swap.img\nassert ['/swap.img'] == []", "swap is active: /swap.img"),
        (
            "Failed: the lab converge failed, so no control can be checked:\nE: Unable to locate package x",
            "the lab converge failed, so no control can be checked: E: Unable to locate package x",
        ),
        # testinfra's check_output: sudo's warning left out of the command's stderr.
        (
            "AssertionError: Unexpected exit code 1 for CommandResult(backend=<x>, exit_status=1, "
            "command=b'sudo cat /etc/x', _stdout=b'', _stderr=b'sudo: unable to resolve host deb: Name or service "
            "not known\\ncat: /etc/x: No such file or directory\\n')",
            "a command exited 1: cat: /etc/x: No such file or directory",
        ),
    ],
)
def test_a_failed_controls_line_says_why_not_what_sudo_warned(message, line):
    report = SimpleNamespace(longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message=message)), when="call")
    assert found(report) == line


def _compliance(tmp_path, *options):
    """The real compliance suite's swap controls against a host that refuses SSH."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text('boxes = [("nobox", {"ssh_hostname": "127.0.0.1", "ssh_port": 9, "ssh_user": "nobody"})]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/compliance/test_swap.py",
            "--inventory",
            str(inventory),
            "-p",
            "no:cacheprovider",
            *options,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_a_failed_control_is_one_line_under_the_table_that_ends_the_run(tmp_path):
    result = _compliance(tmp_path)
    assert result.returncode == 1, result.stdout
    lines, table = result.stdout.splitlines(), host_table(result.stdout)
    failed = table[3:-1]
    assert table[0].split() == ["host", "passed", "failed", "skipped"]
    assert table[1].split() == ["nobox", "0", "5", "0"]
    assert table[2] == "failed controls:"
    assert len(failed) == 5 and all(line.startswith("  nobox: test_swap.py::test_") for line in failed), failed
    assert all(": ssh: connect to host 127.0.0.1 port 9: Connection refused (running: " in line for line in failed), (
        failed
    )
    assert " failed, " in lines[-1] and " errors in " in lines[-1]
    # No traceback, and no second list of the same failures in pytest's short summary.
    assert "Traceback" not in result.stdout and "_ test_" not in result.stdout
    assert not any(line.startswith(("FAILED ", "ERROR ")) for line in lines), result.stdout


def test_tracebacks_come_on_request(tmp_path):
    result = _compliance(tmp_path, "--tb=short", "-rf")
    assert "= FAILURES =" in result.stdout and "= ERRORS =" in result.stdout
    assert any(line.startswith("FAILED ") for line in result.stdout.splitlines())
    assert result.stdout.splitlines()[-2].startswith("  nobox: test_swap.py::"), result.stdout[-2000:]


def test_a_group_takes_its_settings_from_group_data(tmp_path):
    """group_data/workstations.py gives the workstations group the rtx50 profile; others keep gb10."""
    inventory = tmp_path / "fleet.py"
    inventory.write_text('sparks = [("spark-01", {})]\nworkstations = [("ws-01", {})]\n')
    hosts = inventory_host_data(str(inventory))
    assert {name: data["hardware_profile"] for name, data in hosts.items()} == {"spark-01": "gb10", "ws-01": "rtx50"}
    assert list(inventory_host_data(str(inventory), ["workstations"])) == ["ws-01"]


def test_the_suite_starts_workers_in_the_controller_only(monkeypatch):
    """xdist's workers run pytest_cmdline_main too: a worker that started workers of its own
    would multiply processes without end."""

    def config(**extra):
        option = SimpleNamespace(numprocesses=None, dist="no")
        plugins = SimpleNamespace(hasplugin=lambda name: True)
        return SimpleNamespace(
            option=option,
            pluginmanager=plugins,
            getoption=lambda name: {"--inventory": "inv.py", "--limit": []}[name],
            **extra,
        )

    monkeypatch.setattr(conftest, "inventory_host_data", lambda inv, limit: {"a": {}, "b": {}, "c": {}})
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    controller = config()
    conftest.pytest_cmdline_main(controller)
    assert (controller.option.numprocesses, controller.option.dist) == (conftest.MIN_WORKERS, "loadgroup")
    monkeypatch.setattr(conftest, "inventory_host_data", lambda inv, limit: {f"h{i}": {} for i in range(12)})
    fleet = config()
    conftest.pytest_cmdline_main(fleet)
    assert fleet.option.numprocesses == conftest.MAX_WORKERS
    worker = config(workerinput={"workerid": "gw0"})
    conftest.pytest_cmdline_main(worker)
    assert (worker.option.numprocesses, worker.option.dist) == (None, "no")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    other = config()
    conftest.pytest_cmdline_main(other)
    assert other.option.numprocesses is None


GROUPED = """
import os, pytest

@pytest.mark.parametrize("i", range(6))
@pytest.mark.parametrize("host", ["h1", "h2"])
def test_control(request, host, i):
    with open(os.environ["GROUPED_LOG"], "a") as log:
        log.write(f"{host} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""

GROUPING_CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(item.callspec.params["host"]))
"""


def test_xdist_keeps_each_group_on_one_worker(tmp_path):
    """The compliance suite relies on --dist=loadgroup to keep a host's controls in one
    worker; pytest 9.2 with pytest-xdist 3.8 silently stopped honouring it (xdist issue
    1386), which this catches."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "conftest.py").write_text(GROUPING_CONFTEST)
    log = tmp_path / "ran.log"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-q",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "GROUPED_LOG": str(log)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line.split() for line in log.read_text().splitlines()]
    assert len(ran) == 12
    workers = {host: {worker for h, worker in ran if h == host} for host in ("h1", "h2")}
    assert all(len(w) == 1 for w in workers.values()), workers


def test_ssh_control_sockets_live_in_a_private_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    text = multiplexed("Host a\n")
    assert f"ControlPath {tmp_path}/sparkrig-ssh/%C\n" in text and "/tmp/" not in text.replace(str(tmp_path), "")
    assert stat.S_IMODE((tmp_path / "sparkrig-ssh").stat().st_mode) == 0o700


@pytest.mark.parametrize("plant", ["link", "open", "readable", "other_user"])
def test_a_planted_control_directory_is_refused(tmp_path, monkeypatch, plant):
    """Another local user who made the directory first (or a link to theirs) could answer
    every control with a fake master: the suite stops instead."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    target = tmp_path / "sparkrig-ssh"
    if plant == "link":
        (tmp_path / "theirs").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "theirs")
    elif plant == "open":
        target.mkdir()
        target.chmod(0o1777)
    elif plant == "readable":  # others may list the sockets, and reach a master through one
        target.mkdir()
        target.chmod(0o755)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to make a directory of another user")
        target.mkdir(mode=0o700)
        os.chown(target, 65534, 65534)
    with pytest.raises(pytest.UsageError, match="must be a directory of yours with mode 0700"):
        multiplexed("")


def test_two_inventories_get_ssh_configs_of_their_own_and_one_inventory_the_same(tmp_path):
    """Two suite runs of one checkout on other inventories shared one .pytest_cache file: the
    second rewrote it while the first's controls read it ("Could not resolve hostname")."""
    first = conftest.inventory_ssh_config(tmp_path, "Host a\n  HostName 10.0.0.1\n")
    second = conftest.inventory_ssh_config(tmp_path, "Host b\n  HostName 10.0.0.2\n")
    assert first != second
    assert "HostName 10.0.0.1" in first.read_text() and "HostName 10.0.0.2" in second.read_text()
    assert conftest.inventory_ssh_config(tmp_path, "Host a\n  HostName 10.0.0.1\n") == first


def test_a_limited_run_can_reach_every_host_of_its_inventory(tmp_path):
    """A control may read a cluster's peer that --limit leaves out (read_node): a rollout's
    batch of one node failed the NCCL control with "could not be read" when the run's SSH
    config held the batch's hosts alone."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        'boxes = [("nobox", {"ssh_hostname": "127.0.0.1", "ssh_port": 9}), '
        '("peer", {"ssh_hostname": "127.0.0.2", "ssh_port": 9})]\n'
    )
    (tmp_path / "said_ssh_config.py").write_text(
        "def pytest_collection_finish(session):\n    print('SSH_CONFIG=' + session.config.option.ssh_config)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/compliance/test_swap.py", "--inventory", str(inventory)]
        + ["--limit", "nobox", "--collect-only", "-q", "-p", "said_ssh_config", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    said = [line for line in result.stdout.splitlines() if line.startswith("SSH_CONFIG=")]
    assert said, result.stdout[-3000:] + result.stderr[-3000:]
    text = Path(said[0].removeprefix("SSH_CONFIG=")).read_text()
    assert "Host nobox" in text and "HostName 127.0.0.1" in text
    assert "Host peer" in text and "HostName 127.0.0.2" in text
    assert "ssh://peer" not in result.stdout  # the controls still run on the limit's hosts alone
