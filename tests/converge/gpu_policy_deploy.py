"""The GPU policy concern alone, for the tests of its unit (quicker than deploy.py; config.py
still validates every setting before any host is contacted)."""

from sparkrig.operations.gpu_policy import gpu_policy

gpu_policy()
