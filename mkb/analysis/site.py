"""The browsable report: a static, offline site of every table, figure, cell and transcript (`mkb report --html`).

Layout under the report directory (beside tables/, figures/ and index.md):

    index.html                           models, Table 1 and the other tables, the figures, the parameters
    site/style.css                       the one stylesheet (layout + Pygments classes)
    site/<model>/<direction>.html        the cells of one model and direction, sorted by r
    site/<model>/cells/<cell>.html       base and skill attempts side by side, the source's SKILL.md, the diff
    site/<model>/trials/<trial>.json     everything stored about one trial, unclipped

Pages carry no JavaScript and a Content-Security-Policy that forbids it; everything that came from a model
reaches HTML through Jinja's autoescape or Pygments' escaping. The same database gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from mkb.analysis import highlight
from mkb.analysis.data import DIRECTION_LABELS, DIRECTIONS, Attempt, Cell, Model, Results
from mkb.analysis.params import footnote
from mkb.analysis.render import Table, format_cell
from mkb.analysis.transcript import Loaded, Transcripts, TrialView, clip
from mkb.errors import MkbError
from mkb.store import Store

TEMPLATES = Path(__file__).with_name("site_templates")
SITE_DIR = "site"
MARKER = ".written-by-mkb-report"
"""A file in site/ that lets a later build replace the folder; a site/ without it is never deleted."""
SKILL_LINES, SKILL_CHARS = 400, 40_000
"""A SKILL.md shows this much on a cell page."""


@dataclass(frozen=True)
class Site:
    """What write_site wrote."""

    index: Path
    pages: int
    """HTML pages, index included."""
    trials: int
    """Per-trial JSON files."""


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters |= {"cell": format_cell, "speedup": _speedup, "pct": _pct, "ms": _ms, "ratio": _ratio}
    env.globals |= {"highlight": highlight.highlight, "direction_label": DIRECTION_LABELS.get}
    return env


def _speedup(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}×" if value < 100 else f"{value:.0f}×"


def _ratio(value: float | None) -> str:
    """Three significant digits, trailing zeros kept (1.00, 0.570, 12.0, 512)."""
    return "–" if value is None else f"{value:#.3g}".rstrip(".")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def check_folder(out_dir: Path) -> None:
    """Refuse early (before anything is written) when out_dir/site exists and this command did not write it.

    Raises:
        MkbError: the folder is someone else's.
    """
    site = out_dir / SITE_DIR
    if site.exists() and not (site / MARKER).is_file():
        raise MkbError(f"{site} exists and was not written by 'mkb report --html'. Move it away, or "
                       f"choose another --out.")


def _prepare(site: Path) -> None:
    """Empty site/ (an earlier build wrote it: check_folder said so) and mark it as ours."""
    check_folder(site.parent)
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    (site / MARKER).write_text("This folder is rewritten by every 'mkb report --html'.\n")


def slug(text: str) -> str:
    """A file name for text: lowercase [a-z0-9._-]; when that changed anything, a hash of text is appended
    so that names a model or a database chose can neither escape the folder nor collide."""
    clean = re.sub(r"\.{2,}", ".", re.sub(r"[^a-z0-9._-]+", "-", text.lower())).strip("-.")[:80] or "x"
    return clean if clean == text else f"{clean}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


class _Names:
    """File names, unique within each folder, assigned in a fixed order (so the same database gives the
    same names)."""

    def __init__(self, reserved: dict[str, set[str]]) -> None:
        self._taken = {folder: set(names) for folder, names in reserved.items()}

    def assign(self, folder: str, text: str) -> str:
        taken = self._taken.setdefault(folder, set())
        name, n = slug(text), 1
        while name in taken:
            n += 1
            name = f"{slug(text)}-{n}"
        taken.add(name)
        return name


class _Writer:
    """Renders and writes the pages of one site; knows every page's path."""

    def __init__(self, out_dir: Path, results: Results):
        self.out, self.results, self.env = out_dir, results, _environment()
        self.names = _Names({"models": {"style.css", MARKER}})  # model folders sit beside these in site/
        self.model_dir = {m.name: self.names.assign("models", m.name) for m in results.models}
        self.attempts = {(a.model, a.trial_id): a for a in results.attempts}
        self.trial_file = {key: self.names.assign(f"trials/{key[0]}", key[1]) for key in self.attempts}
        self.cell_file = {c: self.names.assign(f"cells/{c.model}",
                                               f"{c.problem_id}_r{c.replicate}_{c.direction}")
                          for c in results.cells}
        self.pages = 0
        self.json_written: set[str] = set()

    def write(self, relative: str, template: str, **context) -> Path:
        path = self.out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        html = self.env.get_template(template).render(root=_up(relative), **context)
        path.write_text(html, encoding="utf-8", newline="\n")
        self.pages += 1
        return path

    def direction_page(self, model: str, direction: str) -> str:
        return f"{SITE_DIR}/{self.model_dir[model]}/{direction}.html"

    def cell_page(self, cell: Cell) -> str:
        return f"{SITE_DIR}/{self.model_dir[cell.model]}/cells/{self.cell_file[cell]}.html"

    def trial_json(self, model: str, trial_id: str | None) -> str | None:
        key = (model, trial_id)
        return f"{SITE_DIR}/{self.model_dir[model]}/trials/{self.trial_file[key]}.json" \
            if key in self.trial_file else None

    def attempt(self, model: str, trial_id: str | None) -> Attempt | None:
        return self.attempts.get((model, trial_id))


