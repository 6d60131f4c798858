"""A directory of the controller's user alone: where sparkrig keeps what steers its next step
(SSH control sockets, a rollout's state, the compliance results)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def private_directory(path: Path, what: str, closed: bool = False) -> Path:
    """``path``, made (mode 0700, parents too) where missing; ValueError naming ``what`` unless
    it is a directory (not a link) of this user's that no one else may write (``closed``: nor
    read or enter), since whoever can replace what is in it steers what sparkrig does next."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:  # checked below, whatever it is
        pass
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & (0o077 if closed else 0o022):
        wanted = "with mode 0700" if closed else "that no one else may write"
        raise ValueError(
            f"{path} ({what}) must be a directory of yours {wanted}, not a link "
            f"(found uid {found.st_uid}, mode {stat.filemode(found.st_mode)})"
        )
    return path
