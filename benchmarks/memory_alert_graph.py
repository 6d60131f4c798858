"""
The graph of docs/monitoring.md: MemAvailable of every lab host during the memory-pressure test
(tests/converge/test_prometheus_lab.py), as the lab's Prometheus recorded it, with the alert's
threshold and when SparkMemoryLow was firing.

    uv run pytest tests/converge/test_prometheus_lab.py --reuse-lab -s -k memory   # prints the window
    uv run --group graphs python -m benchmarks.memory_alert_graph --start T0 --end T1 --threshold BYTES \\
        --out docs/monitoring-memory.png

It asks the Prometheus on lab-deb12 (the lab must still be up) for ``query_range`` of
``node_memory_MemAvailable_bytes`` and of ``ALERTS{alertname="SparkMemoryLow"}``, through SSH
(Prometheus listens on that host's loopback alone), and draws them with matplotlib (the
``graphs`` dependency group). The data it drew is written beside the PNG (``.json``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path

import lab

SERVER = "lab-deb12"
API = "http://127.0.0.1:9090"
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"


def query_range(expr: str, start: float, end: float, step: float) -> list[dict]:
    url = f"{API}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": step}
    )
    found = json.loads(lab.run_ssh(SERVER, f"python3 -I -c {shlex.quote(FETCH)} {shlex.quote(url)}").stdout)
    if found["status"] != "success":
        raise SystemExit(f"Prometheus said: {found}")
    return found["data"]["result"]


def draw(data: dict, out: Path) -> None:
    import matplotlib  # noqa: PLC0415 - the graphs group alone has it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    start = data["start"]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for series in data["memory"]:
        points = [(float(t) - start, float(v) / (1 << 30)) for t, v in series["values"]]
        ax.plot(*zip(*points), label=f"{series['metric']['instance']} MemAvailable", linewidth=1.6)
    ax.axhline(data["threshold"] / (1 << 30), color="tab:red", linestyle="--", label="SparkMemoryLow threshold")
    for series in data["alerts"]:
        times = [float(t) - start for t, _ in series["values"]]
        if times:
            ax.axvspan(
                min(times),
                max(times),
                color="tab:red",
                alpha=0.12,
                label=f"SparkMemoryLow firing ({series['metric']['instance']})",
            )
    ax.set_xlabel("seconds from the start of the window")
    ax.set_ylabel("GiB")
    when = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ax.set_title(f"A spark-run job in training.slice takes 1.5 GiB: the lab's Prometheus ({when})")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.memory_alert_graph", description=__doc__.splitlines()[1]
    )
    parser.add_argument("--start", type=float, required=True, help="the window's start (epoch seconds)")
    parser.add_argument("--end", type=float, required=True, help="the window's end (epoch seconds)")
    parser.add_argument("--threshold", type=int, required=True, help="the alert's threshold the test set (bytes)")
    parser.add_argument("--step", type=float, default=1.0, help="seconds between points")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    data = {
        "start": args.start,
        "end": args.end,
        "threshold": args.threshold,
        "memory": query_range('node_memory_MemAvailable_bytes{job="sparkrig"}', args.start, args.end, args.step),
        "alerts": query_range(
            'ALERTS{alertname="SparkMemoryLow",alertstate="firing"}', args.start, args.end, args.step
        ),
    }
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    draw(data, args.out)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
