"""Updates: the kernel's command line as the host has it (what booted, what sparkrig's GRUB
drop-in asks, whether a boot loader applies it), and what that means for a reboot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig import host_output, rendering

from .settings import GRUB_DROP_IN

_CMDLINE = rendering.script("updates/cmdline.sh")


def _no_control(line: str, what: str) -> str:
    # A local check until the shared helper for host strings lands: a host's bytes that would
    # drive a terminal or forge a line fail that host.
    if any(ord(c) < 32 or ord(c) == 127 for c in line):
        raise ValueError(f"a control character in {what}: {line[:120]!r}")
    return line


class KernelCmdline(FactBase):
    """
    Returns the kernel's command line: what it booted with (/proc/cmdline), what sparkrig's
    GRUB drop-in asks (its ``add`` and ``remove`` lines), whether a boot loader applies it
    (update-grub present: DGX OS; a lab container has none), and the parameters of the first
    kernel line of the generated /boot/grub/grub.cfg (None: no such file). **The rollout reads
    it** (tools/rollout_reboot.py): a change asked but not booted with is a reboot reason.

    .. code:: python

        {"running": ["BOOT_IMAGE=/vmlinuz-...", "ro", "quiet"], "add": ["kho=off"], "remove": [],
         "loader": True, "generated": ["ro", "quiet", "kho=off"]}
    """

    def command(self, drop_in: str = GRUB_DROP_IN) -> StringCommand:
        return StringCommand("sh -c", QuoteString(_CMDLINE), "sparkrig-cmdline", QuoteString(drop_in))

    @host_output.parses
    def process(self, output: list[str]) -> dict:
        found = self.default()
        for line in output:
            kind, _, rest = _no_control(line, "the kernel's command line").partition(" ")
            if kind == "running":
                found["running"] = rest.split()
            elif kind in ("add", "remove"):
                found[kind].append(rest)
            elif kind == "loader" and rest in ("update-grub", "none"):
                found["loader"] = rest == "update-grub"
            elif kind == "generated":
                found["generated"] = rest.split()
            else:
                raise ValueError(f"unexpected line {line[:120]!r}")
        return found

    @staticmethod
    def default() -> dict:
        return {"running": [], "add": [], "remove": [], "loader": False, "generated": None}


def cmdline_missing(words: Sequence[str], add: Sequence[str], remove: Sequence[str]) -> list[str]:
    """What a command line (``words``) lacks of ``add`` and still has of ``remove``, one line each."""
    found = [f"{word} is not on it" for word in add if word not in words]
    return found + [f"{w} is on it" for w in words for name in remove if w == name or w.startswith(f"{name}=")]


def cmdline_reasons(facts: Mapping[str, Any]) -> list[str]:
    """Why the host needs a reboot for its command line: the drop-in asks what the running
    kernel did not boot with (only where a boot loader applies it)."""
    if not facts["loader"]:
        return []
    return [
        f"kernel command line: {line} (/proc/cmdline)"
        for line in cmdline_missing(facts["running"], facts["add"], facts["remove"])
    ]
