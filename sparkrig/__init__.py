"""
sparkrig's shared library: what the concerns under operations/ build on, and the only way they
share anything (no concern imports another). settings (the schema settings are declared in,
their validation, every default), reading (the one command that reads a host), atomic (files
written atomically and validated), packages (apt), profile (the hardware profile, read through
host_profile()), venv (uv's place and the venv's, for the Python stack and the source builds),
units (unit names one concern makes and another names), python_wheels (the Python lock's
entries and offline wheels), lock (a host's deploy lock), summary (the run's last line).
"""
