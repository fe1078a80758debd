"""Regenerate the generated blocks of README.md (the settings table). Run: python scripts/render_readme.py"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mkb.settings import settings_table  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"


def rendered(text: str) -> str:
    block = f"<!-- settings-table -->\n{settings_table()}\n<!-- /settings-table -->"
    return re.sub(r"<!-- settings-table -->.*?<!-- /settings-table -->", block, text, flags=re.S)


if __name__ == "__main__":
    README.write_text(rendered(README.read_text()))
