"""
pyinfra loads this file before it builds the inventory or contacts any host.

One call installs what sparkrig adds to a run (sparkrig/hooks.py): every targeted host's
settings are validated before the first connection, so a bad value stops the run with one
message naming the host, the key and what is allowed, and no host is touched; a run's first
changing command on a host takes that host's deploy lock (sparkrig/lock.py), so two deploys
never change one host at once; every command on every host runs from `/`, never from the
login user's home (sparkrig/connection.py); and the run ends with one line saying how many hosts changed
("4 hosts, no changes").
"""

from sparkrig.operations import install

install()
