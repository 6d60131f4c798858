"""Memory watchdog (earlyoom): the settings, declared once, and their checks."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

from sparkrig.settings import Setting, boolean, declare, defaults, int_range

# One word of earlyoom's command line: no whitespace, quotes or backslashes (systemd
# splits $EARLYOOM_ARGS at whitespace and removes quotes), and '$' only where sh leaves
# it alone inside double quotes (end of the regex or of an alternative).
_REGEX_WORD = re.compile(r"[A-Za-z0-9_.:^$|()*+?\[\]{},/-]+")


_DOLLAR_FOLLOWED = re.compile(r"\$[^|)]")


def regex_check(value: Any, _data: Mapping[str, Any]) -> str | None:
    allowed = (
        "a POSIX extended regex over letters, digits and _.:^$|()*+?[]{},/- (no spaces or "
        "quotes: it is one word of earlyoom's command line), with '$' only before '|', ')' "
        "or at the end"
    )
    if not isinstance(value, str) or not _REGEX_WORD.fullmatch(value) or _DOLLAR_FOLLOWED.search(value):
        return allowed
    try:
        with warnings.catch_warnings():  # POSIX classes such as [[:alpha:]] are fine here
            warnings.simplefilter("ignore", FutureWarning)
            re.compile(value)
    except re.error as error:
        return f"{allowed} ({error})"
    return None


SETTINGS = (
    Setting(
        "watchdog_enabled",
        True,
        "Run earlyoom, from the distribution's package, as configured below. False stops and "
        "disables it (e.g. where another OOM daemon is used); its package and files stay.",
        boolean,
    ),
    Setting(
        "watchdog_min_available_kib",
        4 * 1024 * 1024,
        "earlyoom's -M, in KiB: SIGTERM to the worst process once MemAvailable falls to this, "
        "SIGKILL at half of it. 4 GiB (about 3 % of a 128 GB Spark) is several of earlyoom's polls"
        " of headroom at the fastest fill rates its author measured, plus time for a dying job to "
        "let go of its memory, and leaves the jobs the rest. Raise it if a job allocates more than"
        " this in one step: an allocation bigger than what is left fails before earlyoom can act. "
        "From earlyoom 1.8 (Debian 13) the floor shrinks in proportion as non-process memory (GPU "
        "allocations on GB10, tmpfs) grows: see docs/watchdog.md.",
        int_range(64 * 1024, 1024 * 1024 * 1024, "KiB; 4194304 is 4 GiB"),
    ),
    Setting(
        "watchdog_prefer",
        r"^(python[0-9.]*|pt_main_thread|vllm|VLLM::.*|ray::.*)$",
        "earlyoom's --prefer: a POSIX extended regex on the process name (/proc/PID/comm, at most "
        "15 characters) of the processes killed first: python, python3, python3.12, PyTorch's "
        "renamed main thread (pt_main_thread, which is also how `vllm serve` shows up), vLLM and "
        "its workers (VLLM::...), Ray workers (ray::...). One word: no spaces or quotes; '$' only "
        "at the end of an alternative.",
        regex_check,
    ),
    Setting(
        "watchdog_avoid",
        r"^(init|systemd|systemd-.*|sshd|sshd-.*|dockerd|containerd.*|dbus-daemon)$",
        "earlyoom's --avoid: the process names killed only as a last resort: init and systemd's "
        "daemons, sshd (and OpenSSH 9.8+'s sshd-session/sshd-auth), Docker, containerd and its "
        "shims, D-Bus. Same form as watchdog_prefer.",
        regex_check,
    ),
    Setting(
        "watchdog_report_interval_s",
        3600,
        "earlyoom's -r: seconds between the memory reports it writes to its journal (0: none). "
        "Kills are logged whatever this is.",
        int_range(0, 86400, "seconds"),
    ),
)

DEFAULTS = defaults(SETTINGS)  # the settings this concern's deploy reads: its own

declare(__name__, SETTINGS)
