"""One boundary for host strings (sparkrig/host_output.py): every string a fact's parser
returns is checked where it is parsed, a string that is only shown is escaped there. The real
parsers on recorded output holding NUL, ESC, C1 controls, bytes that are not UTF-8 and
overlong strings; the fwupd document is lab/fwupd.py's STAND-IN (HOSTILE_DEVICES), the one the
lab's stand-in fwupd prints."""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import pkgutil
import re

import pytest
from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

import sparkrig
from lab import fwupd as stand_in
from sparkrig import host_output, reading
from sparkrig import parts as sparkrig_parts
from sparkrig.operations import gpu_policy, updates
from sparkrig.operations.gpu_policy.facts import GpuState
from sparkrig.operations.updates.deploy import firmware_part
from sparkrig.operations.updates.facts import Firmware, Versions
from sparkrig.tools.rollout_reboot import firmware_reasons
from tests.unit.operations.test_gpu_policy import REAL_H100_LINE, fact_output
from tests.unit.operations.test_updates import SPARK

# What no string that reaches a terminal, a JSON document, a page or an argument may hold.
UNCLEAN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _fwupd_line(document: str | bytes, what: str = "get-devices") -> str:
    raw = document if isinstance(document, bytes) else document.encode()
    return f"fwupd {what} 0 45 {base64.b64encode(raw).decode()}"


# The helper ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["1.0\x00", "1.0\x1b[31m", "1.0\x9b31m", "1.0\x85", "1.0\r", "1.0\n", "1.0\u2028", "1.0\udcff", "1" * 4097],
)
def test_a_host_string_with_a_control_character_a_byte_not_utf8_or_overlong_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=r"^Versions\['kernel'\] "):
        host_output.checked({"kernel": bad}, "Versions")
    assert not UNCLEAN.search(host_output.printable(bad))


def test_printable_escapes_every_character_as_its_slow_path_does():
    """printable's fast path (text with nothing to escape returned as it is) answers as the
    escaping of each character does, for every character of the first planes' start, the
    surrogates that stand for bytes that are not UTF-8, and text that mixes them."""
    every = [chr(c) for c in range(0x3100)] + [chr(c) for c in range(0xDC80, 0xDD00)] + ["\ufeff", "\U000e0001"]
    for text in [*every, "NVIDIA GB10 \u00a0ok", "plain text, nothing to escape", "a\x1bb\u200bc\udcffd"]:
        assert host_output.printable(text) == "".join(host_output._escaped(ch) for ch in text), repr(text)


def test_a_tab_and_any_printable_text_pass_and_content_keeps_its_newlines():
    assert host_output.checked({"name": "NVIDIA GB10\tà ✓"}, "F") == {"name": "NVIDIA GB10\tà ✓"}
    body = host_output.Content('{\r\n  "a": 1\n}\n' * 2000)
    assert host_output.checked([body], "F") == [body]
    with pytest.raises(ValueError, match=r"F\[0\] holds a control character"):
        host_output.checked([host_output.Content("a\n\x1b[2J")], "F")


def test_every_fact_of_sparkrigs_parses_through_the_one_boundary():
    """Each FactBase of the package (sparkrig.operations' concerns, the shared layer) has its
    ``process`` wrapped by host_output.parses: a new fact that is not goes red here."""
    found = []
    for module in pkgutil.walk_packages(sparkrig.__path__, "sparkrig."):
        if module.name.startswith(("sparkrig.tools.", "sparkrig.templates")):
            continue
        try:
            loaded = importlib.import_module(module.name)
        except ImportError:
            continue
        for _, cls in inspect.getmembers(loaded, inspect.isclass):
            if issubclass(cls, FactBase) and cls is not FactBase and cls.__module__ == module.name:
                found.append(cls)
    assert {cls.__name__ for cls in found} >= {"Firmware", "Versions", "BootId", "GpuState", "HostState"}
    unwrapped = [
        f"{cls.__module__}.{cls.__name__}"
        for cls in found
        if cls is not reading.Reading and not getattr(cls.process, "sparkrig_checked", False)
    ]
    assert unwrapped == []


# fwupd: names escaped, versions refused --------------------------------------------------


