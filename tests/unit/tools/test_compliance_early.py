"""tests/compliance/early.py: each host's first round, sent as the run starts, is taken only
when it is the round the suite planned, and only from a file of the user's alone. Played
through the real prefetch and a STAND-IN for ssh (no sshd runs here; the lab's hosts are
real): it logs the host it was asked for, then runs the command in a real shell here."""

from __future__ import annotations

import base64
import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.compliance import early, reads
from tests.support import check_on_local

REPO = Path(__file__).resolve().parents[3]

STANDIN_SSH = r"""#!/bin/sh
n=$#; i=0
for a; do i=$((i+1)); [ "$i" -eq $((n-1)) ] && host=$a; [ "$i" -eq "$n" ] && cmd=$a; done
echo "$host" >> "$SSH_LOG"
exec sh -c "$cmd"
"""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A private directory for the first rounds, an inventory and an SSH config file, a
    stand-in ssh logging each call."""
    home = tmp_path / "runtime"
    home.mkdir(mode=0o700)
    (home / "sparkrig-ssh").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("SPARKRIG_COMPLIANCE_EARLY", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(STANDIN_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SSH_LOG", str(tmp_path / "ssh.log"))
    inventory, config = tmp_path / "inventory.py", tmp_path / "ssh_config"
    inventory.write_text("hosts = ['box']\n")
    config.write_text("Host box\n")
    yield inventory, config, tmp_path / "ssh.log"
    early.drop()


def _calls(log: Path, at_least: int = 0) -> list[str]:
    """The hosts the stand-in ssh was asked for (waiting, bounded, for ``at_least`` of them:
    a process sent early logs when it starts)."""
    deadline = time.monotonic() + 10
    while True:
        found = log.read_text().split() if log.exists() else []
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _prefetch(config: Path, marker: Path) -> dict:
    """The real prefetch of one host, its reads made from ``marker`` (a file this test
    changes between runs)."""
    # No need of the suite's planned (only=set()): whatever other modules registered.
    return reads.prefetch(
        str(config), ["box"], [f"cat {marker}"], {"box": lambda answers: reads.Reader("box", {}, answers, only=set())}
    )


def _remember(inventory: Path, config: Path) -> None:
    planned = reads.PLANNED[(str(config), "box")]
    early.remember(str(inventory), ["box"], str(config), {"box": (reads.prefetch_script(planned), planned)})


def test_the_first_round_a_run_left_is_sent_as_the_next_starts_and_taken_when_planned_alike(setup, tmp_path):
    inventory, config, log = setup
    marker = tmp_path / "state"
    marker.write_text("first\n")
    _prefetch(config, marker)
    _remember(inventory, config)
    saved = early._file(str(inventory), ["box"])
    assert saved.stat().st_mode & 0o777 == 0o600
    assert _calls(log) == ["box"]
    early.start(["tests/compliance", "--inventory", str(inventory), "--limit", "box"])
    assert _calls(log, 2) == ["box", "box"]  # sent at once, before anything was planned
    time.sleep(0.5)
    marker.write_text("second\n")  # the host's state after the early round read it
    found = _prefetch(config, marker)
    assert _calls(log) == ["box", "box"]  # the round planned is the one sent: nothing sent again
    rc, out, _err = found["box"][f"cat {marker}"]
    assert rc == 0 and out == "Zmlyc3QK"  # base64 of "first\n": the state at the run's start


def test_a_round_planned_otherwise_is_sent_again_and_the_early_one_ended(setup, tmp_path):
    inventory, config, log = setup
    _prefetch(config, tmp_path / "one")
    _remember(inventory, config)
    early.start(["--inventory", str(inventory), "--limit=box"])
    (_script, _reads, process) = early._SENT[(str(config), "box")]
    assert _calls(log, 2) == ["box", "box"]
    found = _prefetch(config, tmp_path / "another")  # other reads: another script
    assert _calls(log, 3) == ["box", "box", "box"]
    assert process.poll() is not None  # the early round's ssh is gone
    assert found["box"][f"cat {tmp_path / 'another'}"][0] == 1
    assert f"cat {tmp_path / 'one'}" not in found["box"]  # not taken: it held none of this round's reads


@pytest.mark.parametrize("change", ["inventory", "ssh_config", "worker", "off", "no inventory"])
def test_nothing_is_sent_early_when_the_inventory_or_config_changed_or_in_a_worker(
    setup, tmp_path, change, monkeypatch
):
    inventory, config, log = setup
    _prefetch(config, tmp_path / "x")
    _remember(inventory, config)
    args = ["--inventory", str(inventory), "--limit", "box"]
    if change == "inventory":
        inventory.write_text("hosts = ['box', 'other']\n")
    elif change == "ssh_config":
        config.write_text("Host box\n  HostName elsewhere\n")
    elif change == "worker":
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    elif change == "off":
        monkeypatch.setenv("SPARKRIG_COMPLIANCE_EARLY", "0")
    else:
        args = ["tests/compliance", "--limit", "box"]
    early.start(args)
    assert early._SENT == {} and _calls(log) == ["box"]


@pytest.mark.parametrize("how", ["group-writable", "another owner", "a link", "directory open"])
def test_first_rounds_in_a_file_not_the_users_alone_are_never_sent(setup, tmp_path, how):
    """Whoever can change the file chooses what runs on every host, root's reads included."""
    inventory, config, log = setup
    _prefetch(config, tmp_path / "x")
    _remember(inventory, config)
    saved = early._file(str(inventory), ["box"])
    if how == "group-writable":
        saved.chmod(0o620)
    elif how == "another owner":
        os.chown(saved, pwd.getpwnam("nobody").pw_uid, -1)
    elif how == "a link":
        real = tmp_path / "real.json"
        saved.rename(real)
        saved.symlink_to(real)
    else:
        saved.parent.chmod(0o750)
    early.start(["--inventory", str(inventory), "--limit", "box"])
    assert early._SENT == {} and _calls(log) == ["box"]


