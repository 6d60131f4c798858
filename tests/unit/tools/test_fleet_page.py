"""The fleet page (tools/fleet_page.py): its structure, its escaping of what hosts say, the
marking of versions that differ; and the page itself in headless Chromium: it renders, a failed
control shows, the filter works (a screenshot is kept, see ``ARTIFACTS``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkrig.tools import fleet_page
from sparkrig.tools.fleet_page import Control, Host
from sparkrig.tools.report import COLUMNS, differing, page_hosts
from tests.compliance.conftest import HostTable
from tests.support import REPO, host_table, unavailable
from tests.unit.tools.test_fleet import _compliance

# Where the browser test leaves its screenshot and the page it took it of; CI keeps this folder.
ARTIFACTS = Path(os.environ.get("SPARKRIG_ARTIFACTS", REPO / "artifacts"))
CHROMIUM = "/usr/bin/chromium"
# Markup a hostile host could print: were it not escaped, the browser would mark the page's body.
HOSTILE = (
    '<script>document.body.dataset.pwned="script"</script><img src=x onerror="document.body.dataset.pwned=\'img\'">"\'&'
)


def _versions(**changed) -> dict[str, str]:
    cells = {
        "os": "debian 12",
        "dgx_os": "-",
        "kernel": "6.8.0-1015-nvidia",
        "kernel_pkgs": "6.8.0-1015.16",
        "driver": "580.95.05",
        "driver_pkgs": "580.95.05-0ubuntu1",
        "cuda": "13.0",
        "docker": "28.3.3",
        "toolkit": "1.17.8-1",
        "torch": "2.9.0+cu130",
        "vllm": "0.11.0",
        "reboot": "-",
    }
    return {**cells, **changed}


def fleet() -> dict[str, Host]:
    """Three hosts: one drifted (another kernel) with a failed control, one whose versions
    could not be read, and one whose every string is hostile markup."""
    rows = {
        "spark-01": _versions(),
        "spark-02": _versions(kernel="6.17.0-1008-nvidia"),
        HOSTILE: _versions(torch=HOSTILE),
    }
    report = {
        "hosts": {
            name: {"versions": cells, "differs": marks}
            for (name, cells), marks in zip(rows.items(), differing(rows).values())
        },
        "errors": {"spark-03": "could not connect (ssh: connect to host spark-03 port 22: No route to host)"},
        "read": "2026-11-25T10:00:00+00:00",
    }
    hosts = page_hosts(report)
    swap = "Protects against the freeze itself: while a swap area is active, memory pressure hangs the box."
    hosts["spark-01"] = hosts["spark-01"]._replace(
        controls=[
            Control("swap", "test_no_swap_is_active", "passed", "", swap),
            Control(
                "containers",
                "test_a_container_runs_with_the_nvidia_runtime",
                "skipped",
                "containerd's shim cannot start under qemu-user",
                "Protects against a broken runtime.",
            ),
        ],
        controls_read="2026-11-25T10:00:01+00:00 to 2026-11-25T10:00:09+00:00",
    )
    hosts["spark-02"] = hosts["spark-02"]._replace(
        controls=[
            Control("swap", "test_no_swap_is_active", "failed", "swap is active: /swap.img", swap),
            Control("updates", "test_the_running_kernel_is_the_expected_one", "passed", "", "Protects against drift."),
        ]
    )
    hosts[HOSTILE] = hosts[HOSTILE]._replace(controls=[Control(HOSTILE, HOSTILE, "failed", HOSTILE, HOSTILE)])
    return hosts


def page() -> str:
    return fleet_page.render(fleet(), columns=COLUMNS, source="a test", generated="2026-11-25T10:00:10+00:00")


class Parsed(HTMLParser):
    """The page's elements: tags as (name, attributes), the rows of each table, the scripts."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.rows: dict[str, list[dict]] = {}
        self.scripts: list[str] = []
        self._table = self._row = self._cell = None
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "table":
            self._table = attributes.get("id")
        elif tag == "tr" and self._table:
            self._row = {"attrs": attributes, "cells": []}
        elif tag in ("td", "th") and self._row is not None:
            self._cell = {"attrs": attributes, "text": ""}
        elif tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row["cells"].append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.setdefault(self._table, []).append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data
        if self._in_script:
            self.scripts[-1] += data


