"""Record the golden attempt that tests/test_trial.py replays with `mkb replay`: rewrites golden_attempt.json.

    .venv/bin/python tests/data/regenerate.py

A scripted model (the local OpenAI-compatible test server) writes a valid TIRx kernel for p28, looks at
the workspace, submits, writes SKILL.md and finishes; `mkb attempt` runs it with the real judge in its
CPU mode and stores it; its rows are written here as JSON, with this machine's paths and ports replaced.
Regenerate after a change to what an attempt records or to what the tools answer, and review the diff.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from click.testing import CliRunner  # noqa: E402
from scripted_server import ScriptedOpenAIServer, call, reply  # noqa: E402

from mkb.cli import main  # noqa: E402
from mkb.store import ROWS, Store  # noqa: E402

GOLDEN = HERE / "golden_attempt.json"
MODEL = "vllm/golden"
KERNEL = (HERE.parent / "kernels" / "valid_tirx_p28.py").read_text()
SKILL = "Row-wise fused add + RMSNorm: one pass per row, sum of squares in fp32, write both outputs once.\n"
CONVERSATION = [
    reply("Writing a TIRx kernel.", [call("write_file", {"path": "kernel.py", "content": KERNEL})]),
    reply(None, [call("bash", {"command": "ls && grep -c 'T.prim_func' kernel.py"})]),
    reply("Submitting.", [call("submit", {})]),
    reply(None, [call("write_file", {"path": "SKILL.md", "content": SKILL}),
                 call("read_file", {"path": "SKILL.md"})]),
    reply("Done.", [call("finish", {"summary": "a row-wise TIRx kernel"})]),
]


def record(db: Path, home: Path) -> None:
    """Run the scripted attempt through `mkb attempt` into db."""
    server = ScriptedOpenAIServer(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.script(CONVERSATION)
    try:
        result = CliRunner().invoke(main, ["--db", str(db), "--home", str(home), "attempt", "p28", "--dsl", "tirx",
                                           "--model", MODEL, "--base-url", server.base_url, "--device", "cpu"])
    finally:
        server.shutdown()
        server.server_close()
    if result.exit_code != 0:
        raise SystemExit(f"mkb attempt failed: {result.stderr[-2000:]}")


def scrubbed(text: str, tmp: Path) -> str:
    """Machine-specific paths and ports made neutral."""
    text = text.replace(str(tmp), "<tmp>")
    return re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:<port>", text)


def main_() -> None:
    with tempfile.TemporaryDirectory(prefix="mkb-golden-") as tmp:
        db = Path(tmp) / "golden.duckdb"
        record(db, Path(tmp) / "home")
        with Store(db, read_only=True) as store:
            rows = {cls.table: [r.model_dump(mode="json") for r in store.select(cls)] for cls in ROWS}
        text = json.dumps({"about": "tests/data/regenerate.py wrote this; tests/test_trial.py replays it",
                           "rows": rows}, indent=1, sort_keys=True)
        GOLDEN.write_text(scrubbed(text, Path(tmp)) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN.relative_to(HERE.parent.parent)}: "
          + ", ".join(f"{len(v)} {k}" for k, v in rows.items()))


if __name__ == "__main__":
    main_()
