"""The compliance suite's results as data and its waivers (tests/compliance/results.py), in real
pytest sessions on @local (testinfra's local backend: this machine, read only) with the real
compliance conftest and a tiny control file of this test's: STAND_IN's three controls stand in
for the suite's (one reads the kernel, one fails while a flag file is missing, one skips)."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from sparkrig.tools import fleet_page
from sparkrig.tools.report import COLUMNS, GPU_COLUMNS
from tests.compliance import results
from tests.support import REPO, host_table
from tests.unit.tools.test_fleet_page import Parsed

STAND_IN = '''"""Stand-in controls of tests/unit/tools/test_results.py (not the suite's)."""

import os

import pytest

# They ask the host themselves, as the suite's action controls do (read-only ones read
# through their declared needs).
pytestmark = pytest.mark.action


def test_the_kernel_is_read(host):
    """Protects against a host that cannot say its kernel.

    A second paragraph, not part of the protection."""
    assert host.check_output("uname -r")


def test_a_flag_file_is_there(host):
    """Protects against a missing flag file (a stand-in fault the test switches on and off)."""
    flag = os.environ["SPARKRIG_STAND_IN_FLAG"]
    assert host.file(flag).exists, f"{flag} is missing"


def test_skipped_here(host):
    """Protects against nothing here: it skips."""
    pytest.skip("a stand-in skip")


@pytest.fixture
def broken():
    if os.environ.get("SPARKRIG_STAND_IN_BROKEN"):
        raise RuntimeError("a stand-in setup failure")


def test_its_fixture_may_fail(host, broken):
    """Protects against a fixture that fails (with SPARKRIG_STAND_IN_BROKEN set)."""
'''
FAULT = "test_stand_in.py::test_a_flag_file_is_there"


def _suite(
    tmp_path: Path, *options: str, workers: str = "0", inventory: str = 'here = [("@local", {})]\n', **env_vars: str
) -> subprocess.CompletedProcess:
    """pytest on the stand-in controls with the compliance conftest, @local as the inventory."""
    (tmp_path / "test_stand_in.py").write_text(STAND_IN)
    (tmp_path / "inv.py").write_text(inventory)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(REPO), SPARKRIG_STAND_IN_FLAG=str(tmp_path / "flag"), **env_vars)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "test_stand_in.py",
            "-p",
            "tests.compliance.conftest",
            "--inventory",
            "inv.py",
            "-n",
            workers,
            "-p",
            "no:cacheprovider",
            "-o",
            "markers=action: a stand-in control that asks the host itself",
            *options,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _documents(directory: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def _controls(doc: dict) -> dict[str, dict]:
    (host,) = doc["hosts"].values()
    return {c["id"]: c for c in host["controls"]}


def _waivers(tmp_path: Path, text: str) -> str:
    (tmp_path / "waivers.yaml").write_text(text)
    return str(tmp_path / "waivers.yaml")


def _today(days: int = 0) -> str:
    return (datetime.now(timezone.utc).date() + timedelta(days=days)).isoformat()


def test_a_run_writes_one_json_document_with_each_controls_outcome_reason_protection_and_the_versions(tmp_path):
    result = _suite(tmp_path, "--results", "out", SPARKRIG_STAND_IN_BROKEN="1")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    (path,) = (tmp_path / "out").iterdir()  # nothing else: the temporary file is gone
    assert re.fullmatch(r"\d{8}T\d{6}Z\.json", path.name), path.name
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700
    assert result.stdout.splitlines()[-2] == f"results: out/{path.name}"
    doc = json.loads(path.read_text())
    assert doc["schema"] == "sparkrig.compliance.results/1"
    assert path.name == datetime.fromisoformat(doc["started"]).strftime("%Y%m%dT%H%M%SZ.json")
    assert doc["inventory"] == "inv.py" and list(doc["hosts"]) == ["@local"]
    controls = _controls(doc)
    assert {k: {f: c[f] for f in ("host", "outcome", "reason", "protects")} for k, c in controls.items()} == {
        "test_stand_in.py::test_the_kernel_is_read": {
            "host": "@local",
            "outcome": "passed",
            "reason": "",
            "protects": "Protects against a host that cannot say its kernel.",
        },
        FAULT: {
            "host": "@local",
            "outcome": "failed",
            "reason": f"{tmp_path / 'flag'} is missing",
            "protects": "Protects against a missing flag file (a stand-in fault the test switches on and off).",
        },
        "test_stand_in.py::test_skipped_here": {
            "host": "@local",
            "outcome": "skipped",
            "reason": "a stand-in skip",
            "protects": "Protects against nothing here: it skips.",
        },
        "test_stand_in.py::test_its_fixture_may_fail": {
            "host": "@local",
            "outcome": "error",
            "reason": "RuntimeError: a stand-in setup failure (at setup)",
            "protects": "Protects against a fixture that fails (with SPARKRIG_STAND_IN_BROKEN set).",
        },
    }
    assert all(0 < controls[k]["duration_s"] < 60 for k in ("test_stand_in.py::test_the_kernel_is_read", FAULT)), (
        controls
    )
    # The versions, as sparkrig report reads them (this machine's, read).
    (host,) = doc["hosts"].values()
    assert set(host["versions"]) == {*COLUMNS, *GPU_COLUMNS} and host["versions"]["os"] not in ("", "-"), host
    assert host["versions_read"] and not host["versions_error"]
    # The reason is the table's line.
    assert f"  @local: {FAULT}[local]: {tmp_path / 'flag'} is missing" in host_table(result.stdout)


def test_a_waiver_accepts_a_failure_which_then_fails_nothing_and_shows_as_waived(tmp_path):
    waivers = _waivers(
        tmp_path,
        f"""# accepted failures
- control: {FAULT}
  hosts: "@loc*"
  justification: the flag file comes with the next image (OPS-1)
  expires: {_today(1)}
""",
    )
    result = _suite(
        tmp_path, "--results", "out", "--waivers", waivers, "--fleet-page", "page.html", "--junitxml", "junit.xml"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    table = host_table(result.stdout)
    assert table[1].split() == ["@local", "2", "0", "1"], table
    assert table[2:4] == [
        "waived controls (failed, accepted by --waivers):",
        f"  @local: {FAULT}[local]: {tmp_path / 'flag'} is missing (waived until "
        f"{_today(1)}: the flag file comes with the next image (OPS-1))",
    ], table
    (doc,) = _documents(tmp_path / "out")
    control = _controls(doc)[FAULT]
    assert control["outcome"] == "waived" and control["reason"].endswith(
        f"(waived until {_today(1)}: the flag file comes with the next image (OPS-1))"
    )
    assert control["waiver"] == {
        "justification": "the flag file comes with the next image (OPS-1)",
        "expires": _today(1),
        "line": 2,
        "expired": False,
    }
    page = Parsed((tmp_path / "page.html").read_text())
    # The versions, read once, on the page and in the document alike.
    heads = [c["text"] for c in page.rows["versions"][0]["cells"]]
    (row,) = page.rows["versions"][1:]
    assert dict(zip(heads, (c["text"] for c in row["cells"])))["OS"] == doc["hosts"]["@local"]["versions"]["os"] != ""
    rows = page.rows["controls"][1:]
    (waived,) = [r for r in rows if r["attrs"]["data-status"] == "waived"]
    assert waived["cells"][3]["text"] == "test_a_flag_file_is_there"
    assert "skipped" in (tmp_path / "junit.xml").read_text()  # CI and sparkrig rollout: not a failure


def test_a_waiver_for_other_hosts_or_another_control_accepts_nothing(tmp_path):
    waivers = _waivers(
        tmp_path,
        f"""- control: {FAULT}
  hosts: "spark-*"
  justification: not this box
  expires: {_today(30)}
- control: test_stand_in.py::test_another
  hosts: "*"
  justification: another control
  expires: {_today(30)}
""",
    )
    result = _suite(tmp_path, "--waivers", waivers)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "waived" not in result.stdout


def test_an_expired_waiver_fails_again_saying_when_it_expired(tmp_path):
    """Expired on its date (the first day it no longer applies); with xdist's workers, whose
    reports carry the waiver to the controller."""
    waivers = _waivers(
        tmp_path,
        f"""- control: {FAULT}
  hosts: "*"
  justification: the flag file comes with the next image (OPS-1)
  expires: {_today()}
""",
    )
    result = _suite(tmp_path, "--results", "out", "--waivers", waivers, workers="2")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"  @local: {FAULT}[local]: {tmp_path / 'flag'} is missing (its waiver expired on {_today()})" in host_table(
        result.stdout
    ), result.stdout[-3000:]
    (doc,) = _documents(tmp_path / "out")
    control = _controls(doc)[FAULT]
    assert control["outcome"] == "failed" and control["reason"].endswith(f"(its waiver expired on {_today()})")
    assert control["waiver"]["expired"] is True


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            "- control: x\n  hosts: '*'\n  expires: 2026-12-01\n",
            "line 1: missing 'justification' (say why this failure is accepted)",
        ),
        (
            "- control: x\n  hosts: '*'\n  justification: ''\n  expires: 2026-12-01\n",
            "line 3: 'justification' must be a non-empty text",
        ),
        (
            "- control: x\n  hosts: '*'\n  justification: j\n  expires: 2026-12-01\n"
            "- control: y\n  hosts: '*'\n  justification: j\n  expires: 2026-13-01\n",
            "line 8: expires '2026-13-01' is not a date YYYY-MM-DD",
        ),
        (
            "- control: x\n  hosts: '*'\n  justification: j\n  expires: next friday\n",
            "line 4: expires 'next friday' is not a date YYYY-MM-DD",
        ),
        (
            "- control: x\n  hosts: '*'\n  justification: j\n  expires: 20261201\n",
            "line 4: expires '20261201' is not a date YYYY-MM-DD",
        ),
        (
            "- control: x\n  hosts: '*'\n  justification: j\n  expiry: 2026-12-01\n",
            "line 4: unknown key 'expiry' (did you mean 'expires'?): "
            "a waiver has control, hosts, justification, expires",
        ),
        (
            "- control: x\n  control: y\n  hosts: '*'\n  justification: j\n  expires: 2026-12-01\n",
            "line 2: 'control' given twice in one waiver",
        ),
        ("- control: x\n  justification: j\n  expires: 2026-12-01\n", "line 1: missing 'hosts'"),
        ("control: x\n", 'line 1: expected a list of waivers (each "- control: ...")'),
        ("- just a line\n", "line 1: a waiver is a mapping of control, hosts, justification, expires"),
        ("- control: x\n  hosts: [\n", "line 3: not YAML: expected the node content, but found '<stream end>'"),
    ],
)
def test_a_malformed_waiver_file_stops_the_run_before_any_control_naming_the_line(tmp_path, text, why):
    """The inventory's host is a listening socket of this test's: nothing connects to it."""
    waivers = _waivers(tmp_path, text)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        box = f'boxes = [("box", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}, "ssh_user": "nobody"}})]\n'
        result = _suite(tmp_path, "--waivers", waivers, "--results", "out", inventory=box)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.strip() == f"ERROR: --waivers {waivers} {why}"
    assert "test session starts" not in result.stdout  # no session, no control
    assert not (tmp_path / "out").exists()


def test_the_page_shows_what_changed_since_the_previous_run_in_the_directory(tmp_path):
    """Two real runs into one directory: the flag file there, then gone (and back)."""
    (tmp_path / "flag").touch()
    first = _suite(tmp_path, "--results", "out")
    assert first.returncode == 0, first.stdout[-3000:]
    (tmp_path / "flag").unlink()
    second = _suite(tmp_path, "--results", "out", "--fleet-page", "page.html")
    assert second.returncode == 1, second.stdout[-3000:]
    one, two = _documents(tmp_path / "out")
    parsed = Parsed((tmp_path / "page.html").read_text())
    rows = [[c["text"] for c in row["cells"]] for row in parsed.rows["changes"][1:]]
    since = f"{two['started'][:10]} {two['started'][11:19]}"
    assert rows == [["newly failing", "@local", FAULT, f"{tmp_path / 'flag'} is missing", since]]
    assert (
        f"<h2>Changes since the previous run ({one['started'][:10]} {one['started'][11:19]})</h2>"
        in (tmp_path / "page.html").read_text()
    )
    (tmp_path / "flag").touch()
    _suite(tmp_path, "--results", "out", "--fleet-page", "page.html")
    rows = [
        [c["text"] for c in row["cells"]] for row in Parsed((tmp_path / "page.html").read_text()).rows["changes"][1:]
    ]
    assert rows == [["fixed", "@local", FAULT, "now passed", ""]]
    assert two["started"] > one["started"]


# --- the pieces, each alone -------------------------------------------------------------


def _doc(started: str, outcomes: dict[str, str], **versions) -> dict:
    return {
        "schema": results.SCHEMA,
        "started": started,
        "hosts": {
            "spark-01": {
                "versions": {"kernel": "6.8", "driver": "580", **versions},
                "controls": [
                    {"id": control, "outcome": outcome, "reason": f"{control} said so"}
                    for control, outcome in outcomes.items()
                ],
            }
        },
    }


def test_changes_say_newly_failing_still_failing_since_when_fixed_and_versions_changed():
    runs = [  # newest first
        _doc("2026-11-25T10:00:00+00:00", {"a": "failed", "b": "passed", "c": "failed", "d": "passed", "e": "waived"}),
        _doc("2026-11-24T10:00:00+00:00", {"a": "error", "b": "passed", "c": "failed", "e": "failed"}),
        _doc("2026-11-23T10:00:00+00:00", {"a": "passed", "c": "failed", "e": "passed"}),
        _doc("2026-11-22T10:00:00+00:00", {"a": "failed", "c": "waived"}),
    ]
    now = _doc(
        "2026-11-26T10:00:00+00:00",
        {"a": "failed", "b": "failed", "c": "passed", "d": "skipped", "e": "failed"},
        kernel="6.17",
    )
    found = fleet_page.changes(now, runs)
    assert found.previous == "2026-11-25T10:00:00+00:00"
    # e's waiver expired: newly failing the run, failing since its failure began (waived in between).
    assert found.newly_failing == [
        ("spark-01", "b", "b said so", "2026-11-26T10:00:00+00:00"),
        ("spark-01", "e", "e said so", "2026-11-24T10:00:00+00:00"),
    ]
    assert found.still_failing == [("spark-01", "a", "a said so", "2026-11-24T10:00:00+00:00")]
    assert found.fixed == [("spark-01", "c", "passed")]
    assert found.versions == [("spark-01", "kernel", "6.8", "6.17")]
    assert fleet_page.changes(now, []) == fleet_page.Changes()
    page = Parsed(fleet_page.render({"spark-01": fleet_page.Host()}, columns=COLUMNS, changed=found))
    assert [[c["text"] for c in row["cells"]] for row in page.rows["changes"][1:]] == [
        ["newly failing", "spark-01", "b", "b said so", "2026-11-26 10:00:00"],
        ["newly failing", "spark-01", "e", "e said so", "2026-11-24 10:00:00"],
        ["still failing", "spark-01", "a", "a said so", "2026-11-24 10:00:00"],
        ["fixed", "spark-01", "c", "now passed", ""],
        ["version changed", "spark-01", "kernel", "6.8 → 6.17", ""],
    ]


def test_a_document_is_written_whole_and_never_over_an_earlier_one(tmp_path):
    started = datetime(2026, 11, 26, 14, 3, 22, tzinfo=timezone.utc)
    first = results.write_document(tmp_path, {"n": 1, "schema": results.SCHEMA, "hosts": {}}, started)
    second = results.write_document(tmp_path, {"n": 2, "schema": results.SCHEMA, "hosts": {}}, started)
    assert (first.name, second.name) == ("20261126T140322Z.json", "20261126T140322Z-1.json")
    assert json.loads(first.read_text())["n"] == 1 and json.loads(second.read_text())["n"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name])
    assert [d["n"] for d in results.earlier_runs(tmp_path, "20261126T140322Z-2.json")] == [2, 1]


def test_earlier_runs_are_read_newest_first_passing_over_links_and_other_files(tmp_path):
    for name, doc in [
        ("20261124T000000Z.json", _doc("24", {})),
        ("20261125T000000Z.json", _doc("25", {})),
        ("20261123T000000Z.json", {"schema": "other/1", "hosts": {}}),
    ]:
        (tmp_path / name).write_text(json.dumps(doc))
    (tmp_path / "20261125T120000Z.json").write_text("{not json")
    (tmp_path / "20261125T130000Z.json").symlink_to(tmp_path / "20261125T000000Z.json")
    (tmp_path / "20261127T000000Z.json").write_text(json.dumps(_doc("27", {})))
    assert [d["started"] for d in results.earlier_runs(tmp_path, "20261126T000000Z.json")] == ["25", "24"]
    (tmp_path / "notes.json").write_text(json.dumps(_doc("99", {})))  # not a run's name
    assert [d["started"] for d in results.earlier_runs(tmp_path, "20261126T000000Z.json")] == ["25", "24"]


def test_the_results_directory_must_be_the_users_own_and_closed_to_writers(tmp_path):
    assert results.results_dir(str(tmp_path / "new" / "dir")).stat().st_mode & 0o777 == 0o700
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(pytest.UsageError, match="no one else may write"):
        results.results_dir(str(tmp_path / "open"))
    (tmp_path / "link").symlink_to(tmp_path / "new")
    with pytest.raises(pytest.UsageError, match="not a link"):
        results.results_dir(str(tmp_path / "link"))
    (tmp_path / "file").write_text("")
    with pytest.raises(pytest.UsageError, match="must be a directory"):
        results.results_dir(str(tmp_path / "file"))


def test_a_waiver_without_parameters_covers_every_parameter_of_its_control():
    waiver = results.Waiver("test_jobs.py::test_y", "lab-*", "j", datetime(2026, 12, 1).date(), 1)
    assert waiver.covers("test_jobs.py::test_y[spark-run]", "lab-deb12")
    assert waiver.covers("test_jobs.py::test_y", "lab-deb12")
    assert not waiver.covers("test_jobs.py::test_yz", "lab-deb12")
    assert not waiver.covers("test_jobs.py::test_y", "spark-01")
    one = waiver._replace(control="test_jobs.py::test_y[spark-run]")
    assert one.covers("test_jobs.py::test_y[spark-run]", "lab-deb12")
    assert not one.covers("test_jobs.py::test_y[spark-stop]", "lab-deb12")


def test_a_waiver_that_applies_wins_over_an_expired_one():
    day = datetime.now(timezone.utc).date()
    old = results.Waiver("test_swap.py::test_x", "*", "then", day, 1)
    new = results.Waiver("test_swap.py::test_x", "*", "now", day + timedelta(days=1), 5)
    assert results.waiver_for([old, new], "test_swap.py::test_x", "h") == new
    assert results.waiver_for([old], "test_swap.py::test_x", "h") == old  # expired: said so
    assert results.waiver_for([new], "test_swap.py::test_y", "h") is None


def test_earlier_runs_are_bounded_in_number_and_size(tmp_path, monkeypatch):
    for day in ("23", "24", "25"):
        (tmp_path / f"202611{day}T000000Z.json").write_text(json.dumps(_doc(day, {})))
    monkeypatch.setattr(results, "HISTORY_MAX", 2)
    assert [d["started"] for d in results.earlier_runs(tmp_path, "20261126T000000Z.json")] == ["25", "24"]
    monkeypatch.setattr(results, "DOCUMENT_MAX", 10)
    assert results.earlier_runs(tmp_path, "20261126T000000Z.json") == []