def test_the_page_has_a_row_per_host_and_per_control_with_its_outcome_reason_and_protection():
    parsed = Parsed(page())
    heads = [cell["text"] for cell in parsed.rows["versions"][0]["cells"]]
    assert heads[:4] == ["host", "passed", "failed", "skipped"]
    assert {"kernel", "driver", "CUDA", "Docker", "toolkit", "torch", "vLLM"} <= set(heads)
    assert heads[-2:] == ["versions read", "controls run"]
    versions = {row["cells"][0]["text"]: row for row in parsed.rows["versions"][1:]}
    assert list(versions) == ["spark-01", "spark-02", HOSTILE, "spark-03"]
    assert [c["text"] for c in versions["spark-02"]["cells"][1:4]] == ["1", "1", "0"]
    assert versions["spark-02"]["attrs"]["data-status"] == "failed"
    assert versions["spark-01"]["attrs"]["data-status"] == "ok"
    assert versions["spark-01"]["cells"][-2]["text"] == "2026-11-25 10:00:00"
    assert versions["spark-01"]["cells"][-2]["attrs"]["title"] == "2026-11-25T10:00:00+00:00"
    assert versions["spark-01"]["cells"][-1]["text"] == "2026-11-25 10:00:01 to 2026-11-25 10:00:09"
    assert versions["spark-03"]["cells"][-2]["text"] == (
        "versions not read: could not connect (ssh: connect to host spark-03 port 22: No route to host)"
    )
    controls = parsed.rows["controls"][1:]
    failed = [r for r in controls if r["attrs"]["data-status"] == "failed" and r["attrs"]["data-host"] == "spark-02"]
    assert len(failed) == 1
    cells = [c["text"] for c in failed[0]["cells"]]
    assert cells == [
        "spark-02",
        "failed",
        "swap",
        "test_no_swap_is_active",
        "swap is active: /swap.img",
        "Protects against the freeze itself: while a swap area is active, memory pressure hangs the box.",
    ]
    skipped = next(r for r in controls if r["attrs"]["data-status"] == "skipped")
    assert skipped["cells"][4]["text"] == "containerd's shim cannot start under qemu-user"
    # A failed control comes first, and the page says which hosts need a look.
    assert controls[0]["attrs"]["data-status"] == "failed"
    assert '<p class="alert">Needs a look: <a href="#host=spark-02">spark-02</a>, <a href="#host=%3Cscript' in page()


def test_a_version_that_differs_from_most_hosts_is_marked_with_what_they_have():
    parsed = Parsed(page())
    versions = {row["cells"][0]["text"]: row for row in parsed.rows["versions"][1:]}
    heads = [cell["text"] for cell in parsed.rows["versions"][0]["cells"]]
    kernel, torch = heads.index("kernel"), heads.index("torch")
    marked = {
        name: [heads[i] for i, c in enumerate(row["cells"]) if c["attrs"].get("class") == "differs"]
        for name, row in versions.items()
    }
    assert marked == {"spark-01": [], "spark-02": ["kernel"], HOSTILE: ["torch"], "spark-03": []}
    assert versions["spark-02"]["cells"][kernel]["attrs"]["title"] == "differs from most hosts (6.8.0-1015-nvidia)"
    assert versions["spark-02"]["cells"][kernel]["text"] == "6.17.0-1008-nvidia"
    assert versions["spark-01"]["cells"][torch]["text"] == "2.9.0+cu130"


def test_what_a_host_says_cannot_add_markup_or_script():
    text = page()
    parsed = Parsed(text)
    # The page's own script alone, no element the hostile strings named, no handler attribute.
    assert [tag for tag, _ in parsed.tags].count("script") == 1
    assert "img" not in [tag for tag, _ in parsed.tags]
    assert not any(name.startswith("on") for _, attrs in parsed.tags for name in attrs)
    assert HOSTILE not in parsed.scripts[0]
    # ... and each hostile string is shown as text, where it was put.
    cells = [c["text"] for rows in parsed.rows.values() for row in rows for c in row["cells"]]
    assert cells.count(HOSTILE) >= 7  # host (twice), torch, concern, control, reason, protects
    assert f'data-host="{fleet_page.escape(HOSTILE)}"' in text
    assert f'<option value="{fleet_page.escape(HOSTILE)}">' in text