def test_no_first_round_is_kept_in_a_directory_others_may_enter(setup, tmp_path):
    inventory, config, _log = setup
    saved = early._file(str(inventory), ["box"])
    saved.parent.chmod(0o750)
    early.remember(str(inventory), ["box"], str(config), {"box": ("echo planted", ["echo planted"])})
    assert not saved.exists()
    saved.parent.chmod(0o700)
    early.remember(str(inventory), ["box"], str(config), {"box": ("echo kept", ["echo"])})
    assert json.loads(saved.read_text())["hosts"] == {"box": {"script": "echo kept", "reads": ["echo"]}}
    assert saved.stat().st_mode & 0o777 == 0o600


def test_an_early_round_no_one_takes_ends_with_the_run(setup, tmp_path):
    """A run stopped before its first round was planned leaves no ssh behind."""
    inventory, config, _log = setup
    pid_file = tmp_path / "pid"
    early.remember(str(inventory), ["box"], str(config), {"box": (f"echo $$ > {pid_file}; exec sleep 60", ["x"])})
    code = f"from tests.compliance import early; early.start(['--inventory', {str(inventory)!r}, '--limit', 'box'])"
    # Until the pid is written, not until the file is there: the shell creates it first, and a run
    # that ended in between ended the round before its echo (CI, under load, read '').
    code += f"\nimport time, pathlib\np = pathlib.Path({str(pid_file)!r})"
    code += "\nwhile not (p.exists() and p.read_text().endswith(chr(10))): time.sleep(0.05)"
    subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=True
    )
    pid = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_options_are_read_as_pytest_takes_them():
    assert early.options(["x", "--inventory", "inv.py", "--limit", "a", "--limit=b,c", "-q"]) == (
        "inv.py",
        ["a", "b,c"],
    )
    assert early.options(["--inventory=inv.py"]) == ("inv.py", [])
    assert early.options(["--limit", "a"]) == (None, ["a"])


