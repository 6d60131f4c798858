"""
sparkrig's shared library: what the concerns under operations/ build on, and the only way they
share anything. It never imports a concern (tests/repo/test_architecture.py): settings (the
schema settings are declared in, their validation, every default), host_settings (one host's
settings for a deploy, read-only, the hardware profile resolved), reading (the one command
that reads a host), atomic (files written atomically and validated), packages (apt), profile
(the hardware profiles and the box's identity), venv (uv's place and the venv's, for the
Python stack and the source builds), units (unit names one concern makes and another names),
python_wheels (the Python lock's entries and offline wheels), lock (a host's deploy lock),
summary (the run's last line), hooks (all three for a config.py), resources (templates and data).

The wheel ships the repository's operations/, templates/ and group_data/'s data inside this
package (sparkrig.operations, ...). In a checkout they stand beside it: the repository's root
joins this package's path, after its own folder, so the same import names work in both.
"""

from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
if not (Path(__file__).resolve().parent / "operations").is_dir() and (_CHECKOUT / "operations" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821 (a package's __path__)
