"""
The fleet page: one static HTML file a person opens in a browser (no server, no network:
its style and script are inline), written by the compliance suite (``--fleet-page PATH``)
and by ``sparkrig report INVENTORY --html PATH``.

Per host: its versions (what differs from most hosts marked), each control passed, failed or
skipped with the reason and what it protects against, and when each was read. The tables
sort by a click on a column's heading and filter by outcome, host or text; the filter lives
in the address's fragment (``page.html#status=failed&host=spark-02``), so a link shows what
its sender saw. Without script the page still shows everything, unsorted and unfiltered.

Every string a host or a control supplies is HTML-escaped: a host's output cannot add markup
or script to the page; a byte of it that was not UTF-8 is shown as ``\\udcXX``.
"""

from __future__ import annotations

import ast
import html
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

COMPLIANCE = Path(__file__).resolve().parent.parent / "tests" / "compliance"
OUTCOMES = ("failed", "waived", "skipped", "passed")  # the order controls are listed in
COUNTED = ("passed", "failed", "skipped", "waived")  # the order of the counts, as the terminal's table
FAILING = ("failed", "error")  # outcomes of a results document (tests/compliance/results.py) that fail
# testinfra's id of pyinfra's @local (its local backend, LocalBackend.get_pytest_id()) in a
# control's test id: "local", not the "local://" that names the backend.
LOCAL_ID = "local"
# The version columns a person compares across a fleet, and their headings.
HEADINGS = {
    "os": "OS",
    "dgx_os": "DGX OS",
    "kernel": "kernel",
    "kernel_pkgs": "kernel pkgs",
    "driver": "driver",
    "driver_pkgs": "driver pkgs",
    "cuda": "CUDA",
    "docker": "Docker",
    "toolkit": "toolkit",
    "torch": "torch",
    "vllm": "vLLM",
    "reboot": "reboot",
    "firmware": "firmware",
    "gpu_temp": "GPU temp",
    "gpu_power": "GPU power (draw/limit)",
    "gpu_clock": "SM clock (now/max)",
    "gpu_cap": "clock cap",
    "gpu_reasons": "clock event reasons",
}
# The GPU's state as read with the versions (tools.report): it changes from one read to the
# next, so it is neither drift nor a change worth listing.
STATE_COLUMNS = ("gpu_temp", "gpu_power", "gpu_clock", "gpu_cap", "gpu_reasons")


class Control(NamedTuple):
    """One control's outcome on one host."""

    concern: str  # the module's concern, "swap" for test_swap.py
    name: str  # the control's function, its parameters other than the host in brackets
    outcome: str  # one of OUTCOMES
    reason: str = ""  # what a failed control found, why one was skipped
    protects: str = ""  # what it protects against (its docstring's "Protects against ...")


class Host(NamedTuple):
    """What the page knows of one host; every field may be empty."""

    versions: Mapping[str, str] = {}
    differs: Sequence[str] = ()
    versions_read: str = ""  # when the versions were read (ISO 8601), or why they were not
    versions_error: str = ""
    controls: Sequence[Control] = ()
    controls_read: str = ""  # when the controls ran (ISO 8601, first to last)
    # tools.report's firmware of the host: profile, summary, devices (device -> version), drift
    firmware: Mapping[str, Any] = {}


def protects(doc: str) -> str:
    """A control's "protects against" line: from "Protects against" to the end of the first
    paragraph of its docstring, on one line ("" without one)."""
    paragraph = " ".join((doc or "").strip().split("\n\n", 1)[0].split())
    start = paragraph.find("Protects against")
    return paragraph[start:] if start >= 0 else ""


