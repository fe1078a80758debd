#!/usr/bin/env python3
"""Refresh artifact/expected/tables from the shipped results database, the way `make reproduce` reads it.

    python artifact/generators/expected_tables.py

Run after replacing artifact/results/mkb-h200.duckdb (from `scripts/gpu_session.sh reference`); the CPU
form of `make reproduce` then regenerates these tables from that database and compares them byte for byte.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mkb.reproduce import EXPECTED_TABLES, SHIPPED_DB, _report_step  # noqa: E402


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        step, _ = _report_step(SHIPPED_DB, Path(tmp), "report (shipped H200 results)")
        if not step.ok:
            print(f"no tables: {step.summary}", file=sys.stderr)
            return 1
        shutil.rmtree(EXPECTED_TABLES, ignore_errors=True)
        shutil.copytree(Path(tmp) / "tables", EXPECTED_TABLES)
    print(f"{len(list(EXPECTED_TABLES.iterdir()))} tables in {EXPECTED_TABLES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
