"""
A read-only run against several hosts: their controls in shares, one run here and each other
in a fork of this process, on the controller's other cores.

A read-only control costs pytest about 0.6 ms (its fixtures, its three reports, the control
itself), so eight hosts' 880 controls kept one core busy for half a second, where the hosts had
long answered. xdist's workers cost more than they save here: each imports the suite and
collects every control again (eight hosts on two cores: 2.5 s with two workers, 1.5 s without).
A fork starts from this process as it is once the controls are collected and the hosts' reading
is in: the suite imported, the inventory read, every answer seeded. Each fork runs its hosts'
controls in their order, through pytest's own protocol (fixtures, hooks, time limits, waivers),
and sends each report to this process, which reports them, between its own controls, as if it
had run them (the terminal, the per-host table, --results, --junitxml, --fleet-page): what a
host's controls find is the same either way, their warnings included.

Only where nothing can differ: --inventory, no control that acts (nothing waits on a host,
nothing is shared between hosts), more than one host and more than one core, no xdist, no
--pdb, --exitfirst or --maxfail, no other thread running. ``--forks N`` sets how many processes
run the controls (default: one per core, at most one per host; 0 or 1: this one alone).
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import threading
import time
import traceback
import warnings

from _pytest.runner import TestReport

# A fork's events, each a frame: its length, then the pickled (event, item's index, data). Pickle
# keeps the reports' tuples (a skip's reason), which JSON would turn into lists; both ends are
# this process.
_LENGTH = struct.Struct("!I")


def wanted(session, hosts_of) -> int:
    """How many forks ``session`` runs its controls in (0: none, the controls run here).
    ``hosts_of(item)``: the inventory name an item checks, or None."""
    config = session.config
    given = config.getoption("--forks")
    if given == 0 or getattr(config, "sparkrig_targets", "") != "inventory" or not hasattr(os, "fork"):
        return 0
    if hasattr(config, "workerinput") or getattr(config.option, "numprocesses", 0):
        return 0  # xdist runs them
    option = config.option
    if option.usepdb or option.maxfail or option.collectonly or session.testsfailed:
        return 0
    if any(getattr(option, name, False) for name in ("trace", "setuponly", "setupplan")):
        return 0  # each stops or prints at every control, here
    if any(item.get_closest_marker("action") for item in session.items):
        return 0
    if threading.active_count() > 1:
        return 0  # a fork copies this thread alone: a lock another one held would stay held
    hosts = {hosts_of(item) for item in session.items}
    if None in hosts or len(hosts) < 2:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(len(hosts), given if given is not None else cores)


def shares(items, hosts_of, count: int) -> list[list[int]]:
    """The items' indexes in ``count`` shares, a host's controls all in one (its module fixtures
    set up once), the shares about even in controls; each share in the items' order."""
    by_host: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_host.setdefault(hosts_of(item), []).append(index)
    out: list[list[int]] = [[] for _ in range(count)]
    for indexes in sorted(by_host.values(), key=len, reverse=True):
        min(out, key=len).extend(indexes)
    return [sorted(share) for share in out if share]


def run(session, count: int, hosts_of) -> bool:
    """Run ``session``'s controls in this process and ``count`` - 1 forks (pytest_runtestloop's
    answer). This process runs the first share and, between its controls, reports what the
    forks sent: no core waits on a process that only relays."""
    items = session.items
    mine, *theirs = shares(items, hosts_of, count)
    relay = Relay(session)
    try:
        for share in theirs:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the fork: it reports through the pipe and exits
                os.close(read)
                _child(session, [items[i] for i in share], write)
            os.close(write)
            relay.add(read, pid, share)
        for position, index in enumerate(mine):
            nextitem = items[mine[position + 1]] if position + 1 < len(mine) else None
            session.config.hook.pytest_runtest_protocol(item=items[index], nextitem=nextitem)
            if session.shouldfail or session.shouldstop:
                raise session.Interrupted(session.shouldfail or session.shouldstop)
            relay.poll(0)
        while relay.children:
            relay.poll(None)
    except BaseException:
        relay.kill()
        raise
    return True