def test_a_real_pytest_run_sends_its_first_round_before_loading_the_suite(setup):
    """tests/conftest.py calls start() with pytest's command line before its heavy imports."""
    inventory, config, _log = setup
    early.remember(str(inventory), ["box"], str(config), {"box": ("echo early", ["echo early"])})
    code = (
        f"import sys; sys.argv = ['pytest', '--inventory', {str(inventory)!r}, '--limit', 'box']\n"
        "import tests.conftest, gc\nfrom tests.compliance import early\nprint(sorted(early._SENT), gc.isenabled())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert f"('{config}', 'box')" in out.stdout, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False"  # and no garbage collected while the run starts


@pytest.mark.parametrize(
    ("args", "held"),
    [
        (["tests/compliance", "--inventory", "inv.py"], True),
        (["--inventory=inv.py", "-m", "read"], True),
        (["--hosts", "ssh://box"], True),
        (["--hosts=local://"], True),
        (["tests/unit", "-k", "inventory"], False),
    ],
)
def test_a_run_against_hosts_collects_no_garbage_while_it_starts(args, held):
    code = (
        "import gc, sys\nfrom tests.compliance import early\nearly.collect_later(sys.argv[1:])\nprint(gc.isenabled())"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == str(not held), out.stderr


def test_sparkrig_check_holds_collections_until_the_controls_are_collected(tmp_path):
    """The installed tool's entry point (sparkrig check), a real run on @local: collections
    are held while pytest configures, and run again once the controls are collected."""
    probe = (
        "import gc, os\n"
        "def pytest_configure(config):\n"
        "    open(os.environ['PROBE'], 'a').write(f'configure {gc.isenabled()}\\n')\n"
        "def pytest_runtest_call(item):\n"
        "    open(os.environ['PROBE'], 'a').write(f'control {gc.isenabled()}\\n')\n"
    )
    _run, said_by = check_on_local(
        tmp_path, probe, "-m", "read", "-k", "test_no_swap_is_active", "-p", "no:cacheprovider"
    )
    said = said_by.read_text().splitlines()
    assert said[0] == "configure False" and said[1:] and set(said[1:]) == {"control True"}, said


def _suite(tmp_path: Path, inventory: str, *options: str, control: str = "def test_nothing():\n    pass\n") -> Path:
    """A real pytest run of one control (by default one that reads nothing), with the suite's
    conftest and ``inventory``'s hosts (its first rounds kept in the private directory it
    returns, every command it sent logged in tmp_path/log)."""
    (tmp_path / "test_one.py").write_text(control)
    (tmp_path / "inv.py").write_text(inventory)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(runtime), SPARKRIG_COMPLIANCE_LOG=str(tmp_path / "log"))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "test_one.py", "-p", "tests.compliance.conftest", "--inventory", "inv.py"]
        + [*options, "-n", "0", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return runtime / "sparkrig-ssh"


def test_a_suite_run_keeps_each_hosts_reads_for_the_next(tmp_path):
    """The suite's conftest (its prefetch) leaves each host's reads, every round's, and the
    script that reads them in the user's private directory: a real pytest run on @local."""
    (saved,) = _suite(tmp_path, 'here = [("@local", {})]\n').glob("early-reads-*.json")
    assert saved.stat().st_mode & 0o777 == 0o600
    found = json.loads(saved.read_text())["hosts"]
    assert list(found) == ["@local"] and "id -nu" in found["@local"]["reads"]
    assert found["@local"]["script"] == reads.prefetch_script(found["@local"]["reads"])


def test_a_limited_run_reads_its_cluster_peer_in_the_prefetch(tmp_path):
    """A real pytest run with --limit on one node of a pair: the peer's prefetch is sent (and
    refused here, nothing listens: its controls would then read it themselves)."""
    node = "{'cluster_name': 'pair', 'cluster_user': 'spark', 'cluster_interfaces': {'cx7': '%s/24'}}"
    inventory = (
        f"peer = {{**{node % '192.168.100.12'}, 'ssh_hostname': '127.0.0.1', 'ssh_port': 1}}\n"
        f"here = [('@local', {node % '192.168.100.11'}), ('sparkrig-no-such-peer', peer)]\n"
    )
    _suite(tmp_path, inventory, "--limit=@local")
    sent = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert {(s["host"], s["control"]) for s in sent} >= {
        ("@local", "(prefetch)"),
        ("sparkrig-no-such-peer", "(prefetch)"),
    }


@pytest.mark.parametrize("replayed", [False, True])
def test_a_replayed_suite_sends_nothing_early(setup, tmp_path, replayed):
    """benchmarks/replay.py's hosts are a STAND-IN: its suite must read no real host early
    (those rounds ran on the real lab hosts, beside the controller it measures)."""
    inventory, config, log = setup
    marker = tmp_path / "state"
    marker.write_text("first\n")
    _prefetch(config, marker)
    _remember(inventory, config)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if replayed:
        env["SPARKRIG_REPLAY"] = f"replay:{tmp_path / 'recording.json'}"
    started = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, benchmarks.replay\n"
            "from tests.compliance import early\n"
            "early.start(sys.argv[1:])\n"
            "print(len(early._SENT))\n",
            "tests/compliance",
            "--inventory",
            str(inventory),
            "--limit",
            "box",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == ("0" if replayed else "1")


def test_a_suite_run_leaves_its_objects_to_the_os_at_exit(tmp_path, monkeypatch):
    """The suite freezes the garbage collector once the controls are collected (what the
    imports made lives as long as the run) and again as the process ends (what the controls
    made): a real pytest run on @local, its exit seen by a handler that runs after the suite's."""
    (tmp_path / "exitprobe.py").write_text(
        "import atexit, gc, os\n"
        "gc.disable()\n"
        "atexit.register(lambda: open(os.environ['EXIT_PROBE'], 'w').write(str(len(gc.get_objects()))))\n"
    )
    control = (
        "import gc\n"
        "KEPT = []\n"
        "def test_made_after_the_collection():\n"
        "    assert gc.get_freeze_count() > 10000, gc.get_freeze_count()\n"
        "    assert gc.isenabled()  # held by the probe, as by early.collect_later: collected again\n"
        "    KEPT.extend([] for _ in range(50000))\n"
    )
    monkeypatch.setenv("EXIT_PROBE", str(tmp_path / "tracked"))
    _suite(tmp_path, 'here = [("@local", {})]\n', "-p", "exitprobe", control=control)
    assert int((tmp_path / "tracked").read_text()) < 50000  # the control's lists were frozen too


class _TwoRounds:
    """A reader whose second round is planned from its first's answer (as the unit sshd runs
    as, or CUDA_HOME, are): it reads ``marker``, then the file whose path that held."""

    only: set = set()

    def __init__(self, marker: Path, answers: dict):
        self.wanted = {f"cat {marker}": None}
        found = answers.get(f"cat {marker}")
        if found is not None:
            self.wanted[f"cat {found[1].decode().strip()}"] = None


def _two_rounds(config: Path, marker: Path) -> dict:
    return reads.prefetch(str(config), ["box"], [], {"box": lambda answers: _TwoRounds(marker, answers)})


def test_every_round_a_run_read_goes_out_early_and_the_next_run_reads_its_host_once(setup, tmp_path):
    inventory, config, log = setup
    marker, second = tmp_path / "marker", tmp_path / "second"
    marker.write_text(f"{second}\n")
    second.write_text("at the start\n")
    _two_rounds(config, marker)
    assert _calls(log) == ["box", "box"]  # two rounds: the second planned from the first's answer
    assert reads.PLANNED[(str(config), "box")] == [f"cat {marker}", f"cat {second}"]
    _remember(inventory, config)
    early.start(["--inventory", str(inventory), "--limit", "box"])
    assert _calls(log, 3) == ["box", "box", "box"]
    time.sleep(0.5)
    second.write_text("later\n")
    found = _two_rounds(config, marker)
    assert _calls(log) == ["box", "box", "box"]  # the early one answered both rounds
    rc, out, _err = found["box"][f"cat {second}"]
    assert rc == 0 and base64.b64decode(out) == b"at the start\n"


def test_an_early_script_that_is_not_the_one_its_reads_make_is_refused(setup, tmp_path):
    """The reads named and the script sent must agree: a script the suite would not send for
    those reads (another suite's, a hand-edited file) answers nothing."""
    inventory, config, log = setup
    marker = tmp_path / "state"
    marker.write_text("real\n")
    _prefetch(config, marker)
    planned = reads.PLANNED[(str(config), "box")]
    forged = reads.prefetch_script(planned).replace(f"cat {marker}", f"cat {marker}; echo forged", 1)
    assert forged != reads.prefetch_script(planned)
    early.remember(str(inventory), ["box"], str(config), {"box": (forged, planned)})
    early.start(["--inventory", str(inventory), "--limit", "box"])
    assert _calls(log, 2) == ["box", "box"]
    found = _prefetch(config, marker)
    assert _calls(log, 3) == ["box", "box", "box"]  # sent again
    assert base64.b64decode(found["box"][f"cat {marker}"][1]) == b"real\n"


@pytest.mark.parametrize("entry", ["echo a script alone", {"script": "echo"}, {"script": "echo", "reads": [1]}, None])
def test_an_early_file_whose_entries_are_not_a_script_and_its_reads_sends_nothing(setup, tmp_path, entry):
    inventory, config, log = setup
    _prefetch(config, tmp_path / "x")
    _remember(inventory, config)
    saved = early._file(str(inventory), ["box"])
    found = json.loads(saved.read_text())
    found["hosts"]["box"] = entry
    saved.write_text(json.dumps(found))
    early.start(["--inventory", str(inventory), "--limit", "box"])
    assert early._SENT == {} and _calls(log) == ["box"]
