"""pytest plugin: count the commands testinfra runs on each host (``-p benchmarks.count_commands``).

Written for the benchmarks: with ``SPARKRIG_BENCH_COUNTS=FILE`` set, the counts are
written to FILE as JSON ("host (kind)": commands) when the session ends, by kind:
"prefetch" (the controller's reading of the host, one per round), "read" (what read-only
controls still sent) and "action" (what the controls marked action sent). Under
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
        # The controls' own commands, by kind: those of read-only controls apart from actions'.
        COUNTS[f"{self.get_hostname()} ({'action' if reads.acting else 'read'})"] += 1
        return run(self, command, *args, **kwargs)

    cls.run = counted


_counting(SshBackend)
_counting(LocalBackend)


def _counting_prefetch():
    """The controller's reading of each host: one command per host and round."""
    read = reads._read

    def counted(ssh_config, name, commands):
        COUNTS[f"{name} (prefetch)"] += 1
        return read(ssh_config, name, commands)

    reads._read = counted


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
