"""pytest plugin: count the commands testinfra runs on each host (``-p benchmarks.count_commands``).

Written for the benchmarks: with ``SPARKRIG_BENCH_COUNTS=FILE`` set, the counts are
written to FILE as JSON (host name: commands) when the session ends. The suite
itself is unchanged.
"""

from __future__ import annotations

import json
import os
from collections import Counter

from testinfra.backend.local import LocalBackend
from testinfra.backend.ssh import SshBackend

COUNTS: Counter[str] = Counter()


def _counting(cls):
    run = cls.run

    def counted(self, command, *args, **kwargs):
        COUNTS[self.get_hostname()] += 1
        return run(self, command, *args, **kwargs)

    cls.run = counted


_counting(SshBackend)
_counting(LocalBackend)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("SPARKRIG_BENCH_COUNTS")
    if path:
        with open(path, "w") as stream:
            json.dump(dict(COUNTS), stream)
