"""Swap off, and it stays off: the settings, declared once, and their checks."""

from __future__ import annotations

from sparkrig.settings import Setting, boolean, declare, defaults

SETTINGS = (
    Setting(
        "swap_disable",
        True,
        "Turn swap off now and keep it off: every swap entry of /etc/fstab commented out (the old "
        "file kept as /etc/fstab.sparkrig.bak), swap and zram units masked and stopped, swapoff -a"
        " while swap is active. On GB10 swap turns memory pressure into a freeze of the whole box "
        "instead of an OOM kill. False leaves swap as it is.",
        boolean,
    ),
    Setting(
        "swap_remove_files",
        False,
        "Also delete, once swap is off, the swap files (regular files with a swap signature, e.g. "
        "/swap.img) of the fstab entries sparkrig disabled. Off by default: deleting is the one "
        "step that uncommenting a line cannot undo.",
        boolean,
    ),
)

DEFAULTS = defaults(SETTINGS)  # the settings this concern's deploy reads: its own

declare(__name__, SETTINGS)
