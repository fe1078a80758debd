"""Text the judge returns is safe to store, show and send: valid Unicode, no control sequences, finite numbers.

Every record grade() returns passes through scrub() (with the credential redaction, credentials.py) before it
reaches the agent, the database or a terminal. Much of a record is the candidate's own words: an exception's
message and traceback, its output tail, what its harness reported. A lone surrogate in such a string made the
database refuse the record ("Malformed JSON ... no low surrogate") and the model API refuse the feedback (UTF-8
cannot encode it); a NUL or an ANSI escape reached the database and the terminal of whoever reads a record; a
non-finite number made the strict JSON of `mkb verify --json` and the store's JSON columns fail. So every string
(dict keys included) keeps only printable characters, newline and tab, with lone surrogates, C0/C1 controls,
DEL and the bidirectional overrides (text that reads differently from what it is) replaced by U+FFFD, every
non-finite float becomes None, and no string is longer than its cap (MESSAGE_CHARS, TEXT_CHARS).
"""

from __future__ import annotations

import math
import re
from typing import Any

REPLACEMENT = "\ufffd"
MESSAGE_CHARS = 8000
"""A record's message is cut to this many characters (the agent reads it whole; 50 findings of 400 characters
fit in 20,000, but one repeated text never needs more)."""
TEXT_CHARS = 16000
"""Any other string of a record is cut to this many characters. The harness cuts an exception's text to 2,000 and
its traceback to 4,000, but a kernel can write a reply frame of its own on the harness's reply pipe ahead of the
harness's (tests/kernels/forged_reply.py): its 20 MB "error" became the message and the traceback in the record."""
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0 controls but tab and newline, DEL, C1 controls, bidi embeddings/overrides/isolates, and surrogates (a str
holds one only when it is unpaired: paired ones are decoded into one code point)."""


def text(value: str, limit: int = TEXT_CHARS) -> str:
    """value with every unsafe character replaced by U+FFFD, cut to limit characters (the cut is said)."""
    if len(value) > limit:
        value = value[:limit] + f" [... {len(value) - limit} characters cut]"
    return _UNSAFE.sub(REPLACEMENT, value)


def scrub(obj: Any, limit: int = TEXT_CHARS) -> Any:
    """obj (JSON-like: dicts, lists, strings, numbers) with every string made safe and cut to limit characters, and
    non-finite floats None."""
    if isinstance(obj, str):
        return text(obj, limit)
    if isinstance(obj, dict):
        return {scrub(k, limit): scrub(v, limit) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, limit) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
