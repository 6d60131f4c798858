"""
sparkrig's command-line tools, shipped as sparkrig.tools and run as ``sparkrig COMMAND`` (the
wheel's console script; ``uv run sparkrig COMMAND`` in a checkout, :mod:`sparkrig.tools.__main__`).
Each command registers itself (:mod:`sparkrig.tools.cli`; ``sparkrig --help`` lists them): check
(the compliance suite on an inventory's hosts, check), rollout (the deploy batch by batch, each
batch proven, resumable, rollout), report (each box's versions, report), metrics-push (each
host's last compliance outcome to its collector, compliance_metrics), reference (write
docs/settings.md and the tables generated from the code, reference), lock (refresh the Python
stack's locks, python_lock).
"""

# The repository's root is on the path too (the editable install, pytest's rootdir): this folder
# is sparkrig.tools alone, so that one file is never two modules.
if __name__ != "sparkrig.tools":
    raise ImportError(f"{__name__!r} is sparkrig.tools: import it by that name")
