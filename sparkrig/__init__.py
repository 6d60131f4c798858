"""
sparkrig's shared library: what every concern under operations/ builds on and nothing
concern-specific. settings (the schema settings are declared in, and their validation),
reading (the one command that reads a host), atomic (files written atomically and
validated), packages (apt), lock (a host's deploy lock), summary (the run's last line),
python_wheels (the Python lock's entries and offline wheels).
"""
