"""Turn `mkb problems check --scale full --device cuda --json` output into problems/eager_h200.json.

Usage: python scripts/eager_table.py QA_JSON OUT_JSON

When OUT_JSON exists its rows for the problems in QA_JSON are replaced and the others kept, so the
full-scale QA can run in slices (`QA_FAMILY=moe bash scripts/gpu_session.sh qa`, one device call each).
"""

import datetime as dt
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mkb import environment  # noqa: E402


def main(qa_path: str, out_path: str) -> None:
    facts = environment.describe(with_gpu=True)
    source = f"recorded: mkb problems check --scale full --device cuda, {dt.date.today().isoformat()}"
    fresh = {}
    for report in json.loads(Path(qa_path).read_text()):
        fresh[report["problem"]] = {
            "problem": report["problem"], "ok": report["ok"], "eager_ms": report["eager_ms"],
            "peak_mem_gb": None if report["peak_mem_bytes"] is None else round(report["peak_mem_bytes"] / 1e9, 3),
            "ref_rel_error": report["ref_rel_error"],
            "failed": [c["name"] + ": " + c["detail"] for c in report["checks"] if not c["ok"]],
            "source": source, "device": (facts["gpus"] or [{}])[0].get("name"), "driver": facts.get("driver"),
            "cuda": facts.get("cuda"), "versions": facts["versions"], "fingerprint": report["fingerprint"]}
    out = Path(out_path)
    kept = json.loads(out.read_text())["problems"] if out.exists() else []
    rows = sorted([r for r in kept if r["problem"] not in fresh] + list(fresh.values()), key=lambda r: r["problem"])
    sources = Counter(r.get("source", "unknown") for r in rows)
    doc = {"device": f"{(facts['gpus'] or [{}])[0].get('name')}, driver {facts.get('driver')}, "
                     f"torch {facts['versions']['torch']}",
           "note": "Eager reference time (ms) and peak GPU memory (GB) per problem at full scale; each row "
                   "names its source: " + "; ".join(f"{n} rows {s}" for s, n in sources.most_common()) + ".",
           "problems": rows}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    done = list(fresh.values())
    print(f"{sum(r['ok'] for r in done)}/{len(done)} problems passed full-scale QA; "
          f"eager {min(r['eager_ms'] or 0 for r in done):.3f}-{max(r['eager_ms'] or 0 for r in done):.1f} ms; "
          f"{len(rows)} rows in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
