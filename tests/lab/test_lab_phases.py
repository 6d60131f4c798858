"""The lab's fixtures say what they do as they go (tests/conftest.py: lab_says)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import deploy_summary
from tests.support import REPO, DeployResult


def test_a_fixtures_phase_shows_under_pytests_default_capture(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "from tests.conftest import lab_says\n\n"
        "@pytest.fixture(scope='session')\n"
        "def booted(request):\n"
        "    print('held back, as pytest holds back what fixtures print')\n"
        "    lab_says(request.config, 'booting 4 hosts')\n"
        "    yield\n"
        "    lab_says(request.config, 'lab down in 3 s')\n"
    )
    (tmp_path / "test_x.py").write_text("def test_x(booted):\n    pass\n\ndef test_y(booted):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # Each phase on a line of its own, in order, where it happens: before the tests, after them.
    booting, down = lines.index("lab: booting 4 hosts"), lines.index("lab: lab down in 3 s")
    assert booting < lines.index("test_x.py .") < down, lines
    assert "held back" not in result.stdout


def test_a_phase_quotes_the_deploys_own_summary_line():
    log = "--> Disconnecting from hosts...\n--> 4 hosts, 127 changes on 4 hosts\n"
    assert deploy_summary(DeployResult(0, None, log)) == "4 hosts, 127 changes on 4 hosts"
    assert deploy_summary(DeployResult(1, None, "--> pyinfra error: No hosts remaining!\n")) == "exit status 1"


def _run(returncode: int, log: str, *operations: tuple[str, str, dict[str, list[str]]]) -> DeployResult:
    ops = [
        {"op_hash": h, "name": name, "names": [name], "success": [], "error": [], "no_change": [], **hosts}
        for h, name, hosts in operations
    ]
    return DeployResult(returncode, {"results": {"operations": ops}}, log)


def test_runs_over_disjoint_hosts_merge_into_one_result_by_operation():
    """Converge 1/2 of the emulated host runs apart from the others' (tests/conftest.py): the
    tests read one result, each operation with every run's hosts and names."""
    native = _run(0, "native\n", ("a", "Install x", {"success": ["h1", "h2"]}), ("b", "Here", {"no_change": ["h1"]}))
    emulated = _run(1, "emulated\n", ("a", "Install x (arm64)", {"error": ["g1"]}), ("c", "Own", {"success": ["g1"]}))
    merged = DeployResult.merged([native, emulated])
    assert merged.returncode == 1
    assert merged.log == "native\nemulated\n"
    assert merged.runs == (native, emulated)
    assert merged.hosts() == {"h1", "h2", "g1"}
    assert merged.changed() == {"h1": ["Install x"], "h2": ["Install x"], "g1": ["Own"]}
    assert merged.errors() == {"g1": ["Install x"]}
    # A name that differs between the runs' hosts shows, as it would in one run.
    assert [op["names"] for op in merged.operations()] == [["Install x", "Install x (arm64)"], ["Here"], ["Own"]]
    assert DeployResult.merged([native, _run(0, "")]).returncode == 0