def protections(directory: Path = COMPLIANCE) -> dict[str, str]:
    """Each control's "protects against" line (:func:`protects`), by the suite's convention
    the first paragraph of its docstring (docs/compliance.md has the short form). Read from
    the source, not imported: the controls need testinfra and a host."""
    found = {}
    for path in sorted(directory.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                line = protects(ast.get_docstring(node) or "")
                if line:
                    found[node.name] = line
    return found


def control_of(key: str, host: str, outcome: str, reason: str, known: Mapping[str, str]) -> Control:
    """A :class:`Control` from the suite's key (``test_swap.py::test_x[ssh://HOST-param]``, ``[local]``),
    testinfra's id of ``host`` left out of its parameters."""
    path, _, test = key.partition("::")
    concern = path.rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    function, _, params = test.partition("[")
    params = params.removesuffix("]")
    spec = LOCAL_ID if host == "@local" else f"ssh://{host}"
    if params == spec or params.startswith(f"{spec}-"):
        params = params[len(spec) + 1 :]
    name = function + (f"[{params}]" if params else "")
    return Control(concern, name, outcome, reason, known.get(function, ""))


class Changes(NamedTuple):
    """What changed since the previous run in a --results directory (tests/compliance/results.py's
    documents): controls newly failing, still failing (since when) and fixed, versions changed."""

    previous: str = ""  # when the previous run started; "" where there was none
    newly_failing: Sequence[tuple[str, str, str, str]] = ()  # host, control id, reason, failing since
    still_failing: Sequence[tuple[str, str, str, str]] = ()  # host, control id, reason, failing since
    fixed: Sequence[tuple[str, str, str]] = ()  # host, control id, its outcome now
    versions: Sequence[tuple[str, str, str, str]] = ()  # host, column, before, now


def _by_control(doc: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(host, c["id"]): c for host, value in doc["hosts"].items() for c in value.get("controls", ())}


def changes(current: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]) -> Changes:
    """What changed from ``earlier[0]`` (the previous run) to ``current``. A failure is newly
    failing where the previous run did not fail it (a waived failure did not fail that run);
    its "since" is the first run of its unbroken streak of failures, waived ones included,
    walking ``earlier`` (newest first) back. A control or host that one of the two runs did
    not check is no change."""
    if not earlier:
        return Changes()
    now, before = _by_control(current), _by_control(earlier[0])
    history = [_by_control(run) for run in earlier]
    newly, still, fixed = [], [], []
    for (host, control), c in now.items():
        if c["outcome"] in FAILING:
            since = current["started"]
            for run, outcomes in zip(earlier, history):
                if outcomes.get((host, control), {}).get("outcome") not in (*FAILING, "waived"):
                    break
                since = run["started"]
            new = before.get((host, control), {}).get("outcome") not in FAILING
            (newly if new else still).append((host, control, c.get("reason", ""), since))
        elif (host, control) in before and before[(host, control)]["outcome"] in FAILING:
            fixed.append((host, control, c["outcome"]))
    versions = []
    for host, value in current["hosts"].items():
        old = earlier[0]["hosts"].get(host, {}).get("versions") or {}
        new = value.get("versions") or {}
        versions += [
            (host, column, old[column], new[column])
            for column in new
            if column in old and old[column] != new[column] and column not in STATE_COLUMNS
        ]
    return Changes(earlier[0]["started"], newly, still, fixed, versions)


def _changes_section(found: Changes | None) -> str:
    if found is None:
        return ""
    if not found.previous:
        return (
            '<h2>Changes</h2>\n<p class="note">No earlier run in the results directory: '
            "the next run's page shows what changed since this one.</p>"
        )
    rows = [
        ("newly failing", host, control, reason, _short(since)) for host, control, reason, since in found.newly_failing
    ]
    rows += [
        ("still failing", host, control, reason, _short(since)) for host, control, reason, since in found.still_failing
    ]
    rows += [("fixed", host, control, f"now {outcome}", "") for host, control, outcome in found.fixed]
    rows += [
        ("version changed", host, HEADINGS.get(column, column), f"{old} → {new}", "")
        for host, column, old, new in found.versions
    ]
    body = "\n".join(
        f'<tr data-change="{escape(change.split()[0])}">'
        + _cell(change, f"change {change.split()[0]}")
        + _cell(host, "host")
        + _cell(what, "control")
        + _cell(detail, "reason")
        + _cell(since, "when")
        + "</tr>"
        for change, host, what, detail, since in rows
    )
    if not rows:
        body = '<tr><td colspan="5">nothing: the same controls fail, and the same versions, as then</td></tr>'
    counts = (
        f"{len(found.newly_failing)} newly failing, {len(found.fixed)} fixed, "
        f"{len(found.still_failing)} still failing, {len(found.versions)} versions changed"
    )
    return f"""<h2>Changes since the previous run ({escape(_short(found.previous))})</h2>
<p class="note">{counts}</p>
<div class="scroll"><table id="changes" class="sortable">
<thead><tr>
<th>change</th><th>host</th><th>control / version</th><th>found / before → now</th><th>failing since</th>
</tr></thead>
<tbody>
{body}
</tbody>
</table></div>"""


