"""The hosts' STAND-IN of benchmarks/fleet_scale.py (benchmarks/replay.py): a replayed run
answers every alias from its recorded host, with the recording's answers, and a command the
recording lacks fails the run loudly. pyinfra and testinfra run for real; only the transport
(paramiko's client, testinfra's ``ssh`` process, the suite's prefetch) is replayed."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap

from benchmarks.fleet_scale import disagreements, fleet_names, write_inventory
from benchmarks.replay import renonced, without_nonce
from tests.support import REPO

DEPLOY = """\
from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import server

if host.get_fact(Command, "echo hi") != "hi":
    server.shell(name="The host said something else", commands=["true"])
"""
# How pyinfra sends the fact's command (pyinfra wraps it in a shell).
SENT = "sh -c 'echo hi'"


def replayed_deploy(tmp_path, recording: dict, deploy: str = "deploy.py") -> subprocess.CompletedProcess:
    (tmp_path / "deploy.py").write_text(DEPLOY)
    (tmp_path / "inventory.py").write_text('boxes = ["box~0", "box~1"]\n')
    (tmp_path / "recording.json").write_text(json.dumps(recording))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.replay",
            "replay",
            "recording.json",
            "--",
            "-y",
            "--json",
            "inventory.py",
            deploy,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def changed(result: subprocess.CompletedProcess) -> int:
    report = json.loads(result.stdout)
    return sum(len(op["success"]) for op in report["results"]["operations"])


def test_a_replayed_deploy_answers_every_alias_from_its_recorded_host(tmp_path):
    result = replayed_deploy(tmp_path, {"pyinfra": {"box": {SENT: [0, ["hi"], [], None]}}})
    assert result.returncode == 0, result.stderr[-2000:]
    assert changed(result) == 0


def test_the_deploy_decides_from_the_recorded_answer(tmp_path):
    result = replayed_deploy(
        tmp_path, {"pyinfra": {"box": {SENT: [0, ["bye"], [], None], "sh -c true": [0, [], [], None]}}}
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert changed(result) == 2  # both aliases of box heard "bye"


def test_a_command_the_recording_lacks_fails_the_deploy_loudly(tmp_path):
    result = replayed_deploy(tmp_path, {"pyinfra": {"other": {SENT: [0, ["hi"], [], None]}}})
    assert result.returncode != 0
    assert re.search(
        rf"replay: box~[01] \(box\) has no recorded answer in recording.json \[pyinfra\] for: {re.escape(SENT)}",
        result.stderr,
    )


NONCED = """\
import base64, secrets
from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import server

tag = f"@@{secrets.token_hex(8)}"  # as sparkrig.reading tags a reading: fresh each run
if base64.b64decode(host.get_fact(Command, f"printf %s {tag} | base64 -w0")).decode() != tag:
    server.shell(name="The host echoed another run's tag", commands=["true"])
"""


def test_a_replayed_reading_echoes_this_runs_nonce(tmp_path):
    recorded = "0123456789abcdef"
    answer = base64.b64encode(f"@@{recorded}".encode()).decode()
    (tmp_path / "nonced.py").write_text(NONCED)
    result = replayed_deploy(
        tmp_path,
        {
            "pyinfra": {
                "box": {
                    "sh -c 'printf %s @@NONCE | base64 -w0'": [0, [answer], [], recorded],
                    "sh -c true": [0, [], [], None],
                }
            }
        },
        deploy="nonced.py",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert changed(result) == 0


def test_the_readings_nonce_is_this_runs_in_the_replayed_output():
    """sparkrig's reading tags its parts with a fresh nonce each run, and the host echoes it
    back inside base64: the key is the same for any nonce, the answer carries the new one."""
    old, new = "0123456789abcdef", "fedcba9876543210"
    key_old, found_old = without_nonce(f"echo @@{old} end 0")
    key_new, found_new = without_nonce(f"echo @@{new} end 0")
    assert key_old == key_new and (found_old, found_new) == (old, new)
    recorded = [base64.b64encode(f"x\n@@{old} end 0 0\n".encode()).decode(), "sparkrig-end"]
    replayed = renonced(recorded, old, new)
    assert base64.b64decode(replayed[0]).decode() == f"x\n@@{new} end 0 0\n"
    assert replayed[1] == "sparkrig-end"


SUITE_SIDE = """\
import base64, json, sys
import testinfra
from benchmarks.replay import Recording, Unrecorded, install_testinfra
from tests.compliance import reads

install_testinfra(Recording(sys.argv[1], recording=False))
host = testinfra.get_host("ssh://box~2", ssh_config="/nonexistent/ssh_config")  # real ssh would fail
out = {"run": host.run("echo hi").stdout}
out["prefetch"] = reads.prefetch("/nonexistent/ssh_config", ["box~1"], ["id -nu"])
try:
    host.run("echo unrecorded")
except Unrecorded as error:
    out["unrecorded"] = str(error)
print(json.dumps(out))
"""


def test_the_suites_transport_is_replayed_and_refuses_the_unrecorded(tmp_path):
    b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    recording = tmp_path / "recording.json"
    recording.write_text(
        json.dumps(
            {
                "testinfra": {"box": {"echo hi": [0, b64("hi\n"), ""]}},
                "prefetch": {"box": {"id -nu": [0, b64("spark\n"), ""]}},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", SUITE_SIDE, str(recording)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["run"] == "hi\n"
    assert out["prefetch"] == {"box~1": {"id -nu": [0, b64("spark\n"), ""]}}
    assert "box~2 (box) has no recorded answer" in out["unrecorded"] and "echo unrecorded" in out["unrecorded"]


def test_a_replayed_control_that_differs_from_the_recorded_host_is_named():
    recorded = {("h~0", "m::c[x]"): "passed", ("g~0", "m::c[x]"): "skipped"}
    replayed = {
        ("h~0", "m::c[x]"): "passed",
        ("g~0", "m::c[x]"): "skipped",
        ("h~1", "m::c[x]"): "failed",
        ("g~1", "m::c[x]"): "skipped",
    }
    wrong = disagreements(recorded, replayed, fleet_names(["h", "g"], 4))
    assert wrong == ["h~1: 1 controls differ, e.g. m::c[x]: passed -> failed"]
    assert fleet_names(["h", "g"], 3) == ["h~0", "g~0", "h~1"]


def test_the_fleet_inventory_aliases_the_lab_hosts_out_of_any_cluster_and_prometheus(tmp_path):
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "__init__.py").write_text("")
    (tmp_path / "inventory" / "lab.py").write_text(
        "lab = [('a', {'ssh_user': 'x', 'cluster_name': 'c', 'prometheus_server': 'a'}), ('b', {'ssh_user': 'y'})]\n"
    )
    path = write_inventory(tmp_path, ["a", "b"], 3)
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import runpy, json
        print(json.dumps(runpy.run_path({str(path)!r})["lab"]))"""),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(found.stdout) == [
        ["a~0", {"ssh_user": "x"}],
        ["b~0", {"ssh_user": "y"}],
        ["a~1", {"ssh_user": "x"}],
    ]