def test_fwupd_names_with_nul_esc_and_c1_are_escaped_where_parsed():
    """lab/fwupd.py's STAND-IN document through the real Firmware parser: every string clean,
    the names still recognisable, the reboot reason (what the rollout drains with) clean."""
    found = Firmware().process([_fwupd_line(stand_in.HOSTILE_DEVICES)])
    assert [d["name"] for d in found["devices"]] == [
        "System\\x00Firmware",
        "NIC \\x1b]0;pwned\\x07\\x1b[31mred\\x0d\\x0a  lab-deb13: forged",
    ]
    assert found["devices"][0]["vendor"] == "NVIDIA\\x9b31m"
    assert found["reboot"] == "fwupd: firmware awaits a reboot: System\\x00Firmware (needs-reboot)"
    assert not [s for s in _strings(found) if UNCLEAN.search(s)]
    reasons = firmware_reasons(found)
    assert reasons and not UNCLEAN.search(" ".join(reasons))
    # What the drain's argument becomes: no NUL for subprocess to refuse for the whole run.
    assert "\x00" not in f"rollout: reboot ({'; '.join(reasons)})"


@pytest.mark.parametrize("version", ["2.91\u0000", "2.91\u001b[8m", "2.91\u0085", "9" * 300])
def test_a_fwupd_version_that_is_not_clean_fails_that_host_naming_the_field(version):
    document = json.loads(stand_in.HOSTILE_DEVICES)
    document["Devices"][0]["Version"] = version
    with pytest.raises(FactProcessError, match=r"(?i)Firmware: cannot read the host.s output \(ValueError: .*version"):
        Firmware().process([_fwupd_line(json.dumps(document))])


def test_a_fwupd_document_that_is_not_utf8_reads_clean():
    raw = stand_in.HOSTILE_DEVICES.encode().replace(b"Mellanox \\ufffd", b"Mellanox \xff\xfe")
    found = Firmware().process([_fwupd_line(raw)])
    assert not [s for s in _strings(found) if UNCLEAN.search(s)]


# The other facts' strings: refused, naming the field -------------------------------------


@pytest.mark.parametrize(
    "line, field",
    [
        ('os PRETTY_NAME="Ubuntu \x1b]0;owned\x07"', "PRETTY_NAME"),
        ("boot 6.17.0-1008-nvidia\x1b[2J", "boot_kernels"),
        ("pkg kernel ii  linux-image-6.17.0-1008-nvidia 6.17.0\x9b8m", "linux-image-6.17.0-1008-nvidia"),
        ("held nvidia-driver\x00", "held"),
        ("boot " + "6" * 5000, "boot_kernels"),
    ],
)
def test_a_versions_string_with_a_control_character_fails_that_host_naming_it(line, field):
    with pytest.raises(FactProcessError, match=rf"Versions: cannot read .*Versions\[.*{re.escape(field)}"):
        Versions().process([*SPARK, line])


def test_a_clean_versions_reading_passes_as_before():
    assert Versions().process(SPARK)["kernel"] == "6.17.0-1007-nvidia"


def test_a_gpu_name_with_an_escape_sequence_fails_that_host_and_nvidia_smis_own_words_are_escaped():
    hostile = REAL_H100_LINE.replace("NVIDIA H100 80GB HBM3", "NVIDIA \x1b]0;owned\x07H100", 1)
    assert hostile != REAL_H100_LINE
    with pytest.raises(FactProcessError, match=r"GpuState\['gpus'\]\[0\]\['name'\] holds a control character"):
        GpuState().process(fact_output(hostile))
    failed = GpuState().process(fact_output("NVIDIA-SMI has failed \x1b[2J\x9b", status=9))
    assert failed["problem"].endswith("NVIDIA-SMI has failed \\x1b[2J\\x9b")


def test_the_one_reading_fails_the_host_naming_the_fact_and_its_field():
    """The deploy's reading of the updates concern: a part whose output holds an ESC fails the
    reading (the host), its reason naming the fact and field, escaped."""
    settings = {**updates.settings.DEFAULTS}
    part = firmware_part(settings)
    parts = [part, gpu_policy.deploy.GPU]
    document = json.loads(stand_in.HOSTILE_DEVICES)
    document["Devices"][1]["Version"] = "28\x1b[8m"

    output = sparkrig_parts.printed(
        [
            sparkrig_parts.Answer(0, (_fwupd_line(json.dumps(document)) + "\n").encode(), b""),
            sparkrig_parts.Answer(0, ("\n".join(fact_output()) + "\n").encode(), b""),
        ]
    )
    with pytest.raises(FactProcessError) as raised:
        reading.reading_of(parts)().process(output)
    message = str(raised.value)
    assert "Firmware['devices'][1]['version'] holds a control character" in message, message
    assert not UNCLEAN.search(message), message