def _firmware_section(hosts: Mapping[str, Host]) -> str:
    """Each host's firmware devices (fwupd's), a version that differs from most hosts of the
    same hardware profile marked; a host whose fwupd shows none says so."""
    read = {name: h.firmware for name, h in hosts.items() if h.firmware}
    if not read:
        return ""
    rows = []
    for name, found in read.items():
        profile = found.get("profile", "")
        devices = found.get("devices") or {}
        if not devices:
            rows.append(
                f'<tr data-host="{escape(name)}">'
                + _cell(name, "host")
                + _cell(profile)
                + _cell(found.get("summary", ""), "note")
                + _cell("")
                + "</tr>"
            )
        for device, version in devices.items():
            others = sorted(
                {d.get("devices", {}).get(device) for n, d in read.items() if n != name and d.get("profile") == profile}
                - {None, version}
            )
            drift = device in (found.get("drift") or ())
            cell = (
                _cell(version, "differs", f"differs from most {profile} hosts (others: {', '.join(others)})")
                if drift
                else _cell(version)
            )
            rows.append(
                f'<tr data-host="{escape(name)}" data-status="{"drift" if drift else "ok"}">'
                + _cell(name, "host")
                + _cell(profile)
                + _cell(device, "control")
                + cell
                + "</tr>"
            )
    drifting = sum(bool(found.get("drift")) for found in read.values())
    note = (
        'fwupd\'s devices per host; <span class="differs">marked</span>: a version that differs from most hosts '
        f"of the same hardware profile ({drifting} host{'s' * (drifting != 1)} with drift)."
    )
    return f"""<h2>Firmware</h2>
<p class="note">{note}</p>
<div class="scroll"><table id="firmware" class="sortable">
<thead><tr><th>host</th><th>profile</th><th>device</th><th>version</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table></div>"""


def escape(text: Any) -> str:
    """``text`` HTML-escaped, and as UTF-8 can carry it: a byte a host sent that was not UTF-8
    arrives as a lone surrogate ('\\udcff' from a METADATA's Version), which writing the page
    would refuse (no page at all); it is shown as ``\\udcff``."""
    return html.escape(str(text).encode("utf-8", "backslashreplace").decode("utf-8"))


def now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def _cell(text: Any, cls: str = "", title: str = "", sort: str | None = None) -> str:
    attributes = ""
    if cls:
        attributes += f' class="{escape(cls)}"'
    if title:
        attributes += f' title="{escape(title)}"'
    if sort is not None:
        attributes += f' data-sort="{escape(sort)}"'
    return f"<td{attributes}>{escape(str(text))}</td>"


def _short(when: str) -> str:
    """ISO 8601 times as a person reads them (``2026-11-25 09:48:36``; the zone in the cell's title)."""
    return re.sub(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:[+-]\d\d:\d\d|Z)?", r"\1 \2", when)


def _most(hosts: Mapping[str, Host], column: str) -> str:
    values = [h.versions.get(column, "") for h in hosts.values() if h.versions]
    return max(set(values), key=values.count) if values else ""