def test_the_page_needs_no_network():
    text = page()
    parsed = Parsed(text)
    assert not {"link", "img", "iframe", "object"} & {tag for tag, _ in parsed.tags}
    assert not any("src" in attrs for _, attrs in parsed.tags)
    assert all(attrs["href"].startswith("#") for tag, attrs in parsed.tags if tag == "a")
    assert "//" not in fleet_page.STYLE and "http" not in fleet_page.SCRIPT
    assert "default-src 'none'" in text  # and the browser fetches nothing, should a string try


def test_every_control_has_its_protects_against_line():
    known = fleet_page.protections()
    assert len(known) > 90
    assert all(text.startswith("Protects against ") for text in known.values())
    assert known["test_no_swap_is_active"].startswith("Protects against the freeze itself: ")


@pytest.mark.parametrize(
    ("key", "host", "name"),
    [
        ("test_swap.py::test_no_swap_is_active[ssh://lab-deb12]", "lab-deb12", "test_no_swap_is_active"),
        ("test_jobs.py::test_y[ssh://lab-deb12-spark-run]", "lab-deb12", "test_y[spark-run]"),
        ("test_jobs.py::test_y[ssh://lab-deb12-b-spark-run]", "lab-deb12-b", "test_y[spark-run]"),
        ("test_swap.py::test_no_swap_is_active[local]", "@local", "test_no_swap_is_active"),
        ("test_jobs.py::test_y[local-spark-run]", "@local", "test_y[spark-run]"),
    ],
)
def test_a_control_is_named_without_its_host(key, host, name):
    control = fleet_page.control_of(key, host, "passed", "", {"test_no_swap_is_active": "Protects against x."})
    assert (control.name, control.concern) == (name, key.split("::")[0][5:-3])
    assert control.protects == ("Protects against x." if name == "test_no_swap_is_active" else "")


def test_the_suites_table_keeps_why_a_control_was_skipped_and_when_it_ran():
    table = HostTable(["h1"])
    table.add(
        SimpleNamespace(
            nodeid="tests/compliance/test_swap.py::test_x[ssh://h1]",
            when="setup",
            failed=False,
            skipped=True,
            passed=False,
            start=100.0,
            stop=101.0,
            longrepr=("tests/compliance/test_swap.py", 30, "Skipped: swap_disable is False"),
        )
    )
    table.add(
        SimpleNamespace(
            nodeid="tests/compliance/test_swap.py::test_y[ssh://h1]",
            when="call",
            failed=False,
            skipped=False,
            passed=True,
            start=99.0,
            stop=105.0,
            longrepr=None,
        )
    )
    assert table.skips == {("h1", "test_swap.py::test_x[ssh://h1]"): "swap_disable is False"}
    assert table.spans == {"h1": [99.0, 105.0]}


# --- the page in a browser -----------------------------------------------------------


def _chromium() -> str:
    """The browser, or a skip naming what is missing; in CI (CI=true) a missing browser fails."""
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    unavailable(
        f"{CHROMIUM} is missing (apt-get install chromium; .ci/install does): the page is not opened in a browser"
    )


def _browse(browser: str, url: str, *action: str) -> subprocess.CompletedProcess:
    """Headless Chromium on ``url`` with a fresh profile, nothing fetched beside the page."""
    with tempfile.TemporaryDirectory(prefix="sparkrig-chromium-") as profile:
        return subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                "--window-size=1600,1000",
                *action,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )


def _dom(browser: str, url: str) -> Parsed:
    """The page's DOM after its script ran (``--dump-dom``)."""
    result = _browse(browser, url, "--dump-dom")
    assert result.returncode == 0 and "<html" in result.stdout, result.stderr[-2000:]
    parsed = Parsed(result.stdout)
    parsed.text = result.stdout
    return parsed


