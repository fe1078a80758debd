"""No secrets in the judge: the allow-listed environment of its processes, and redaction of its records.

The runner is the only process that holds API keys. Every judge process (referee, eager harness,
candidate) starts from an environment built here from an allow-list of names (locale, search
paths, CUDA and the DSLs' own settings), never from the runner's whole environment, and without
any variable whose name looks like a credential even when the allow-list would take it.

As a second line, everything a grading returns (message, log tail, details) passes through
redact_record() before it reaches the agent or the database: the value of every variable the
runner holds whose name looks like a credential is replaced, as is its base64, hex or reversed
form. Values shorter than MIN_SECRET_CHARS are left alone (they would redact ordinary words). The same pass makes
its text safe to store and show (scrub.py).
"""

from __future__ import annotations

import base64
import re
from typing import Any, Mapping

from mkb.judge.scrub import MESSAGE_CHARS, scrub
from mkb.records import JudgeRecord

ALLOWED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS"})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "CUTE_DSL_", "CUTLASS_", "TVM_")
"""What the judge's processes may inherit: locale, library paths, CUDA's and the DSLs' own settings."""
TRUSTED_ONLY = frozenset({"HOME", "TMPDIR", "PYTHONPATH"})
"""Inherited by the trusted referee only; a harness gets its own HOME and TMPDIR (its private /tmp)."""
CREDENTIAL_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "AUTH", "COOKIE",
                    "SESSION", "PRIVATE", "SIGNATURE")
CREDENTIAL_WORDS = frozenset({"PAT", "PASS", "PW", "PIN", "CERT", "JWT", "BEARER"})
"""A name looks like a credential when it contains a part above, or one of these as a whole word
(OPENAI_API_KEY, HF_TOKEN, GITHUB_PAT, DB_PASS, SMTP_PW)."""
MIN_SECRET_CHARS = 8
REDACTED = "[redacted]"


def looks_like_credential(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in CREDENTIAL_PARTS) or bool(set(re.split(r"[^A-Z0-9]+", upper))
                                                                   & CREDENTIAL_WORDS)


def judge_environment(environ: Mapping[str, str], *, trusted: bool) -> dict[str, str]:
    """The environment a judge process starts from: allow-listed names only, none that looks like a credential."""
    allowed = ALLOWED | (TRUSTED_ONLY if trusted else frozenset())
    return {k: v for k, v in environ.items()
            if (k in allowed or k.startswith(ALLOWED_PREFIXES)) and not looks_like_credential(k)}


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """Every form to redact: credential-looking variables' values (long enough), encoded and reversed too."""
    found: set[str] = set()
    for name, value in environ.items():
        if not looks_like_credential(name) or len(value) < MIN_SECRET_CHARS:
            continue
        raw = value.encode()
        found.update({value, value[::-1], raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode().rstrip("="),
                      base64.urlsafe_b64encode(raw).decode().rstrip("=")})
    return sorted(found, key=len, reverse=True)


def redact(obj: Any, secrets: list[str]) -> Any:
    """obj (text, or JSON-like lists and dicts of it) with every secret replaced."""
    if isinstance(obj, str):
        for secret in secrets:
            if secret in obj:
                obj = obj.replace(secret, REDACTED)
        return obj
    if isinstance(obj, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v, secrets) for v in obj]
    return obj


def redact_record(record: JudgeRecord, environ: Mapping[str, str]) -> JudgeRecord:
    """The record with every credential value the runner holds removed from its text, and its text made safe to
    store and show (scrub.py: no lone surrogates, control characters or non-finite numbers)."""
    dumped = record.model_dump(mode="json")
    dumped = {**scrub(dumped), "message": scrub(dumped["message"], MESSAGE_CHARS)}
    return JudgeRecord.model_validate(redact(dumped, secret_values(environ)))