def render(
    hosts: Mapping[str, Host],
    *,
    columns: Sequence[str],
    title: str = "sparkrig fleet",
    source: str = "",
    generated: str | None = None,
    changed: Changes | None = None,
) -> str:
    """The whole page, as text (UTF-8 when written); with ``changed``, what changed since the
    previous run comes first."""
    generated = generated or now()
    counts = {o: sum(c.outcome == o for h in hosts.values() for c in h.controls) for o in OUTCOMES}
    failing = [name for name, h in hosts.items() if any(c.outcome == "failed" for c in h.controls) or h.versions_error]
    drifted = [name for name, h in hosts.items() if h.differs]
    with_controls = any(h.controls for h in hosts.values())

    version_rows = []
    for name, h in hosts.items():
        counted = {o: sum(c.outcome == o for c in h.controls) for o in OUTCOMES}
        cells = [_cell(name, "host")]
        if with_controls:
            cells += [
                _cell(counted[o] if h.controls else "", f"n {o}" * bool(counted[o]), sort=str(counted[o]))
                for o in COUNTED
            ]
        if h.versions_error:  # one cell across the versions: why there are none
            cells.append(
                f'<td class="error" colspan="{len(columns) + 1}">versions not read: {escape(h.versions_error)}</td>'
            )
        else:
            for column in columns:
                value = h.versions.get(column, "")
                if column == "known_bad" and column in h.differs:
                    cells.append(_cell(value, "differs", "runs or has installed a known-bad version (sparkrig report)"))
                elif column == "nccl" and column in h.differs:
                    why = "its cluster's nodes load NCCL builds that differ, or one version is two builds here"
                    cells.append(_cell(value, "differs", f"{why} (sparkrig report)"))
                elif column == "boots" and column in h.differs:
                    cells.append(_cell(value, "differs", "a boot ended uncleanly: a panic, an OOM storm or power lost"))
                elif column in h.differs:
                    cells.append(_cell(value, "differs", f"differs from most hosts ({_most(hosts, column) or '-'})"))
                else:
                    cells.append(_cell(value))
            cells.append(_cell(_short(h.versions_read), "when", h.versions_read))
        cells.append(_cell(_short(h.controls_read), "when", h.controls_read))
        status = "failed" if name in failing else ("drift" if name in drifted else "ok")
        version_rows.append(f'<tr data-host="{escape(name)}" data-status="{status}">{"".join(cells)}</tr>')
    heads = [
        "host",
        *(COUNTED if with_controls else ()),
        *(HEADINGS.get(c, c) for c in columns),
        "versions read",
        "controls run",
    ]

    control_rows = []
    rank = {o: str(i) for i, o in enumerate(OUTCOMES)}
    order = {name: i for i, name in enumerate(hosts)}
    every = sorted(
        ((name, c) for name, h in hosts.items() for c in h.controls),
        key=lambda x: (OUTCOMES.index(x[1].outcome), order[x[0]], x[1].concern, x[1].name),
    )
    for name, c in every:  # failed first, across the fleet
        control_rows.append(
            f'<tr data-host="{escape(name)}" data-status="{escape(c.outcome)}">'
            + _cell(name, "host")
            + _cell(c.outcome, f"badge {c.outcome}", sort=rank.get(c.outcome, "9"))
            + _cell(c.concern)
            + _cell(c.name, "control")
            + _cell(c.reason, "reason")
            + _cell(c.protects, "protects")
            + "</tr>"
        )

    summary = [f"{len(hosts)} host{'s' * (len(hosts) != 1)}"]
    if with_controls:
        summary += [f'<span class="n {o}">{counts[o]} {o}</span>' for o in OUTCOMES]
    summary.append(f"{len(drifted)} with versions that differ from most hosts")
    problems = ""
    if failing:
        problems = (
            '<p class="alert">Needs a look: '
            + ", ".join(f'<a href="#host={escape(quote(n, safe=""))}">{escape(n)}</a>' for n in failing)
            + "</p>"
        )
    options = "".join(f'<option value="{escape(n)}">{escape(n)}</option>' for n in hosts)
    statuses = "".join(f'<option value="{o}">{o}</option>' for o in OUTCOMES)
    controls = ""
    if with_controls:
        controls = f"""
<h2>Controls</h2>
<div class="scroll"><table id="controls" class="sortable">
<thead><tr>
<th>host</th><th>outcome</th><th>concern</th><th>control</th><th>found / why skipped</th><th>protects against</th>
</tr></thead>
<tbody>
{chr(10).join(control_rows)}
</tbody>
</table></div>"""
    else:
        controls = (
            '<p class="note">No controls on this page: the compliance suite writes them '
            "(<code>pytest tests/compliance --inventory INVENTORY --fleet-page PATH</code>).</p>"
        )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy"
  content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<header>