def test_the_page_renders_in_chromium_shows_the_failure_and_filters(tmp_path):
    browser = _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "fleet-page.html"
    fleet_page.write(path, page())
    url = path.resolve().as_uri()

    dom = _dom(browser, url)
    body = next(attrs for tag, attrs in dom.tags if tag == "body")
    assert body.get("data-ready") == "yes"  # the script ran to its end
    assert "data-pwned" not in body  # and no markup a host printed ran
    controls = dom.rows["controls"][1:]
    assert not any("hidden" in row["attrs"] for row in controls)  # no filter: every control shown
    failed = [row for row in controls if row["attrs"]["data-status"] == "failed"]
    assert [row["cells"][4]["text"] for row in failed] == ["swap is active: /swap.img", HOSTILE]

    # The fragment sets the filter: only spark-02's failed control stays shown, in both tables.
    dom = _dom(browser, url + "#status=failed&host=spark-02")
    shown = [row for row in dom.rows["controls"][1:] if "hidden" not in row["attrs"]]
    assert [(r["attrs"]["data-host"], r["cells"][3]["text"]) for r in shown] == [("spark-02", "test_no_swap_is_active")]
    hosts = [row["cells"][0]["text"] for row in dom.rows["versions"][1:] if "hidden" not in row["attrs"]]
    assert hosts == ["spark-02"]
    assert '<span id="shown">1 of 5 controls shown</span>' in dom.text
    dom = _dom(browser, url + "#q=qemu")
    assert [r["attrs"]["data-status"] for r in dom.rows["controls"][1:] if "hidden" not in r["attrs"]] == ["skipped"]

    shot = ARTIFACTS / "fleet-page.png"
    shot.unlink(missing_ok=True)
    result = _browse(browser, url, f"--screenshot={shot}")
    assert result.returncode == 0 and shot.stat().st_size > 10_000, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_suite_writes_the_page_of_a_host_it_cannot_reach(tmp_path):
    """The real compliance suite's swap controls, and sparkrig report, against a host that refuses
    SSH: every control failed with ssh's reason, the versions not read, saying why."""

    result = _compliance(tmp_path, "--fleet-page", str(tmp_path / "fleet.html"))
    assert result.returncode == 1, result.stdout
    assert result.stdout.splitlines()[-2] == f"fleet page: {tmp_path / 'fleet.html'}", result.stdout[-2000:]
    parsed = Parsed((tmp_path / "fleet.html").read_text())
    (host,) = parsed.rows["versions"][1:]
    assert host["cells"][0]["text"] == "nobox" and host["attrs"]["data-status"] == "failed"
    assert host["cells"][-2]["text"].startswith("versions not read: could not connect"), host["cells"][-2]
    controls = parsed.rows["controls"][1:]
    assert len(controls) == 5 and {r["attrs"]["data-status"] for r in controls} == {"failed"}
    assert all("Connection refused" in r["cells"][4]["text"] for r in controls)
    assert all(r["cells"][5]["text"].startswith("Protects against ") for r in controls)
    assert {r["cells"][2]["text"] for r in controls} == {"swap"}


# --- bytes that are not UTF-8 -------------------------------------


def test_a_byte_that_is_not_utf8_is_shown_and_the_page_still_written(tmp_path):
    """A host's byte that was not UTF-8 arrives as a lone surrogate ('\\udcff'); writing the
    page raised on it, and no page came (sparkrig report --html, the suite's --fleet-page)."""
    hosts = {
        "spark-01": Host(versions=_versions(torch="2.11.0\udcff"), differs=["torch"]),
        "spark-02": Host(
            versions_error="FactProcessError: \udcfe", controls=[Control("swap", "test_x", "failed", "found \udcfd")]
        ),
    }
    fleet_page.write(tmp_path / "fleet.html", fleet_page.render(hosts, columns=COLUMNS))
    cells = [
        c["text"]
        for rows in Parsed((tmp_path / "fleet.html").read_text()).rows.values()
        for row in rows
        for c in row["cells"]
    ]
    assert "2.11.0\\udcff" in cells and "found \\udcfd" in cells
    assert "versions not read: FactProcessError: \\udcfe" in cells


