"""The results database (DESIGN §8): one DuckDB file, its migrations, its rows as typed records, its views."""

from mkb.store.database import Store, now
from mkb.store.rows import ROWS, Attempt, EagerBaseline, Message, NoiseFloor, Row, Run, Skill, StoredSubmission, Trial

__all__ = ["ROWS", "Attempt", "EagerBaseline", "Message", "NoiseFloor", "Row", "Run", "Skill", "Store",
           "StoredSubmission", "Trial", "now"]
