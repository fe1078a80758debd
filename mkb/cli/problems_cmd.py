"""`mkb problems`: list, show, check and summarise the problem set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mkb import problems as catalog_mod
from mkb.cli import comma_separated, console, db_option, emit, output_options, settings_from
from mkb.records import DSLS, FAMILIES


def _catalog(ctx):
    settings = settings_from(ctx)
    return settings, catalog_mod.catalog_for(settings.problems_dir)


def _row(p) -> dict:
    return {"id": p.id, "number": p.number, "name": p.name, "family": p.family, "dtype": p.dtype,
            "source": p.source.splitlines()[0] if p.source else "", "description": p.description,
            "dsl_variants": [str(d) for d in DSLS], "sol_flops": p.sol_flops, "sol_bytes": p.sol_bytes,
            "exact": p.exact, "mutates": list(p.mutates), "fingerprint": p.fingerprint}


@click.group(name="problems", invoke_without_command=True)
@click.pass_context
def problems(ctx):
    """List, inspect and check the problem set (default: list).

    Example:

    \b
        mkb problems list --family moe
        mkb problems check --scale smoke --device cpu
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(problems_list)


@problems.command(name="list")
@click.option("--family", multiple=True, callback=comma_separated(list(FAMILIES)),
              help=f"Only these families (repeated or comma-separated): {', '.join(FAMILIES)}.")
@output_options
@click.pass_context
def problems_list(ctx, family=(), json_=False, csv_=False):
    """One row per problem: id, name, family, dtype, source.

    Example:

    \b
        mkb problems list --json
    """
    _, cat = _catalog(ctx)
    rows = [_row(p) for p in cat if not family or p.family in family]
    counts = ", ".join(f"{f} {sum(p.family == f for p in cat)}" for f in FAMILIES)
    emit(rows, json_, csv_, title=f"{len(rows)} problems ({counts})",
         columns=["id", "name", "family", "dtype", "source"])


def _shapes(info):
    """Input/output structures at full scale on the meta device, else smoke scale on CPU."""
    from mkb import tensortree as tt

    module = catalog_mod.load_module(info)
    for device, scale in (("meta", "full"), ("cpu", "smoke")):
        try:
            import torch

            torch.manual_seed(0)
            inputs = module.make_inputs(device=device, scale=scale)
            return scale, tt.describe(list(inputs)), tt.describe(module.reference(*inputs))
        except Exception:  # data-dependent code cannot run on meta tensors; fall back to smoke
            continue
    return None, None, None


def _fmt_struct(desc) -> str:
    if desc is None:
        return "?"
    if "items" in desc:
        return "(" + ", ".join(_fmt_struct(d) for d in desc["items"]) + ")"
    if "shape" in desc:
        return f"{desc['dtype']}{desc['shape']}"
    return desc.get("type", "?")


@problems.command(name="show")
@click.argument("problem_id")
@output_options
@click.pass_context
def problems_show(ctx, problem_id, json_=False, csv_=False):
    """Show one problem: description, source, input/output shapes and dtypes, SOL bound.

    Example:

    \b
        mkb problems show p28
    """
    _, cat = _catalog(ctx)
    info = catalog_mod.resolve(problem_id, cat)
    scale, ins, outs = _shapes(info)
    row = _row(info) | {"path": info.path, "shapes_scale": scale, "inputs": ins, "outputs": outs,
                        "tolerance_factor": info.tolerance_factor, "tolerance_reason": info.tolerance_reason,
                        "margin": info.margin}
    if json_:
        click.echo(json.dumps(row, indent=2))
        return
    console.print(f"[bold]{info.id} {info.name}[/] ({info.family}, {info.dtype})")
    console.print(info.description)
    console.print(f"[dim]{info.source}[/]")
    console.print(f"inputs ({scale} scale): " + ", ".join(_fmt_struct(d) for d in (ins or {}).get("items", [])))
    console.print(f"outputs ({scale} scale): {_fmt_struct(outs)}"
                  + (f"; updated in place: {', '.join(info.mutates)}" if info.mutates else ""))
    console.print(f"SOL: {info.sol_flops:.4g} FLOP, {info.sol_bytes:.4g} bytes"
                  + (", exact outputs" if info.exact else "") + f"; fingerprint {info.fingerprint[:12]}")
    click.echo(f"{info.id}\t{info.name}")


@problems.command(name="check")
@click.argument("ids", nargs=-1)
@click.option("--scale", type=click.Choice(["smoke", "full"]), default="smoke", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--family", multiple=True, callback=comma_separated(list(FAMILIES)),
              help=f"Only these families (repeated or comma-separated): {', '.join(FAMILIES)}.")