<h1>{escape(title)}</h1>
<p class="meta">written {escape(generated)}{f" by {escape(source)}" if source else ""} · {" · ".join(summary)}</p>
{problems}
</header>
<div id="filter">
<label>outcome <select id="f-status"><option value="">any</option>{statuses}</select></label>
<label>host <select id="f-host"><option value="">every host</option>{options}</select></label>
<label>text <input id="f-text" type="search" placeholder="control, reason, version…"></label>
<span id="shown"></span>
</div>
{_changes_section(changed)}
<h2>Versions</h2>
<p class="note"><span class="differs">marked</span>: differs from what most hosts have (hover for theirs).</p>
<div class="scroll"><table id="versions" class="sortable">
<thead><tr>{"".join(f"<th>{escape(h)}</th>" for h in heads)}</tr></thead>
<tbody>
{chr(10).join(version_rows)}
</tbody>
</table></div>
{_firmware_section(hosts)}
{controls}
<script>{SCRIPT}</script>
</body>
</html>
"""


def write(path: str | Path, page: str) -> None:
    """The page written whole: to a temporary file beside it, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)


STYLE = """
:root { --fail: #b3261e; --fail-bg: #fde7e5; --skip: #7a5d00; --skip-bg: #fff4cc; --pass: #1e6b34;
        --pass-bg: #e3f4e7; --line: #d9dce1; --muted: #5f6670; --diff-bg: #ffe9c7; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 24px 40px; color: #1d2127; }
h1 { font-size: 22px; margin: 20px 0 4px; } h2 { font-size: 17px; margin: 26px 0 8px; }
.meta, .note { color: var(--muted); margin: 4px 0; }
.alert { background: var(--fail-bg); color: var(--fail); border-left: 4px solid var(--fail);
         padding: 8px 12px; margin: 10px 0; }
.alert a { color: var(--fail); font-weight: 600; }
#filter { position: sticky; top: 0; background: #fff; padding: 10px 0; border-bottom: 1px solid var(--line);
          z-index: 1; }
#filter label { margin-right: 16px; color: var(--muted); }
select, input { font: inherit; padding: 3px 6px; }
#shown { color: var(--muted); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: 5px 8px; border-bottom: 1px solid var(--line); }
th { background: #f3f4f6; cursor: pointer; user-select: none; white-space: nowrap; position: relative; }
th.asc::after { content: " ▲"; } th.desc::after { content: " ▼"; }
.scroll { overflow-x: auto; }
td.host { font-weight: 600; white-space: nowrap; }
#versions td { white-space: nowrap; font-variant-numeric: tabular-nums; font-size: 13px; }
td.differs, span.differs { background: var(--diff-bg); font-weight: 600; }
td.differs::after { content: " ≠"; color: var(--skip); }
td.when { color: var(--muted); font-size: 12px; }
td.error { color: var(--fail); white-space: normal !important; }
.n.failed { color: var(--fail); font-weight: 600; } .n.skipped { color: var(--skip); } .n.passed { color: var(--pass); }
td.badge { font-weight: 600; text-transform: uppercase; font-size: 11px; letter-spacing: .04em; white-space: nowrap; }
td.badge.failed { color: var(--fail); background: var(--fail-bg); }
td.badge.skipped { color: var(--skip); background: var(--skip-bg); }
td.badge.passed { color: var(--pass); background: var(--pass-bg); }
td.badge.waived, .n.waived { color: var(--muted); } td.badge.waived { background: #eceef1; }
td.change { font-weight: 600; white-space: nowrap; } td.change.newly { color: var(--fail); }
td.change.fixed { color: var(--pass); }
tr[data-status="failed"] td.reason { color: var(--fail); font-weight: 600; }
td.control { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12.5px; }
td.protects, td.reason { max-width: 46ch; overflow-wrap: anywhere; }
td.control { overflow-wrap: anywhere; max-width: 40ch; }
td.protects { color: var(--muted); }
tr[hidden] { display: none; }
"""