def _up(page: str) -> str:
    """The way from a page (a path relative to the report directory) back up to the report directory."""
    return "../" * page.count("/")


def _sorted_cells(cells: list[Cell]) -> list[Cell]:
    """Complete cells by r, highest first (then problem and replicate); incomplete cells last."""
    return sorted(cells, key=lambda c: (c.r is None, -(c.r or 0.0), c.problem_id, c.replicate))


def _index(w: _Writer, tables: list[Table], figures: list) -> Path:
    main = next(t for t in tables if t.name == "table1_main")
    models = []
    for m in w.results.models:
        directions = [(d, len(cells), sum(c.complete for c in cells), w.direction_page(m.name, d))
                      for d in DIRECTIONS
                      if (cells := [c for c in w.results.cells if c.model == m.name and c.direction == d])]
        counted = sum(1 for a in w.results.counted if a.model == m.name)
        models.append({"model": m, "counted": counted, "directions": directions})
    seen: set[str] = set()
    others = []
    for t in tables:  # a note repeated under every table is shown once, under the first
        fresh = tuple(n for n in t.notes if n not in seen)
        seen |= set(t.notes)
        if t.name not in ("table1_main", "cells"):
            others.append(replace(t, notes=fresh + (("Notes as under Table 1.",) if len(fresh) < len(t.notes) else ())))
    cells_table = next((t for t in tables if t.name == "cells"), None)
    figs = [{"name": spec.name, "caption": spec.caption,
             "png": paths[0].relative_to(w.out).as_posix(), "pdf": paths[1].relative_to(w.out).as_posix()}
            for spec, paths in figures]
    return w.write("index.html", "index.html.j2", models=models, main=main, others=others,
                   cells_table=cells_table, figures=figs, params_note=footnote(w.results.params))


def _direction(w: _Writer, main: Table, model: Model, direction: str, cells: list[Cell],
               names: dict[str, str]) -> None:
    label = DIRECTION_LABELS[direction]
    summary = replace(main, title="This model and direction in Table 1", notes=(), rows=tuple(
        r for r in main.rows if r["model"] == model.label and r["direction"] == label))
    rows = [{"cell": c, "href": f"cells/{w.cell_file[c]}.html", "name": names.get(c.problem_id, ""),
             "source": w.attempt(c.model, c.source_trial_id), "base": w.attempt(c.model, c.base_trial_id),
             "skill": w.attempt(c.model, c.skill_trial_id)} for c in _sorted_cells(cells)]
    w.write(w.direction_page(model.name, direction), "direction.html.j2", model=model, direction=direction,
            summary=summary, rows=rows, params_note=footnote(w.results.params))


