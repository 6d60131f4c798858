"""Write the settings reference, docs/settings.md, from every concern's SETTINGS.

    uv run python -m tools.reference
"""

from pathlib import Path

from sparkrig.operations import declaring
from sparkrig.settings import REFERENCE, reference

if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / REFERENCE
    target.parent.mkdir(exist_ok=True)
    target.write_text(reference(declaring()))
    print(f"wrote {target}")
