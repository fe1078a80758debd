"""Turn `mkb problems check --scale full --device cuda --json` output into problems/eager_h200.json.

Usage: python artifact/generators/eager_table.py QA_JSON|DB.duckdb OUT_JSON

QA_JSON is that command's output; a DuckDB file (e.g. the one `mkb reproduce` wrote on the GPU) gives
its latest full-scale CUDA check of each problem instead.

When OUT_JSON exists its rows for the problems in QA_JSON are replaced and the others kept, so the
full-scale QA can run in slices (`QA_FAMILY=moe bash scripts/gpu_session.sh qa`, one device call each).
"""

import datetime as dt
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mkb import environment  # noqa: E402


def _reports(qa_path: str) -> tuple[list[dict], str]:
    if not qa_path.endswith(".duckdb"):
        return json.loads(Path(qa_path).read_text()), "mkb problems check --scale full --device cuda"
    import duckdb

    with duckdb.connect(qa_path, read_only=True) as con:
        rows = con.execute("SELECT report FROM problem_checks WHERE scale = 'full' AND device = 'cuda' "
                           "QUALIFY row_number() OVER (PARTITION BY problem_id ORDER BY created_at DESC) = 1 "
                           "ORDER BY problem_id").fetchall()
    return [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in rows], "mkb reproduce (full-scale QA step)"


def main(qa_path: str, out_path: str) -> None:
    facts = environment.describe(with_gpu=True)
    reports, how = _reports(qa_path)
    if not reports:
        sys.exit(f"{qa_path} holds no full-scale CUDA QA reports; nothing to write (run the QA on the GPU)")
    source = f"recorded: {how}, {dt.date.today().isoformat()}"
    fresh = {}
    for report in reports:
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
