"""pytest plugin: count the commands testinfra runs on each host (``-p benchmarks.count_commands``).

Written for the benchmarks: with ``SPARKRIG_BENCH_COUNTS=FILE`` set, the counts are
written to FILE as JSON (host name: commands) when the session ends, the
controller's one reading of each host's constants included. Under
pytest-xdist each worker writes ``FILE.<worker>`` and the controller, which ends
last, sums them into FILE. The suite itself is unchanged.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from testinfra.backend.local import LocalBackend
from testinfra.backend.ssh import SshBackend

from tests.compliance import reads

COUNTS: Counter[str] = Counter()


def _counting(cls):
    run = cls.run

    def counted(self, command, *args, **kwargs):
        COUNTS[self.get_hostname()] += 1
        return run(self, command, *args, **kwargs)

    cls.run = counted


_counting(SshBackend)
_counting(LocalBackend)


def _counting_prefetch():
    """The controller's reading of each host's constants: one command per host it read."""
    prefetch = reads.prefetch

    def counted(ssh_config, names, *args, **kwargs):
        found = prefetch(ssh_config, names, *args, **kwargs)
        COUNTS.update(found.keys())
        return found

    reads.prefetch = counted


_counting_prefetch()


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("SPARKRIG_BENCH_COUNTS")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        Path(f"{path}.{worker}").write_text(json.dumps(dict(COUNTS)))
        return
    total = Counter(COUNTS)
    for part in Path(path).parent.glob(f"{Path(path).name}.gw*"):
        total.update(json.loads(part.read_text()))
        part.unlink()
    Path(path).write_text(json.dumps(dict(total)))
