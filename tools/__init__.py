"""
sparkrig's command-line tools, each run as ``uv run python -m tools.NAME``: rollout (the
deploy batch by batch, each batch proven, resumable), python_lock (refresh the Python
stack's locks), reference (write docs/settings.md).
"""
