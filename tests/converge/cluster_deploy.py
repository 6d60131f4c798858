"""The cluster concern alone, for tests that change only the cluster (quicker than deploy.py;
config.py still validates every setting before any host is contacted)."""

from sparkrig.operations.cluster import cluster

cluster()
