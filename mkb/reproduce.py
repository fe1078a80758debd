"""`make reproduce`: every step this machine can run, each recorded, and an honest account of the rest.

On a GPU: environment check, problem QA (smoke on CPU, full on the GPU), the `reference` oracle protocol
over the problems with shipped solutions, the report and the claims comparison. With a model: that
model's full protocol instead of the oracle. Without a GPU: problem QA at smoke scale, then every table
regenerated from the shipped results database and compared byte for byte with the committed ones.
"""

from __future__ import annotations

import filecmp
import logging
from dataclasses import dataclass, field
from pathlib import Path

from mkb import environment
from mkb.environment import Device, resolve_device
from mkb.problems import catalog_for
from mkb.qa import check_problems
from mkb.records import State
from mkb.settings import Settings
from mkb.store import Store

log = logging.getLogger(__name__)

ARTIFACT = Path(__file__).resolve().parent.parent / "artifact"
SHIPPED_DB = ARTIFACT / "results" / "mkb-h200.duckdb"
"""The results database produced on the H200 and shipped with the repository."""
EXPECTED_TABLES = ARTIFACT / "expected" / "tables"
"""The tables `mkb report` made from SHIPPED_DB when it was committed."""


@dataclass
class Step:
    """One step of the reproduction: what ran, whether it passed, where its output is."""

    name: str
    ok: bool
    summary: str
    skipped: bool = False


@dataclass
class Reproduction:
    """Everything `mkb reproduce` did."""

    gpu: str | None
    steps: list[Step] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)


def _qa_step(settings: Settings, store: Store, scale: str, device: str, env: dict) -> Step:
    catalog = catalog_for(settings.problems_dir)
    store.upsert_problems(catalog)
    failed = []
    for info, report in check_problems(catalog, scale=scale, device=device):
        log.info("QA %s (%s, %s): %s", info.id, scale, device, "ok" if report.ok else "FAILED")
        store.add_problem_check(report, env)
        if not report.ok:
            failed.append(info.id)
    summary = f"{len(catalog) - len(failed)}/{len(catalog)} problems passed QA at {scale} scale on {device}"
    return Step(f"problem QA ({scale}, {device})", not failed, summary + (f"; failed: {', '.join(failed)}" if failed else ""))


def _protocol_step(settings: Settings, store: Store, model: str, problems: list[str] | None) -> Step:
    from mkb import protocol
    from mkb.errors import MkbError
    from mkb.problems import select

    try:
        catalog = select(problems, catalog_for(settings.problems_dir), None)
        if model == protocol.ORACLE:  # the oracle covers the problems that have a shipped solution in both DSLs
            catalog = protocol.oracle_problems(settings, catalog)
        ids = [p.id for p in catalog]
        request = protocol.RunRequest(model=model, problems=ids, base_url=settings.base_url, command="mkb reproduce")
        items = protocol.check_stale(protocol.make_plan(settings, store, request), rerun_stale=False)
        progress = protocol.execute(settings, store, request, items)
    except MkbError as exc:
        return Step(f"protocol ({model})", False, str(exc))
    label = f"{model} (oracle)" if model == protocol.ORACLE else model
    return Step(f"protocol ({label})", not progress.by_state.get(State.INFRA_ERROR),
                f"{progress.done} trials run, {progress.passed} passed, "
                f"{len(items) - progress.total} reused, over {len(ids)} problems")


def _report_step(db: Path, out: Path, name: str) -> tuple[Step, Path | None]:
    from mkb.analysis.claims import compare, load_claims
    from mkb.analysis.data import load_results
    from mkb.analysis.report import write_report

    with Store(db, read_only=True) as store:
        results = load_results(store, None)
    if results.is_empty:
        return Step(name, False, f"{db} holds no finished trials"), None
    claims = load_claims(ARTIFACT / "claims.json")
    written = write_report(results, out, claims, with_figures=True, site_db=db)
    rows = compare(results, claims)
    return Step(name, True, f"{len(written.tables)} tables, {len(written.figures)} figures, "
                            f"{len(rows)} claims compared; start at {written.index}"), written.index


def _compare_tables(out: Path) -> Step:
    expected = sorted(p.name for p in EXPECTED_TABLES.glob("*")) if EXPECTED_TABLES.is_dir() else []
    if not expected:
        return Step("tables vs committed", False, f"no expected tables in {EXPECTED_TABLES}")
    differ = [n for n in expected if not (out / "tables" / n).exists()
              or not filecmp.cmp(out / "tables" / n, EXPECTED_TABLES / n, shallow=False)]
    return Step("tables vs committed", not differ,
                f"{len(expected) - len(differ)}/{len(expected)} tables identical to artifact/expected/tables"
                + (f"; differ: {', '.join(differ[:5])}" if differ else ""))


def reproduce(settings: Settings, model: str | None = None, problems: list[str] | None = None) -> Reproduction:
    """Run what this machine can; record it; report what was skipped and why.

    `problems` (ids or globs) narrows the protocol run, e.g. to fit a GPU session; QA always covers all
    problems. Finished trials already in the database are reused, so slices add up to the full run."""
    env = environment.describe(with_gpu=True)
    device: Device = resolve_device(settings)
    gpu = device.gpus[0]["name"] if device.kind == "cuda" else None
    result = Reproduction(gpu=gpu)
    result.steps.append(Step("environment", True, f"GPU {gpu or 'none'}; driver {env.get('driver') or '-'}; "
                             + ", ".join(f"{k} {v}" for k, v in env["versions"].items())))
    with Store(settings.db_path) as store:
        result.steps.append(_qa_step(settings, store, "smoke", "cpu", env))
        if gpu:
            result.steps.append(_qa_step(settings, store, "full", "cuda", env))
        else:
            result.steps.append(Step("problem QA (full, cuda)", True, "skipped: needs a CUDA GPU", skipped=True))
        if model or gpu:
            result.steps.append(_protocol_step(settings, store, model or "reference", problems))
        else:
            result.steps.append(Step("protocol (reference oracle)", True,
                                     "skipped: grading kernels needs a CUDA GPU (or pass MODEL=... to run a model)",
                                     skipped=True))
    if model or gpu:
        step, index = _report_step(settings.db_path, settings.home / "report", "report + claims (this run)")
        result.steps.append(step)
        result.outputs += [str(settings.db_path)] + ([str(index)] if index else [])
    if SHIPPED_DB.exists():
        out = settings.home / "report-shipped"
        step, index = _report_step(SHIPPED_DB, out, "report + claims (shipped H200 results)")
        result.steps.append(step)
        if step.ok:
            result.steps.append(_compare_tables(out))
            result.outputs.append(str(index))
    else:
        result.steps.append(Step("report (shipped H200 results)", True,
                                 f"skipped: no shipped results database yet ({SHIPPED_DB.relative_to(ARTIFACT.parent)}); "
                                 f"it comes from the GPU form of this command (scripts/gpu_session.sh reference)",
                                 skipped=True))
    return result
