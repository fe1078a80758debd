"""Record the golden attempt that tests/test_trial.py replays with `mkb replay`: rewrites golden_attempt.json;
and render the golden prompts (what an agent is shown first, `mkb show-instruction`) into prompts/.

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
    reply("Yes: finish.", [call("finish", {})]),
]
PROMPTS = HERE / "prompts"
GOLDEN_PROMPTS = {"p28_solo_cutedsl.txt": ("p28", "cutedsl", "solo_cutedsl"),
                  "p28_cutedsl2tirx_skill.txt": ("p28", "tirx", "cutedsl2tirx_skill")}
"""The golden prompts: one problem in each DSL, a solo (instruction with the skill rules) and a skill arm
(instruction and the transfer header with PROMPT_SKILL), under the default (the paper's) conditions."""
PROMPT_SKILL = ("The row reduction is memory-bound: one pass per row reached 2.1x over eager, two passes 1.3x, "
                "because the second pass re-reads the row from DRAM.\n")


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


def golden_prompts() -> dict[str, str]:
    """The text of each golden prompt file, rendered now with the default settings."""
    from mkb.cli.show_instruction_cmd import opening_messages, render_text
    from mkb.records import Arm, Dsl
    from mkb.settings import Settings

    settings = Settings(problems_dir=HERE.parent.parent / "problems")
    return {name: render_text(opening_messages(settings, problem, Dsl(dsl), Arm(arm),
                                               PROMPT_SKILL if Arm(arm).is_skill else None))
            for name, (problem, dsl, arm) in GOLDEN_PROMPTS.items()}


def main_() -> None:
    PROMPTS.mkdir(exist_ok=True)
    for name, text in golden_prompts().items():
        (PROMPTS / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(GOLDEN_PROMPTS)} golden prompts in {PROMPTS.relative_to(HERE.parent.parent)}")
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
