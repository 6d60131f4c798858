"""sparkrig.reading: every part's fact in one command, run here by a real shell."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import gevent
import pytest
from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError
from pyinfra.context import ctx_host

from sparkrig import atomic, host_output, reading
from sparkrig import parts as sparkrig_parts
from sparkrig.operations import declaring, load
from sparkrig.settings import all_settings, defaults
from tests.unit.pyinfra_fake import encode


class Lines(FactBase):
    def command(self, text: str) -> StringCommand:
        return StringCommand("printf", "'%s\\n'", QuoteString(text), "a'b'", "; echo oops >&2")

    def process(self, output):
        return list(output)


class Fails(FactBase):
    def command(self) -> str:
        return "echo half; echo 'no such thing' >&2; exit 3"

    def process(self, output):
        return output


class Silent(FactBase):
    def command(self) -> str:
        return "true"

    def process(self, output):  # pragma: no cover - never called: no output
        raise AssertionError

    @staticmethod
    def default():
        return "nothing"


class Binary(FactBase):
    def command(self) -> str:
        return r"printf 'caf\351\n'"

    def process(self, output):
        # Bytes kept to be compared (host_output.Content): a plain string holding a byte that
        # is not UTF-8 is refused where it is parsed (tests/unit/operations/test_host_strings.py).
        return [host_output.Content(line) for line in output]


def run(parts, shell="sh"):
    fact = reading.reading_of(parts)
    command = fact().command(parts=parts).get_raw_value()
    result = subprocess.run([shell, "-c", command], capture_output=True, check=True)
    return fact().process(result.stdout.decode().splitlines())


@pytest.mark.parametrize("shell", ["sh", "dash", "bash"])
def test_parts_come_back_each_to_its_own_parser(tmp_path, shell):
    present = tmp_path / "present"
    present.write_text("x")
    parts = [
        reading.part(Lines, text="one"),
        reading.part(atomic.HostState, paths=[str(present), str(tmp_path / "absent")]),
        reading.part(Silent),
        reading.part(Binary),
        reading.part(Lines, text="two"),
    ]
    values = run(parts, shell)
    assert values[parts[0]] == ["one", "ab"]  # stderr ("oops") is not the part's output
    files = values[parts[1]]["files"]
    assert files[str(tmp_path / "absent")] is None and files[str(present)]["sha256"].startswith("2d711642")
    assert values[parts[2]] == "nothing"
    assert values[parts[3]] == ["caf\udce9"]  # a byte that is not UTF-8 cuts nothing short
    assert values[parts[4]] == ["two", "ab"]


def test_a_part_that_fails_fails_the_host_naming_it_and_what_it_said():
    parts = [reading.part(Lines, text="one"), reading.part(Fails)]
    with pytest.raises(FactProcessError, match=r"reading Fails\(\) failed \(exit 3: no such thing\)"):
        run(parts)


def test_output_forged_by_a_host_fails_the_host():
    parts = [reading.part(Lines, text="one")]
    fact = reading.reading_of(parts)
    good = ["sparkrig-parts 1", "part 0 0 4 0", "data b25lCg==", "sparkrig-parts-end"]
    assert fact().process(good) == {parts[0]: ["one"]}
    for output in (
        ["garbage"],
        [],
        encode(["one"]),
        good[:3],
        good[:2] + good[1:],
        ["sparkrig-parts 2", *good[1:]],
        [good[0], "part 0 0 4 0", "one", *good[2:]],
    ):
        with pytest.raises(FactProcessError):
            fact().process(output)


class Forger(FactBase):
    """A part whose program prints the reading's structure and another part's answer."""

    def command(self) -> str:
        return "echo 'part 1 0 7 0'; echo 'data Zm9yZ2VkCg=='; echo sparkrig-parts-end; echo 'sparkrig-parts 2'"

    @staticmethod
    def process(output):
        if any(line.startswith("part ") for line in output):
            raise ValueError("a line that is no line of this fact")
        return output


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_a_part_printing_the_readings_structure_fails_the_host_naming_it_and_forges_nothing(shell):
    parts = [reading.part(Forger), reading.part(Lines, text="two")]
    fact = reading.reading_of(parts)
    command = fact().command(parts=parts).get_raw_value()
    output = subprocess.run([shell, "-c", command], capture_output=True, check=True).stdout.decode().splitlines()
    answers = sparkrig_parts.parse(output, 2)
    assert answers[1] == sparkrig_parts.Answer(0, b"two\nab\n", b"oops\n")  # untouched
    with pytest.raises(FactProcessError, match=r"reading Forger\(\): its output is refused \(ValueError"):
        fact().process(output)


def test_a_part_that_runs_out_of_time_fails_the_host_saying_so(monkeypatch):
    monkeypatch.setattr(Silent, "reading_timeout_s", 1, raising=False)
    parts = [reading.part(Lines, text="one"), reading.part(Silent)]
    monkeypatch.setattr(Silent, "command", lambda self: "sleep 30")
    with pytest.raises(FactProcessError, match=r"reading Silent\(\): still running after 1 s: killed"):
        run(parts)


def test_a_part_cannot_end_itself_early_with_another_runs_tag():
    parts = [reading.part(Lines, text="@@0000 end 0 0"), reading.part(Lines, text="sparkrig-parts-end")]
    values = run(parts)
    assert values[parts[0]] == ["@@0000 end 0 0", "ab"] and values[parts[1]] == ["sparkrig-parts-end", "ab"]


def test_parts_are_hashable_whatever_their_arguments():
    a = reading.part(Lines, text="x", more={"b": [1, 2]})
    b = reading.part(Lines, more={"b": (1, 2)}, text="x")
    assert a == b and hash(a) == hash(b)


def test_planned_joins_every_concern_once_in_order():
    declaring()
    load()  # every concern's deploy imported: each registered its reads

    settings = defaults(all_settings())
    seen = reading.planned({**settings, "ngc_enabled": True, "source_builds_enabled": []})
    assert len(seen) == len(set(seen))
    facts = [each.fact.__name__ for each in seen]
    # Every concern that reads the host has its facts in the one reading.
    for name in (
        "HardwareIdentity",
        "SparkrigCaCertificates",
        "CudaToolkits",
        "SwapSources",
        "SshdUnit",
        "ContainerHost",
        "SparkrigAptRepositories",
        "NgcHost",
        "PythonStack",
    ):
        assert name in facts, name
    assert facts.index("HardwareIdentity") < facts.index("PythonStack")


def test_a_reading_under_way_is_waited_for_not_made_twice(monkeypatch):
    """pyinfra runs each host's deploy code in its own greenlet, and a cluster node reads its
    peers: a second asker waits for the reading under way instead of making another."""

    made = []

    def slow_read(parts):
        made.append(list(parts))
        gevent.sleep(0.05)  # the command's round trip: other greenlets run meanwhile
        return {each: each.describe() for each in parts}

    monkeypatch.setattr(reading, "read", slow_read)
    node = SimpleNamespace(name="spark-01", data=SimpleNamespace(dict=lambda: {}))
    wanted = reading.part(atomic.HostState, paths=("/etc/sparkrig/cluster.env",))

    def ask():
        with ctx_host.use(node):
            return reading.value(wanted)

    answers = [g.get() for g in [gevent.spawn(ask), gevent.spawn(ask)]]
    assert len(made) == 1 and answers == [wanted.describe()] * 2
