"""The updates concern alone, for tests that change only updates (quicker than deploy.py;
config.py still validates every setting before any host is contacted)."""

from sparkrig.operations.updates import updates

updates()