@click.option("--record", is_flag=True, help="Store the reports in the results database.")
@db_option
@output_options
@click.pass_context
def problems_check(ctx, ids, scale, device, family, record, json_=False, csv_=False):
    """Problem QA: structure, determinism, finiteness, degeneracy, sensitivity, fp64 anchor, margins.

    Exits 1 listing the failures when any problem fails.

    Example:

    \b
        mkb problems check p28 p44 --scale smoke --device cpu
        mkb problems check --scale full --device cuda --record
    """
    from mkb import environment
    from mkb.qa import check_problems

    settings, cat = _catalog(ctx)
    chosen = catalog_mod.select(list(ids), cat, list(family) or None)
    environment.device_kind(device, len(environment.gpus()) if device == "cuda" else 0)  # refuses cuda without one
    with console.status(f"checking {len(chosen)} problems ({scale}, {device})"):
        reports = [report for _, report in check_problems(chosen, scale=scale, device=device)]
    if record:
        from mkb.store import Store

        env = environment.describe(with_gpu=True)
        with Store(settings.db_path) as store:
            store.upsert_problems(chosen)
            for rep in reports:
                store.add_problem_check(rep, env)
    rows = [{"id": r.problem, "ok": r.ok, "eager_ms": r.eager_ms,
             "peak_mem_gb": None if r.peak_mem_bytes is None else r.peak_mem_bytes / 1e9,
             "ref_rel_error": r.ref_rel_error,
             "failed": "; ".join(f"{c.name}: {c.detail}" for c in r.checks if not c.ok)} for r in reports]
    if json_:
        click.echo(json.dumps([r.model_dump(mode="json") for r in reports], indent=2))
    else:
        emit(rows, False, csv_, title=f"problem QA ({scale}, {device})",
             columns=["id", "ok", "eager_ms", "peak_mem_gb", "ref_rel_error", "failed"])
    failed = [r.problem for r in reports if not r.ok]
    if failed:
        console.print(f"[red]{len(failed)} of {len(reports)} problems failed QA: {', '.join(failed)}[/]")
        sys.exit(1)
    console.print(f"{len(reports)} problems passed QA ({scale}, {device}).")


@problems.command(name="stats")
@output_options
@click.pass_context
def problems_stats(ctx, json_=False, csv_=False):
    """Per-family table: count, dtypes, SOL range, and eager H200 runtime when measured.

    Example:

    \b
        mkb problems stats
    """
    settings, cat = _catalog(ctx)
    eager_file = settings.problems_dir / "eager_h200.json"
    eager = {}
    if eager_file.exists():
        data = json.loads(eager_file.read_text())
        eager = {r["problem"]: r for r in (data["problems"] if isinstance(data, dict) else data)}
    rows = []
    for family in FAMILIES:
        members = [p for p in cat if p.family == family]
        times = [eager[p.id]["eager_ms"] for p in members if p.id in eager and eager[p.id].get("eager_ms")]
        rows.append({
            "family": family, "count": len(members), "dtypes": ", ".join(sorted({p.dtype for p in members})),
            "sol_gflop_min": min((p.sol_flops / 1e9 for p in members), default=None),
            "sol_gflop_max": max((p.sol_flops / 1e9 for p in members), default=None),
            "sol_gb_min": min((p.sol_bytes / 1e9 for p in members), default=None),
            "sol_gb_max": max((p.sol_bytes / 1e9 for p in members), default=None),
            "eager_ms_min": min(times, default=None), "eager_ms_max": max(times, default=None),
            "eager_measured": len(times)})
    emit(rows, json_, csv_, title=f"{len(cat)} problems by family")


@problems.command(name="fidelity")
@click.option("--check", is_flag=True, help="Only check; exit 1 when docs/fidelity.md is out of date.")
@click.pass_context
def problems_fidelity(ctx, check):
    """Check problems/fidelity/*.toml against the catalog (one row per problem) and write docs/fidelity.md.

    Example:

    \b
        mkb problems fidelity
        mkb problems fidelity --check
    """
    from mkb import fidelity

    settings, cat = _catalog(ctx)
    doc = Path(settings.problems_dir).parent / "docs" / "fidelity.md"
    stale = fidelity.sync(settings.problems_dir, cat, doc, write=not check)
    fidelity.require_complete(fidelity.load_rows(settings.problems_dir), cat)
    if check and stale:
        console.print(f"[red]out of date: {doc}[/]. Run 'mkb problems fidelity' to rewrite it.")
        sys.exit(1)
    console.print(f"{'rewrote' if stale else 'up to date'}: {doc} ({len(cat)} problems)")


def register(main: click.Group) -> None:
    main.add_command(problems)
