import pytest

from lab.config import LAB_ID

# For tests whose expectations are the default lab's names and addresses (10.213.*, srlab*,
# ...): a lab with SPARKRIG_LAB_ID has others, whose derivation test_lab_units.py tests.
DEFAULT_LAB_ONLY = pytest.mark.skipif(
    LAB_ID != "", reason=f"SPARKRIG_LAB_ID={LAB_ID} renames the lab: these tests check the default lab's names"
)
