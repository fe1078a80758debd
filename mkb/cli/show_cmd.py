"""`mkb show`: print one attempt's transcript readably (or as JSON)."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from mkb.cli import console, db_option, settings_from

_ROLE_STYLE = {"system": "magenta", "user": "green", "assistant": "cyan", "tool": "yellow"}


def _clip(text: str, lines: int) -> str:
    rows = (text or "").splitlines()
    if len(rows) <= lines:
        return text or ""
    return "\n".join(rows[:lines] + [f"... ({len(rows) - lines} more lines; --full shows all)"])


def _print_call(call: dict, limit: int) -> None:
    function = call.get("function") or {}
    name, raw = function.get("name", "?"), function.get("arguments") or ""
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        console.print(f"  [bold]→ {escape(name)}[/] [red](arguments are not JSON)[/] {escape(raw[:300])}")
        return
    if not isinstance(args, dict):
        args = {"arguments": args}
    if name == "bash":
        console.print(f"  [bold]→ bash[/] $ {escape(str(args.get('command', '')))}")
    elif name == "write_file":
        content = str(args.get("content", ""))
        console.print(f"  [bold]→ write_file[/] {escape(str(args.get('path')))} ({len(content.encode())} bytes)")
        lexer = "python" if str(args.get("path", "")).endswith(".py") else "markdown"
        console.print(Syntax(_clip(content, limit), lexer, word_wrap=True, background_color="default"))
    else:
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
        console.print(f"  [bold]→ {escape(name)}[/]({escape(shown[:500])})")


def _header(attempt, trial) -> Table:
    table = Table(show_header=False, box=None)
    fields = {"trial": attempt.trial_id, "attempt": attempt.attempt_id, "model": attempt.model,
              "state": attempt.state, "status": attempt.status, "sandbox": attempt.sandbox,
              "ended": attempt.message, "usage": attempt.usage}
    if trial:
        fields |= {"problem": f"{trial.problem_id} ({trial.dsl}, {trial.arm})", "speedup": trial.speedup}
    for key, value in fields.items():
        table.add_row(f"[bold]{key}[/]", escape(str(value)))
    return table


@click.command(name="show")
@click.argument("trial_or_attempt")
@db_option
@click.option("--full", is_flag=True, help="Print every line (long outputs are clipped otherwise).")
@click.option("--json", "json_", is_flag=True, help="Print the attempt and its messages as JSON on stdout.")
@click.pass_context
def show(ctx, trial_or_attempt, full, json_):
    """Print an attempt's transcript: messages, tool calls, tool results, gradings.

    TRIAL_OR_ATTEMPT is a trial id (its current attempt) or an attempt id (a prefix will do).

    Example:

    \b
        mkb show p28_r1_solo_cutedsl
        mkb show 3f2a --json | jq '.messages | length'
    """
    from mkb.store import Store

    settings = settings_from(ctx)
    with Store(settings.db_path, read_only=True) as store:
        attempt = store.find_attempt(trial_or_attempt)
        messages = store.messages(attempt.attempt_id)
        trial = store.trial(attempt.model, attempt.trial_id)
        submissions = [{"n": s.n, "kind": s.kind, "status": s.status, "speedup": s.speedup, "kernel_ms": s.kernel_ms,
                        "eager_ms": s.eager_ms, "queue_s": s.queue_s} for s in store.submissions(attempt.attempt_id)]
    if json_:
        click.echo(json.dumps({"attempt": attempt.model_dump(mode="json"),
                               "messages": [m.model_dump(mode="json") for m in messages],
                               "submissions": submissions}, indent=2))
        return
    limit = 10**9 if full else 40
    console.print(Panel(_header(attempt, trial), title="attempt"))
    for m in messages:
        extra = m.extra or {}
        tokens = f" · {m.prompt_tokens}+{m.completion_tokens} tokens" if m.prompt_tokens else ""
        label = m.role + (f" ({extra['tool']})" if extra.get("tool") else "")
        console.rule(f"[{_ROLE_STYLE.get(m.role, 'white')}]#{m.seq} {label}[/] "
                     f"[dim]{extra.get('elapsed_s', 0):.0f} s{tokens}[/]", align="left")
        if extra.get("reasoning"):
            console.print(f"[dim]{escape(_clip(extra['reasoning'], limit // 4))}[/]")
        if m.content:
            console.print(escape(_clip(m.content, 12 if m.role == "system" and not full else limit)))
        for call in m.tool_calls or []:
            _print_call(call, limit)
    if submissions:
        table = Table(title="gradings")
        for col in submissions[0]:
            table.add_column(col)
        for row in submissions:
            table.add_row(*["" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()])
        console.print(table)


def register(main: click.Group) -> None:
    main.add_command(show)
