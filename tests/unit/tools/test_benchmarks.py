"""The benchmarks' own parts: the delaying relay really delays and passes bytes intact,
and the derived inventory points each host at its relay with a matching known_hosts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from benchmarks import noop_run
from tests.support import REPO


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_relay_adds_the_round_trip_time_and_keeps_every_byte():
    server, port = _echo_server()
    relay = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.relay", "--rtt-ms", "200", f"127.0.0.1:0=127.0.0.1:{port}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready = relay.stdout.readline().split()
        assert ready[0] == "ready"
        relay_port = int(ready[1].split("=")[0].rsplit(":", 1)[1])
        payload = bytes(range(256)) * 4096  # 1 MiB, in many chunks
        with socket.create_connection(("127.0.0.1", relay_port)) as conn:
            started = time.monotonic()
            conn.sendall(b"x")
            assert conn.recv(1) == b"x"
            elapsed = time.monotonic() - started
            conn.sendall(payload)
            received = b""
            while len(received) < len(payload):
                received += conn.recv(65536)
        assert elapsed >= 0.2, elapsed  # never less than the added round trip
        assert received == payload
    finally:
        relay.terminate()
        relay.wait(timeout=10)
        server.close()


def test_the_bench_inventory_reaches_each_host_through_its_relay(tmp_path, monkeypatch):
    known = tmp_path / "lab_known_hosts"
    known.write_text("10.213.1.2 ssh-ed25519 AAAAone\n10.213.2.2 ssh-ed25519 AAAAtwo\n")
    monkeypatch.setattr(noop_run, "KNOWN_HOSTS", known)
    hosts = [{"name": "bench-1", "address": "10.213.1.2"}, {"name": "bench-2", "address": "10.213.2.2"}]
    inventory = noop_run.write_inventory(tmp_path, hosts, {"bench-1": 40001})
    lines = (tmp_path / "known_hosts").read_text().splitlines()
    assert "[127.0.0.1]:40001 ssh-ed25519 AAAAone" in lines
    assert not any(line.startswith("[127.0.0.1]") and "AAAAtwo" in line for line in lines)
    text = inventory.read_text()
    assert "_ports = {'bench-1': 40001}" in text and "from inventory.lab import lab" in text


def test_the_table_spans_command_counts_and_marks_unmeasured_suites():
    row = noop_run.Row(4, 50, 2.5, [2.4, 2.5, 2.6], {"a": 11, "b": 12}, float("nan"), {}, "not measured")
    line = noop_run.table([row]).splitlines()[-1]
    assert line == "| 4 | 50 ms | 2.50 s | 2.40, 2.50, 2.60 | - | - | 11-12 | - | - | ? | not measured |"
    row.controller_cpu_s, row.machine_cpu_s = 0.5, 1.25
    assert "| 2.40, 2.50, 2.60 | 0.50 s | 1.25 s | 11-12 |" in noop_run.table([row])


def test_cpu_times_grow_with_work():
    """The machine's and the children's CPU clocks move when a child burns CPU."""
    machine, children = noop_run.machine_cpu_s(), noop_run.children_cpu_s()
    subprocess.run([sys.executable, "-c", "sum(range(20_000_000))"], check=True)
    assert noop_run.children_cpu_s() - children > 0.1
    assert noop_run.machine_cpu_s() - machine > 0.1


def test_the_phases_plugin_leaves_the_suite_unimported_until_its_early_reads_are_sent():
    """The suite's first conftest sends the early reads: a plugin importing the suite before it
    delayed them (benchmarks.suite_phases timed one host 0.2 s slower than it runs)."""
    script = (
        "import sys\n"
        "import benchmarks.suite_phases as plugin\n"
        "plugin.pytest_load_initial_conftests(None, None, [])\n"
        "print('tests.compliance.reads' in sys.modules)\n"
        "plugin.pytest_cmdline_main(None)\n"
        "from tests.compliance import reads\n"
        "print(reads.prefetch.__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["False", "timed"]


def test_the_suite_s_phases_are_read_from_its_own_marks(tmp_path):
    """benchmarks.suite_phases as a plugin of a real pytest run: every mark is set, in order,
    and the phases split the run's wall time."""
    (tmp_path / "test_x.py").write_text("import time\n\n\ndef test_a():\n    time.sleep(0.2)\n\n\ndef test_b(): ...\n")
    marks = tmp_path / "marks.json"
    started = time.time()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.suite_phases", "-p", "no:cacheprovider", "-n", "0"],
        cwd=tmp_path,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},  # not this run's xdist worker
            "PYTHONPATH": str(REPO),
            "SPARKRIG_BENCH_PHASES": str(marks),
        },
        check=True,
        capture_output=True,
        timeout=120,
    )
    ended = time.time()
    found = json.loads(marks.read_text())
    assert found["plugin"] <= found["configured"] <= found["collected"] <= found["first_call"] <= found["last_call"]
    from benchmarks.suite_phases import PHASES, phases  # noqa: PLC0415

    split = phases(found, started, ended)
    assert list(split) == list(PHASES)
    assert split["controls"] >= 0.2
    assert split["host's reading"] == 0  # no suite, no prefetch
    assert abs(sum(v for k, v in split.items() if k != "host's reading") - (ended - started)) < 0.05


def test_reading_without_times_the_suites_own_script_on_the_host(tmp_path, monkeypatch):
    """benchmarks.reading_without: the reads' one script (the suite's prefetch) timed where it
    runs. A STAND-IN for ssh runs the command it is given here."""
    from benchmarks import reading_without  # noqa: PLC0415 - imports the suite's reads

    ssh = tmp_path / "ssh"
    ssh.write_text('#!/bin/sh\nfor a; do last=$a; done\nexec sh -c "$last"\n')
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    wall, cpu = reading_without.timed(
        "config", "host", ["sleep 0.3", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"]
    )
    assert 0.3 <= wall < 10 and cpu > 0, (wall, cpu)


def test_the_benchmarks_run_the_read_only_suite_as_sparkrig_check_runs_it():
    from benchmarks.suite_command import read_only_suite  # noqa: PLC0415

    argv = read_only_suite("inv.py", plugins=["benchmarks.replay"], limit="a,b")
    assert argv[:4] == [sys.executable, "-m", "pytest", "-q"]
    assert argv[4:] == [
        *("-p", "benchmarks.replay", "-p", "no:cacheprovider", "tests/compliance", "--inventory", "inv.py"),
        *("--limit", "a,b", "-m", "read", "--capture=sys", "-p", "no:logging"),
    ]
    assert "--capture=sys" not in read_only_suite("inv.py", marker="not lab")  # the action controls too