def _cell(w: _Writer, transcripts: Transcripts, model: Model, cell: Cell) -> None:
    page = w.cell_page(cell)

    def link(trial_id: str | None) -> str | None:
        target = w.trial_json(cell.model, trial_id)
        return None if target is None else _up(page) + target

    base, skill = (_load(w, transcripts, cell.model, t) for t in (cell.base_trial_id, cell.skill_trial_id))
    source_skill = transcripts.skill(cell.model, cell.source_trial_id)
    base_kernel, skill_kernel = (v.final_kernel if v else None for v in (base, skill))
    diff = (highlight.kernel_diff(base_kernel, skill_kernel, f"{cell.base_trial_id}/kernel.py",
                                  f"{cell.skill_trial_id}/kernel.py")
            if base_kernel is not None and skill_kernel is not None else None)
    w.write(page, "cell.html.j2", model=model, cell=cell,
            problem_name=transcripts.problem_names.get(cell.problem_id, ""),
            source=w.attempt(cell.model, cell.source_trial_id),
            sides=[{"role": "base", "title": f"Base: solo {_target_dsl(cell)}", "view": base,
                    "trial_id": cell.base_trial_id, "json": link(cell.base_trial_id)},
                   {"role": "skill", "title": f"Skill-conditioned: {DIRECTION_LABELS[cell.direction]}",
                    "view": skill, "trial_id": cell.skill_trial_id, "json": link(cell.skill_trial_id)}],
            source_json=link(cell.source_trial_id),
            skill=None if source_skill is None else {
                "sha256": source_skill["sha256"], "text": clip(source_skill["text"], SKILL_LINES, SKILL_CHARS)},
            diff=diff, direction_href=f"../{cell.direction}.html")


def _load(w: _Writer, transcripts: Transcripts, model: str, trial_id: str | None) -> TrialView | None:
    """The trial's view, writing its JSON file on the way (each trial is read once)."""
    loaded = transcripts.load(model, trial_id) if trial_id else None
    if loaded is not None:
        _write_json(w, model, trial_id, loaded)
    return loaded.view if loaded else None


def _write_json(w: _Writer, model: str, trial_id: str, loaded: Loaded) -> None:
    target = w.trial_json(model, trial_id)
    if target is None or target in w.json_written:
        return
    path = w.out / target
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(loaded.document, indent=1, sort_keys=True, default=str, ensure_ascii=False) + "\n",
                    encoding="utf-8", newline="\n")
    w.json_written.add(target)


def _target_dsl(cell: Cell) -> str:
    return DIRECTION_LABELS[cell.direction].split(" → ")[1]


def _remaining_trials(w: _Writer, transcripts: Transcripts) -> None:
    """JSON files of the trials no cell page showed as base or skill (e.g. a source whose target solo is missing)."""
    for model, trial_id in w.attempts:
        if w.trial_json(model, trial_id) not in w.json_written:
            loaded = transcripts.load(model, trial_id)
            if loaded is not None:
                _write_json(w, model, trial_id, loaded)


def write_site(db: Path, results: Results, tables: list[Table], figures: list, out_dir: Path) -> Site:
    """Write index.html and site/ under out_dir from the database at db and the report's tables and figures.

    `figures` is what figures.write_figures returned (may be empty: the index then says none were drawn).
    """
    _prepare(out_dir / SITE_DIR)
    w = _Writer(out_dir, results)
    (out_dir / SITE_DIR / "style.css").write_text((TEMPLATES / "style.css").read_text(encoding="utf-8")
                                                  + highlight.stylesheet(), encoding="utf-8", newline="\n")
    main = next(t for t in tables if t.name == "table1_main")
    with Store(db, read_only=True) as store:
        transcripts = Transcripts(store, [m.name for m in results.models])
        for model in results.models:
            for direction in DIRECTIONS:
                cells = [c for c in results.cells if c.model == model.name and c.direction == direction]
                if not cells:
                    continue
                _direction(w, main, model, direction, cells, transcripts.problem_names)
                for cell in cells:
                    _cell(w, transcripts, model, cell)
        _remaining_trials(w, transcripts)
    index = _index(w, tables, figures)
    return Site(index=index, pages=w.pages, trials=len(w.json_written))
