"""
sparkrig's shared library: what the concerns under operations/ build on, and the only way they
share anything. It never imports a concern (tests/repo/test_architecture.py): settings (the
schema settings are declared in, their validation, every default), host_settings (one host's
settings for a deploy, read-only, the hardware profile resolved), reading (the one command
that reads a host), atomic (files written atomically and validated), packages (apt), profile
(the hardware profiles and the box's identity), venv (uv's place and the venv's), stack_locks
(the Python stack's manifest, locks and venv settings) and wheelhouse (the built wheels' way
into the venv), all three for the Python stack and the source builds, units (unit names one
concern makes and another names), python_wheels (the Python lock's entries and offline wheels),
lock (a host's deploy lock), summary (the run's last line), hooks (all three for a config.py),
resources (templates and data).

operations/, templates/, tools/, tests/compliance/ (sparkrig.compliance) and group_data/'s data
are in this package by links to the repository's folders (sparkrig/operations -> ../operations,
...): the wheel's build follows them, and a checkout's editable install (uv sync) finds them
through them, so a name resolves under sparkrig. in a checkout exactly when it does in the wheel
(tests/repo/test_wheel.py).
"""
