"""What the candidate process reported as it happened, kept in the referee (the trusted side).

The candidate's harness streams evidence messages (wire.EVIDENCE) on its reply channel the moment it
observes something: the kernel symbols a DSL runtime built, each genuine DSL call of a draw (with, in
the observed draw, what the call wrote and at what scale), findings (forbidden features, the seal's
refusals) and fingerprints of the entry points the judge relies on. The referee's channel hands each
message to Stream.add as it arrives, so nothing in the candidate process keeps a tally it could change
later: evidence is only ever added, and the first fingerprint, taken before kernel.py was imported, is
the baseline every later one is compared with.

The messages come from a hostile process: every field is checked for its type, and a flood is cut off.
"""

from __future__ import annotations

import math
from collections import defaultdict

MAX_EVENTS = 200_000
"""Evidence messages kept at most; a candidate that sends more is reported (it floods the referee)."""
MAX_PLAN_KEYS = 256
"""Distinct DSL callables the knock-out plan tracks at most."""
ALL_CALLABLES = ":*"
"""The suffix of a DSL's name under which work_floor adds up the bytes of all its callables ("tirx:*"); no callable's
key ends so (keys are "<dsl>:<name>:<symbols>", "<dsl>:module", "cutedsl:<symbols>", "cutedsl:jit")."""


def _text(value, limit: int = 400) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _texts(value, limit: int = 64) -> list[str]:
    return [v[:400] for v in value[:limit] if isinstance(v, str)] if isinstance(value, list) else []


def _stats(value) -> dict | None:
    """A call output's observed scale, with only finite numbers kept."""
    if not isinstance(value, dict):
        return None
    kept = {k: float(v) for k, v in value.items() if k in ("mean", "std", "lo", "hi", "p")
            and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    for k in ("lo", "hi"):
        if k in kept and isinstance(value.get(k), int):
            kept[k] = int(value[k])
    return kept or None


def _sizes(value) -> dict[str, int]:
    """A call's bytes per argument position, as the candidate's harness sent them (at most 64 positions)."""
    if not isinstance(value, dict):
        return {}
    return {str(k)[:40]: int(v) for k, v in list(value.items())[:64]
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 50}


class Stream:
    """The evidence of one grading: built symbols, DSL calls per draw, findings, fingerprints."""

    def __init__(self) -> None:
        self.built: dict[str, set[str]] = defaultdict(set)
        self.calls: dict[int, list[dict]] = defaultdict(list)
        """Genuine DSL calls per draw index (the referee's own numbering of its solve commands)."""
        self.findings: list[str] = []
        self.baseline: dict[str, str] | None = None
        self.patched: list[str] = []
        self.current: int | None = None
        self.events = 0
        self.poisoning: dict[int, str] = {}
        """Draw index -> the DSL callable whose poison the core announced and whose call evidence has not followed: a
        draw that ends there ended inside the judge's own writes (knockout.py refuses it as evidence)."""

    def add(self, message: dict) -> None:
        """One evidence message, as it arrives (wire.Channel's sink)."""
        self.events += 1
        if self.events > MAX_EVENTS:
            if self.events == MAX_EVENTS + 1:
                self.finding(f"sent more than {MAX_EVENTS} evidence messages (flooding the referee)")
            return
        kind = message.get("ev")
        if kind == "built" and _text(message.get("dsl"), 32):
            self.built[message["dsl"]].update(_texts(message.get("symbols"), 4096))
        elif kind == "call" and self.current is not None and _text(message.get("dsl"), 32):
            self.calls[self.current].append(message)
            self.poisoning.pop(self.current, None)
        elif kind == "poison" and self.current is not None:
            self.poisoning[self.current] = _text(message.get("key"), 300) or "?"
        elif kind == "finding" and _text(message.get("text")):
            self.finding(message["text"])
        elif kind == "integrity" and isinstance(message.get("ids"), dict):
            self._integrity({str(k)[:200]: str(v)[:40] for k, v in list(message["ids"].items())[:4096]})

    def new_process(self) -> None:
        """A fresh candidate process replaces the last (referee.relieve): its fingerprint, taken before its import of
        kernel.py, is the new baseline (the entry points' ids are its own); what the last one did is kept."""
        self.baseline = None

    def finding(self, text: str) -> None:
        text = text[:400]
        if text not in self.findings and len(self.findings) < 50:
            self.findings.append(text)

    def _integrity(self, ids: dict[str, str]) -> None:
        if self.baseline is None:
            self.baseline = ids
            return
        for name, value in self.baseline.items():
            if ids.get(name) != value and name not in self.patched:
                self.patched.append(name)

    def calls_by_dsl(self, index: int) -> dict[str, int]:
        """How many genuine calls of each DSL draw `index` made."""
        counts: dict[str, int] = defaultdict(int)
        for call in self.calls.get(index, ()):
            counts[call["dsl"]] += 1
        return dict(counts)

    def work_floor(self) -> dict[str, dict[str, int]]:
        """What every draw gave each DSL callable: key -> argument position -> the least bytes a draw passed there
        over its calls, for the callables every draw called and the positions every draw used (a timed call must do
        as much: timing.run_calls). Each DSL's calls also count together, under "<dsl>:*" (ALL_CALLABLES): the
        bytes of every callable of that DSL at each position, added up; a kernel that calls differently named
        callables in different draws (one in the observed draw, another after) leaves no callable that every draw
        called, and would otherwise leave the timed calls no floor at all."""
        per_draw = []
        for calls in self.calls.values():
            work: dict[str, dict[str, int]] = {}
            for call in calls:
                key, dsl = _text(call.get("key"), 300), _text(call.get("dsl"), 32)
                if key is None or key.endswith(ALL_CALLABLES):
                    continue
                for name in [key] + ([dsl + ALL_CALLABLES] if dsl is not None else []):
                    into = work.setdefault(name, {})
                    for position, size in _sizes(call.get("bytes")).items():
                        into[position] = into.get(position, 0) + size
            per_draw.append(work)
        if not per_draw:
            return {}
        floor = {}
        for key in sorted(set.intersection(*(set(w) for w in per_draw)))[:MAX_PLAN_KEYS]:
            positions = set.intersection(*(set(w[key]) for w in per_draw))
            floor[key] = {p: min(w[key][p] for w in per_draw) for p in sorted(positions)}
        return floor

    def plan(self, index: int) -> dict:
        """The knock-out plan from the observed draw: per callable, the arguments it wrote, their scale, its time."""
        plan: dict[str, dict] = {}
        for call in self.calls.get(index, ()):
            key = _text(call.get("key"), 300)
            if key is None or (key not in plan and len(plan) >= MAX_PLAN_KEYS):
                continue
            entry = plan.setdefault(key, {"args": [], "stats": {}, "s": 0.0})
            stats = call.get("stats") if isinstance(call.get("stats"), dict) else {}
            for position in _texts(call.get("written"), 256):
                if position not in entry["args"]:
                    entry["args"].append(position)
                if entry["stats"].get(position) is None:
                    entry["stats"][position] = _stats(stats.get(position))
            took = call.get("s")
            if isinstance(took, (int, float)) and math.isfinite(took) and 0 <= took < 5:
                entry["s"] = max(entry["s"], float(took))
        return plan

    def summary(self) -> dict:
        """What the record keeps of the stream (details.candidate)."""
        return {"built": {k: sorted(v)[:200] for k, v in self.built.items()}, "findings": list(self.findings),
                "patched": list(self.patched), "evidence_messages": self.events,
                "baseline": self.baseline is not None}
