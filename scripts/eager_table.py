"""Turn `mkb problems check --scale full --device cuda --json` output into problems/eager_h200.json.

Usage: python scripts/eager_table.py QA_JSON OUT_JSON
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mkb import environment  # noqa: E402


def main(qa_path: str, out_path: str) -> None:
    facts = environment.describe(with_gpu=True)
    rows = []
    for report in json.loads(Path(qa_path).read_text()):
        rows.append({
            "problem": report["problem"], "ok": report["ok"], "eager_ms": report["eager_ms"],
            "peak_mem_gb": None if report["peak_mem_bytes"] is None else round(report["peak_mem_bytes"] / 1e9, 3),
            "ref_rel_error": report["ref_rel_error"],
            "failed": [c["name"] + ": " + c["detail"] for c in report["checks"] if not c["ok"]],
            "device": (facts["gpus"] or [{}])[0].get("name"), "driver": facts.get("driver"),
            "cuda": facts.get("cuda"), "versions": facts["versions"], "fingerprint": report["fingerprint"]})
    doc = {"device": f"{rows[0]['device']}, driver {facts.get('driver')}, torch {facts['versions']['torch']}",
           "note": "Recorded by mkb problems check --scale full --device cuda (scripts/gpu_session.sh qa).",
           "problems": rows}
    Path(out_path).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} problems passed full-scale QA; "
          f"eager {min(r['eager_ms'] or 0 for r in rows):.3f}-{max(r['eager_ms'] or 0 for r in rows):.1f} ms")


if __name__ == "__main__":
    main(*sys.argv[1:3])
