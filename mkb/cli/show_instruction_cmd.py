"""`mkb show-instruction`: print what an agent is shown at the start of an attempt."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mkb.cli import dsl_policy_option, protocol_options, settings_from
from mkb.errors import MkbError
from mkb.records import DSLS, Arm, Dsl

SKILL_PLACEHOLDER = "<the SKILL.md the source solo left goes here>"
"""The transferred skill in a skill arm's first message when no --skill file is given."""


def opening_messages(settings, problem: str, dsl: Dsl, arm: Arm | None, skill_text: str | None) -> list[dict]:
    """The system and first user message of an attempt at problem in dsl (arm default: the solo), as sent."""
    from mkb.agent.budget import Budget
    from mkb.agent.conditions import Conditions
    from mkb.agent.executor import WORKDIR
    from mkb.agent.prompts import Gpu, opening
    from mkb.agent.workspace import has_docs
    from mkb.problems import catalog_for, resolve

    arm = arm or Arm(f"solo_{dsl}")
    if arm.dsl != dsl:
        raise MkbError(f"arm {arm} attempts {arm.dsl}, not {dsl}. Use --dsl {arm.dsl}, or drop --arm.")
    if not arm.is_skill and skill_text is not None:
        raise MkbError(f"--skill is given but {arm} is a solo arm. Choose a skill arm with --arm, or drop --skill.")
    info = resolve(problem, catalog_for(settings.problems_dir))
    budget = Budget()
    skill = (skill_text if skill_text is not None else SKILL_PLACEHOLDER) if arm.is_skill else None
    return opening(info, dsl, skill, gpu=Gpu(arch=settings.arch), budget_s=budget.wall_s,
                   n_submissions=budget.n_submissions, workdir=WORKDIR, has_docs=has_docs(settings.problems_dir, dsl),
                   templates_dir=settings.problems_dir / "templates", conditions=Conditions.of(settings))


def render_text(messages: list[dict]) -> str:
    """The messages as plain text, each under a '=== role ===' line."""
    return "".join(f"=== {m['role']} ===\n{m['content'].rstrip()}\n\n" for m in messages).rstrip() + "\n"


@click.command(name="show-instruction")
@click.argument("problem")
@click.option("--dsl", type=click.Choice([str(d) for d in DSLS]), required=True, help="The variant's DSL.")
@click.option("--arm", type=click.Choice([str(a) for a in Arm]),
              help="The arm (default the DSL's solo); a skill arm's first message carries the transfer header.")
@click.option("--skill", type=click.Path(exists=True, dir_okay=False),
              help="A SKILL.md to show as the transferred skill (skill arms; default a placeholder).")
@protocol_options
@dsl_policy_option
@click.option("--json", "json_", is_flag=True, help="Print the messages as JSON (OpenAI wire format) on stdout.")
@click.pass_context
def show_instruction(ctx, problem, dsl, arm, skill, clock, context_full, manual_examples, json_):
    """Print what an agent sees first: the instruction (system) and the first user message.

    Example:

    \\b
        mkb show-instruction p28 --dsl cutedsl
        mkb show-instruction p28 --dsl tirx --arm cutedsl2tirx_skill --skill SKILL.md
        mkb show-instruction p28 --dsl tirx --clock agent --json
        mkb show-instruction p28 --dsl cutedsl --dsl-policy strict
    """
    settings = settings_from(ctx, clock=clock, context_full=context_full, manual_examples=manual_examples)
    skill_text = Path(skill).read_text(encoding="utf-8") if skill else None
    if skill_text is not None and not skill_text.strip():
        raise MkbError(f"--skill {skill} is empty: no skill would be transferred (the trial is skipped). Give a "
                       f"non-empty file, or drop --skill for the placeholder.")
    messages = opening_messages(settings, problem, Dsl(dsl), Arm(arm) if arm else None, skill_text)
    click.echo(json.dumps(messages, indent=2) if json_ else render_text(messages), nl=json_)


def register(main: click.Group) -> None:
    main.add_command(show_instruction)