def test_tools_report_writes_the_page_of_a_venv_whose_metadata_is_not_utf8(tmp_path):
    """The real sparkrig report --html on @local (this machine, read only), its venv's torch
    METADATA with a Latin-1 byte in the Version: the page is written, and the host's row
    says why it was not read (the version is no version: the fact fails that host, naming the
    file), the byte shown escaped; the exit status says a host was not read."""
    info = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "torch-2.11.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\xff\n")
    (tmp_path / "inv.py").write_text(f'hosts = [("@local", {{"python_venv_path": {str(tmp_path / "venv")!r}}})]\n')
    result = subprocess.run(
        [sys.executable, "-m", "sparkrig.tools", "report", "inv.py", "--html", "fleet.html"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    (row,) = Parsed((tmp_path / "fleet.html").read_text()).rows["versions"][1:]
    (why,) = [c["text"] for c in row["cells"] if c["text"].startswith("versions not read")]
    assert "torch-2.11.0.dist-info/METADATA: its Version '2.11.0\\udcff' is not a version" in why
    assert "is not a version" in result.stdout


# --- @local, as a user logged into the box runs the suite ------


def test_at_local_has_its_row_in_the_table_and_its_controls_and_versions_on_the_page(tmp_path):
    """The real suite's swap controls on @local (testinfra's local backend: this machine, read
    only), from another directory with a relative --inventory, as a user types it. testinfra
    names the host ``local`` in test ids (not ``local://``, which unit tests had fed): the
    per-host table was missing and the page said "No controls on this page". And --fleet-page
    read the versions with the repository's file of that name instead of the caller's."""
    (tmp_path / "inv.py").write_text('here = [("@local", {})]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(REPO / "tests/compliance/test_swap.py"),
            "--inventory",
            "inv.py",
            "--fleet-page",
            "fleet.html",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(REPO)},
    )
    table = host_table(result.stdout, result.stderr)
    row = table[1].split()
    assert row[0] == "@local" and sum(int(n) for n in row[1:4]) == 5, table
    parsed = Parsed((tmp_path / "fleet.html").read_text())
    controls = parsed.rows["controls"][1:]
    assert len(controls) == 5 and {r["cells"][0]["text"] for r in controls} == {"@local"}
    assert all(r["cells"][3]["text"].startswith("test_") and "local" not in r["cells"][3]["text"] for r in controls)
    (versions,) = parsed.rows["versions"][1:]
    heads = [c["text"] for c in parsed.rows["versions"][0]["cells"]]
    cells = dict(zip(heads, (c["text"] for c in versions["cells"])))
    assert cells["host"] == "@local" and cells["OS"] not in ("", "-"), cells  # this machine's, read


# --- each cell's rule, one host at a time -------------------------------------------------


def test_why_a_hosts_versions_were_not_read_is_escaped_too():
    """The error cell spans the version columns and is written apart from the other cells."""
    text = fleet_page.render({"spark-01": Host(versions_error=f"FactProcessError: {HOSTILE}")}, columns=COLUMNS)
    parsed = Parsed(text)
    assert [tag for tag, _ in parsed.tags].count("script") == 1 and "img" not in [tag for tag, _ in parsed.tags]
    (row,) = parsed.rows["versions"][1:]
    assert row["cells"][1]["text"] == f"versions not read: FactProcessError: {HOSTILE}"
    assert row["attrs"]["data-status"] == "failed"


def test_a_host_that_drifted_and_failed_nothing_is_drift_not_ok():
    rows = {"spark-01": _versions(), "spark-02": _versions(), "spark-03": _versions(driver="575.57.08")}
    report = {
        "hosts": {
            name: {"versions": cells, "differs": marks}
            for (name, cells), marks in zip(rows.items(), differing(rows).values())
        },
        "errors": {},
        "read": "",
    }
    parsed = Parsed(fleet_page.render(page_hosts(report), columns=COLUMNS))
    status = {row["cells"][0]["text"]: row["attrs"]["data-status"] for row in parsed.rows["versions"][1:]}
    assert status == {"spark-01": "ok", "spark-02": "ok", "spark-03": "drift"}


def test_with_no_majority_every_host_of_a_tie_is_marked_on_the_page():
    """Two kernels, one host each: neither is "what most hosts have", so both are marked."""
    rows = {"spark-01": _versions(), "spark-02": _versions(kernel="6.17.0-1008-nvidia")}
    report = {
        "hosts": {
            name: {"versions": cells, "differs": marks}
            for (name, cells), marks in zip(rows.items(), differing(rows).values())
        },
        "errors": {},
        "read": "",
    }
    parsed = Parsed(fleet_page.render(page_hosts(report), columns=COLUMNS))
    heads = [cell["text"] for cell in parsed.rows["versions"][0]["cells"]]
    marked = {
        row["cells"][0]["text"]: [heads[i] for i, c in enumerate(row["cells"]) if c["attrs"].get("class") == "differs"]
        for row in parsed.rows["versions"][1:]
    }
    assert marked == {"spark-01": ["kernel"], "spark-02": ["kernel"]}
