"""What an agent is shown first, against golden files (tests/data/prompts/, rewritten by tests/data/regenerate.py),
and `mkb show-instruction`, which prints it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mkb.cli import main

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from regenerate import GOLDEN_PROMPTS, PROMPT_SKILL, PROMPTS, golden_prompts  # noqa: E402


@pytest.mark.parametrize("name", sorted(GOLDEN_PROMPTS))
def test_the_golden_prompts_are_what_agents_are_shown(name):
    """A change to the templates changes these files: run tests/data/regenerate.py and review the diff."""
    assert golden_prompts()[name] == (PROMPTS / name).read_text(encoding="utf-8")


def test_show_instruction_prints_the_golden_prompt(tmp_path):
    skill = tmp_path / "SKILL.md"
    skill.write_text(PROMPT_SKILL)
    problem, dsl, arm = GOLDEN_PROMPTS["p28_cutedsl2tirx_skill.txt"]
    result = CliRunner().invoke(main, ["show-instruction", problem, "--dsl", dsl, "--arm", arm, "--skill", str(skill)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (PROMPTS / "p28_cutedsl2tirx_skill.txt").read_text(encoding="utf-8")


def test_show_instruction_follows_the_conditions_and_prints_json():
    result = CliRunner().invoke(main, ["show-instruction", "28", "--dsl", "cutedsl", "--clock", "agent", "--json"])
    assert result.exit_code == 0, result.stderr
    system, user = json.loads(result.stdout)
    assert (system["role"], user["role"]) == ("system", "user")
    assert "not counting time spent waiting for a GPU" in system["content"]
    assert "Skill from an earlier attempt" not in user["content"]


def test_the_skill_prompt_and_the_transfer_header_follow_the_original():
    solo = (PROMPTS / "p28_solo_cutedsl.txt").read_text(encoding="utf-8")
    assert "kernel knowledge" in solo and "about 400 words" not in solo and "Say how sure you are" not in solo
    assert "without a title or heading" in solo and "a summary of\nthe problem" in solo
    assert "the smallest\n   real CuTe DSL kernel" in solo and "There is no bonus for finishing early" in solo
    assert "cute.compile" not in solo and "the **paper** DSL policy" in solo and "2 CPU cores" in solo
    header = (PROMPTS / "p28_cutedsl2tirx_skill.txt").read_text(encoding="utf-8").split("=== user ===")[1]
    assert "## Skill from an earlier attempt\n\nIt was distilled during an attempt at this same problem" in header
    assert header.rstrip().endswith(PROMPT_SKILL.strip()) and "may be wrong" not in header


@pytest.mark.parametrize("args, message", [
    (["--dsl", "cutedsl", "--arm", "cutedsl2tirx_skill"], "arm cutedsl2tirx_skill attempts tirx, not cutedsl"),
    (["--dsl", "tirx", "--skill", "SKILL.md"], "solo arm"),
    (["--dsl", "tirx", "--arm", "cutedsl2tirx_skill", "--skill", "EMPTY.md"], "is empty"),
])
def test_show_instruction_refuses_mismatches_in_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "SKILL.md").write_text("a skill")
    (tmp_path / "EMPTY.md").write_text("  \n")
    result = CliRunner().invoke(main, ["show-instruction", "p28", *args])
    assert result.exit_code == 1 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_strict_dsl_policy_and_its_floor_reach_the_instruction_and_the_contract(tmp_path):
    """--dsl-policy strict is stated to the agent with the floor in force: 90 %, or the problem's DSL_SHARE."""
    from mkb.agent.prompts import contract
    from mkb.problems import catalog_for, resolve
    from mkb.records import Dsl
    from mkb.settings import load_settings

    paper = CliRunner().invoke(main, ["show-instruction", "p28", "--dsl", "tirx"])
    strict = CliRunner().invoke(main, ["show-instruction", "p28", "--dsl", "tirx", "--dsl-policy", "strict"])
    assert paper.exit_code == 0 and strict.exit_code == 0, strict.stderr
    assert "the **paper** DSL policy" in paper.stdout and "strict" not in paper.stdout
    assert "Under the **strict** DSL policy" in strict.stdout and "at least 90 % of the GPU time" in strict.stdout
    problems = load_settings().problems_dir
    lowered = resolve("p28", catalog_for(problems)).model_copy(update={"dsl_share_min": 0.25})
    text = contract(lowered, Dsl("tirx"), problems / "templates", "strict")
    assert "at least 25 % of the GPU time" in text and "90 %" not in text