def _child(session, mine, out: int) -> None:
    """In the fork: ``mine`` through pytest's protocol, every event sent up ``out``; nothing
    printed (the terminal is this process's parent's)."""
    status = 0
    try:
        config = session.config
        pluginmanager = config.pluginmanager
        for name in ("terminalreporter", "junitxml"):
            plugin = pluginmanager.get_plugin(name)
            if plugin is not None:
                pluginmanager.unregister(plugin)
        index = {item.nodeid: i for i, item in enumerate(session.items)}
        pipe = os.fdopen(out, "wb", buffering=1 << 16)

        def send(*event) -> None:
            blob = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
            pipe.write(_LENGTH.pack(len(blob)) + blob)

        class Sender:
            def pytest_warning_recorded(self, warning_message, when, nodeid, location):
                # A control's warning ("a warning, not a failure"); those of the collection and
                # the configuration, replayed to this plugin as it registers, the parent has.
                if nodeid in index:
                    send("warning", index[nodeid], _portable(warning_message), location)

            def pytest_runtest_logstart(self, nodeid, location):
                send("start", index[nodeid])

            def pytest_runtest_logreport(self, report):
                data = config.hook.pytest_report_to_serializable(config=config, report=report)
                send("report", index[report.nodeid], data)

            def pytest_runtest_logfinish(self, nodeid, location):
                send("finish", index[nodeid])
                pipe.flush()

        pluginmanager.register(Sender(), "sparkrig-fork-sender")
        for i, item in enumerate(mine):
            nextitem = mine[i + 1] if i + 1 < len(mine) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        pipe.flush()
    except BaseException:  # noqa: BLE001 - whatever it was, the parent names the controls left
        traceback.print_exc()
        status = 1
    os._exit(status)


class Relay:
    """What the forks send, reported here as each of their controls ends; a control a fork
    left unreported (it died) fails, naming why."""

    def __init__(self, session):
        self.session, self.pick = session, selectors.DefaultSelector()
        self.children: dict[int, tuple[int, list[int]]] = {}  # pipe -> (pid, its share)
        self.buffers: dict[int, bytes] = {}
        self.done: set[int] = set()

    def add(self, fd: int, pid: int, share: list[int]) -> None:
        self.children[fd], self.buffers[fd] = (pid, share), b""
        self.pick.register(fd, selectors.EVENT_READ)

    def poll(self, timeout: float | None) -> None:
        """Report what has come (``timeout``: 0 to take only what is there, None to wait)."""
        config, items, hook = self.session.config, self.session.items, self.session.config.hook
        for key, _ in self.pick.select(timeout) if self.children else []:
            fd = key.fd
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._reap(fd)
                continue
            self.buffers[fd] += chunk
            for event, index, *data in _frames(self.buffers, fd):
                item = items[index]
                if event == "start":
                    hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
                elif event == "report":
                    report = hook.pytest_report_from_serializable(config=config, data=data[0])
                    hook.pytest_runtest_logreport(report=report)
                elif event == "warning":
                    hook.pytest_warning_recorded.call_historic(
                        kwargs={
                            "warning_message": data[0],
                            "when": "runtest",
                            "nodeid": item.nodeid,
                            "location": data[1],
                        }
                    )
                else:
                    hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
                    self.done.add(index)

    def _reap(self, fd: int) -> None:
        self.pick.unregister(fd)
        os.close(fd)
        del self.buffers[fd]
        pid, share = self.children.pop(fd)
        _pid, status = os.waitpid(pid, 0)
        left = [i for i in share if i not in self.done]
        if not left:
            return
        why = (
            f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exited {os.WEXITSTATUS(status)}"
        )
        hook, now = self.session.config.hook, time.time()
        for index in left:
            item = self.session.items[index]
            message = f"the fork running this host's controls ended before this one was reported ({why})"
            report = TestReport(item.nodeid, item.location, {}, "failed", message, "call", start=now, stop=now)
            hook.pytest_runtest_logreport(report=report)

    def kill(self) -> None:
        for pid, _share in self.children.values():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.children.clear()


def _portable(found: warnings.WarningMessage) -> warnings.WarningMessage:
    """A warning as the parent can take it: its message, category and place (a warning that
    does not pickle, as a UserWarning saying the same)."""
    message = found.message
    try:
        pickle.dumps(message)
    except Exception:  # noqa: BLE001 - any warning at all
        message = UserWarning(str(message))
    return warnings.WarningMessage(message, type(message), found.filename, found.lineno, None, found.line, None)


def _frames(buffers: dict[int, bytes], fd: int):
    """The whole frames in ``buffers[fd]``, taken off it."""
    buffer, start = buffers[fd], 0
    while len(buffer) - start >= _LENGTH.size:
        (length,) = _LENGTH.unpack_from(buffer, start)
        if len(buffer) - start - _LENGTH.size < length:
            break
        yield pickle.loads(buffer[start + _LENGTH.size : start + _LENGTH.size + length])  # noqa: S301 - our fork's
        start += _LENGTH.size + length
    buffers[fd] = buffer[start:]
