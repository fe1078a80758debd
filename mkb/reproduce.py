"""`make reproduce`: the steps this machine can run, each recorded in the database, honestly reported."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mkb import environment
from mkb.problems import catalog_for
from mkb.qa import check_problem
from mkb.settings import Settings
from mkb.store import Store

log = logging.getLogger(__name__)


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

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)


def _qa_step(settings: Settings, store: Store, scale: str, device: str, env: dict) -> Step:
    catalog = catalog_for(settings.problems_dir)
    store.upsert_problems(catalog)
    failed = []
    for info in catalog:
        log.info("QA %s (%s, %s)", info.id, scale, device)
        report = check_problem(info, scale=scale, device=device)
        store.add_problem_check(report, env)
        if not report.ok:
            failed.append(info.id)
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()
    summary = f"{len(catalog) - len(failed)}/{len(catalog)} problems passed QA at {scale} scale on {device}"
    if failed:
        summary += f"; failed: {', '.join(failed)}"
    return Step(f"problem QA ({scale}, {device})", not failed, summary)


def reproduce(settings: Settings) -> Reproduction:
    """Validate the problem set (smoke on CPU; full on the GPU when one is visible) and record it."""
    env = environment.describe(with_gpu=True)
    gpu = env["gpus"][0]["name"] if env["gpus"] else None
    result = Reproduction(gpu=gpu)
    with Store(settings.db_path) as store:
        result.steps.append(_qa_step(settings, store, "smoke", "cpu", env))
        if gpu:
            result.steps.append(_qa_step(settings, store, "full", "cuda", env))
        else:
            result.steps.append(Step("problem QA (full, cuda)", True,
                                     "no GPU visible: full-scale QA needs a CUDA GPU", skipped=True))
    return result
