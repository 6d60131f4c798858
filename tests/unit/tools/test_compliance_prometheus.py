"""The scrape control's verdict does not hang on one failed scrape, and its failure names the
host that is not up and why: the host-side read (the control's own script, run here against a
stand-in of Prometheus' targets API) waits, bounded, for a target that is down to be scraped
successfully, and answers at once when every target is up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.compliance import test_prometheus

JOB = test_prometheus.JOB


def target(name, health="up", last="2026-11-28T10:00:00.1Z", error=""):
    return {
        "labels": {"instance": name, "job": JOB},
        "scrapeUrl": f"http://{name}:9100/metrics",
        "health": health,
        "lastScrape": last,
        "lastError": error,
    }


class StandIn:
    """Prometheus' /api/v1/targets (``answers(seconds since start)`` says what it lists) and
    its /metrics (``metrics``; None: an error 500)."""

    def __init__(self, answers, metrics: str | None = "prometheus_config_last_reload_successful 1\n"):
        self.asked, self.started = 0, time.monotonic()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path == "/metrics":
                    if metrics is None:
                        self.send_error(500)
                        return
                    body = metrics.encode()
                else:
                    assert self.path == "/api/v1/targets?state=active"
                    stand_in.asked += 1
                    body = json.dumps(
                        {"status": "success", "data": {"activeTargets": answers(time.monotonic() - stand_in.started)}}
                    ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, limit: int, expected: int = 0):
        """The control's read (test_prometheus.API), run here against the stand-in; ``expected``:
        how many hosts the inventory serves."""
        said = subprocess.run(
            [sys.executable, "-I", "-c", test_prometheus.API, self.url, JOB, str(limit), str(expected)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return type("Answer", (), {"check": lambda _self: said.stdout})()

    def read(self, limit: int, expected: int = 0) -> list[dict]:
        return test_prometheus.api_answer(self.answer(limit, expected), "targets")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1)) + ".5Z"


def test_every_target_up_is_answered_at_once():
    other = {**target("x"), "labels": {"instance": "x", "job": "other"}}
    stand_in = StandIn(lambda _t: [target("a"), target("b"), other])
    started = time.monotonic()
    found = stand_in.read(30)
    assert time.monotonic() - started < 5 and stand_in.asked == 1
    assert [t["labels"]["instance"] for t in found] == ["a", "b"]  # the job's alone
    assert test_prometheus.scrape_problems(found, ["a", "b"]) == []


def test_a_target_down_is_read_again_after_its_next_scrape():
    """One failed scrape (a node exporter restarted by the converge) is not the verdict."""
    stand_in = StandIn(
        lambda t: [target("a"), target("b", "down", error="connection refused") if t < 1.5 else target("b", last=now())]
    )
    found = stand_in.read(30)
    assert stand_in.asked >= 2
    assert test_prometheus.scrape_problems(found, ["a", "b"]) == []


def test_a_prometheus_that_lists_no_target_yet_is_read_again_until_it_lists_them():
    """Seconds after the converge started Prometheus, before its first discovery, it lists no
    target (seen in the lab on 2026-11-29): not yet a host unscraped."""
    stand_in = StandIn(lambda t: [] if t < 1.5 else [target("a"), target("b")])
    found = stand_in.read(30, 2)
    assert stand_in.asked >= 2
    assert test_prometheus.scrape_problems(found, ["a", "b"]) == []


def test_a_prometheus_that_never_lists_a_target_fails_every_host_when_the_wait_ends():
    stand_in = StandIn(lambda _t: [])
    started = time.monotonic()
    found = stand_in.read(2, 2)
    assert 2 <= time.monotonic() - started < 6 and stand_in.asked >= 2
    assert test_prometheus.scrape_problems(found, ["a", "c"]) == [
        "a is not scraped (no target: converge the Prometheus host again)",
        "c is not scraped (no target: converge the Prometheus host again)",
    ]


def test_a_host_missing_from_a_job_that_lists_others_fails_at_once():
    """Its configuration lacks the host (converged before the host joined the inventory):
    waiting would change nothing."""
    stand_in = StandIn(lambda _t: [target("a")])
    started = time.monotonic()
    found = stand_in.read(30, 2)
    assert time.monotonic() - started < 5 and stand_in.asked == 1
    assert test_prometheus.scrape_problems(found, ["a", "c"]) == [
        "c is not scraped (no target: converge the Prometheus host again)"
    ]


def test_a_job_with_no_host_to_scrape_is_answered_at_once():
    stand_in = StandIn(lambda _t: [])
    started = time.monotonic()
    assert stand_in.read(30, 0) == []
    assert time.monotonic() - started < 5 and stand_in.asked == 1


def test_the_hosts_expected_are_the_inventory_s_that_serve_metrics():
    inventory = {"a": {}, "b": {"metrics_enabled": False}, "c": {"metrics_enabled": True}}
    assert test_prometheus.serving(inventory) == ["a", "c"]
    assert test_prometheus.serving(None) == []


def test_a_host_still_down_when_the_wait_ends_fails_naming_it_and_why():
    stand_in = StandIn(lambda t: [target("a"), target("b", "down", last=now(), error="context deadline exceeded")])
    started = time.monotonic()
    found = stand_in.read(3)
    assert 3 <= time.monotonic() - started < 8 and stand_in.asked >= 3
    problems = test_prometheus.scrape_problems(found, ["a", "b", "c"])
    assert problems[0].startswith("b is down (http://b:9100/metrics, last scrape 20")
    assert "context deadline exceeded; check b's node exporter and firewall" in problems[0]
    assert problems[1].startswith("c is not scraped")


def test_the_wait_is_bounded():
    stand_in = StandIn(lambda _t: [target("b", "down", last="2026-11-28T10:00:00Z", error="no route to host")])
    started = time.monotonic()
    found = stand_in.read(2)
    assert 2 <= time.monotonic() - started < 6
    assert test_prometheus.scrape_problems(found, ["b"])[0].startswith("b is down")


@pytest.mark.parametrize(("interval", "wait"), [(2, 30), (15, 40), (60, 60)])
def test_the_wait_is_several_intervals_at_least_half_a_minute_at_most_a_minute(interval, wait):
    assert test_prometheus.fresh_scrape_wait_s({"prometheus_scrape_interval_s": interval}) == wait


def test_one_read_answers_the_targets_and_the_metrics_each_failing_on_its_own():
    both = StandIn(lambda _t: [target("a")]).answer(30)
    assert [t["labels"]["instance"] for t in test_prometheus.api_answer(both, "targets")] == ["a"]
    assert "prometheus_config_last_reload_successful 1" in test_prometheus.api_answer(both, "metrics")
    no_metrics = StandIn(lambda _t: [target("a")], metrics=None).answer(30)
    assert test_prometheus.api_answer(no_metrics, "targets")[0]["labels"]["instance"] == "a"
    with pytest.raises(AssertionError, match="did not answer its metrics: HTTPError"):
        test_prometheus.api_answer(no_metrics, "metrics")
    with pytest.raises(AssertionError, match="did not answer its targets: URLError"):
        test_prometheus.api_answer(_nowhere().answer(30), "targets")


def _nowhere():
    """A stand-in's address where nothing listens."""
    stand_in = StandIn(lambda _t: [])
    stand_in.server.shutdown()
    stand_in.server.server_close()
    return stand_in


def test_the_control_s_message_names_the_server_and_each_host(monkeypatch):
    answer = type(
        "A", (), {"check": lambda self: json.dumps({"targets": [target("a"), target("b", "down", error="refused")]})}
    )()
    with pytest.raises(AssertionError) as error:
        test_prometheus.test_every_host_of_the_inventory_is_scraped_and_up(
            lambda need: {"api": answer},
            {"prometheus_server": "a"},
            None,
            {"a": {}, "b": {}, "off": {"metrics_enabled": False}},
        )
    line = str(error.value).splitlines()[0]
    assert line.startswith("a's Prometheus: b is down (http://b:9100/metrics") and "refused" in line


def test_what_a_target_answered_cannot_add_lines_to_the_message():
    """A host's node exporter chooses what Prometheus quotes in lastError: one line, bounded."""
    forged = "refused\n  lab-deb13: test_x.py::test_y: passed" + "x" * 500
    (problem,) = test_prometheus.scrape_problems([target("b", "down", error=forged)], ["b"])
    assert "\n" not in problem and len(problem) < 400
    assert "refused lab-deb13: test_x.py::test_y: passed" in problem