# Sorting and filtering, in the page itself. The filter is read from and written to the
# address's fragment (#status=failed&host=NAME&q=TEXT).
SCRIPT = """
(function () {
  var status = document.getElementById('f-status'), hostSel = document.getElementById('f-host'),
      text = document.getElementById('f-text'), shown = document.getElementById('shown');
  function fromHash() {
    var p = new URLSearchParams(location.hash.slice(1));
    status.value = p.get('status') || ''; hostSel.value = p.get('host') || ''; text.value = p.get('q') || '';
    if (hostSel.value !== (p.get('host') || '')) { hostSel.value = ''; }
  }
  function apply(write) {
    var s = status.value, h = hostSel.value, q = text.value.trim().toLowerCase(), n = 0, all = 0;
    document.querySelectorAll('#controls tbody tr').forEach(function (tr) {
      var ok = (!s || tr.dataset.status === s) && (!h || tr.dataset.host === h) &&
               (!q || tr.textContent.toLowerCase().indexOf(q) >= 0);
      tr.hidden = !ok; all++; if (ok) { n++; }
    });
    document.querySelectorAll('#versions tbody tr').forEach(function (tr) {
      var ok = (!h || tr.dataset.host === h) && (!s || s !== 'failed' || tr.dataset.status === 'failed') &&
               (!q || tr.textContent.toLowerCase().indexOf(q) >= 0 ||
                Array.prototype.some.call(document.querySelectorAll('#controls tbody tr'), function (c) {
                  return !c.hidden && c.dataset.host === tr.dataset.host; }));
      tr.hidden = !ok;
    });
    shown.textContent = all ? n + ' of ' + all + ' controls shown' : '';
    if (write) {
      var p = new URLSearchParams();
      if (s) { p.set('status', s); } if (h) { p.set('host', h); } if (q) { p.set('q', text.value.trim()); }
      history.replaceState(null, '', p.toString() ? '#' + p.toString() : location.pathname + location.search);
    }
  }
  function sortBy(th) {
    var table = th.closest('table'), body = table.tBodies[0],
        i = Array.prototype.indexOf.call(th.parentNode.children, th);
    var dir = th.classList.contains('asc') ? -1 : 1;
    th.parentNode.querySelectorAll('th').forEach(function (x) { x.classList.remove('asc', 'desc'); });
    th.classList.add(dir > 0 ? 'asc' : 'desc');
    var key = function (tr) {
      var td = tr.children[i]; return td.dataset.sort !== undefined ? td.dataset.sort : td.textContent;
    };
    Array.prototype.slice.call(body.rows).sort(function (a, b) {
      return dir * key(a).localeCompare(key(b), undefined, {numeric: true});
    }).forEach(function (tr) { body.appendChild(tr); });
  }
  document.querySelectorAll('table.sortable th').forEach(function (th) {
    th.addEventListener('click', function () { sortBy(th); });
  });
  [status, hostSel].forEach(function (el) { el.addEventListener('change', function () { apply(true); }); });
  text.addEventListener('input', function () { apply(true); });
  window.addEventListener('hashchange', function () { fromHash(); apply(false); });
  fromHash(); apply(false);
  document.body.dataset.ready = 'yes';
})();
"""
