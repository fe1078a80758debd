"""`mkb report --html`: the static site from the shipped database and a scripted multi-model one with
hostile transcripts; structure, escaping, bounds and determinism from the files, rendering in real Chromium."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from analysis_db import add_cell_trials, add_problem, add_run, add_skill, add_trial, add_transcript, judge_record
from browser import Chromium, find_chromium
from click.testing import CliRunner

from mkb.analysis.site import MARKER, slug
from mkb.analysis.transcript import clip
from mkb.cli import main
from mkb.records import Arm
from mkb.store import Store

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_DB = ROOT / "artifact" / "results" / "mkb-h200.duckdb"
SC, ST, C2T, T2C = Arm.SOLO_CUTEDSL, Arm.SOLO_TIRX, Arm.CUTEDSL2TIRX_SKILL, Arm.TIRX2CUTEDSL_SKILL
HOSTILE = ("<script>window.__mkb_pwned = 1; console.error('pwned')</script>"
           "<img src=x onerror=\"window.__mkb_pwned = 2\"><a href=\"javascript:window.__mkb_pwned = 3\">click</a>"
           "</pre></details></div><style>body { display: none }</style>{{ 7 * 7 }}{% raw %}")
"""What a model might write to break out of a page: markup, scripts, handlers, styles, template syntax."""
MODEL_B = "org/<i>model-b</i>"
BASE_KERNEL = "import torch\n\n\ndef solve(x):\n    return launch_tirx(x)\n"
SKILL_KERNEL = f"import torch\n\n# {HOSTILE}\n\n\ndef solve(x):\n    y = tile(x, 128)\n    return launch_tirx(y)\n"
LONG_LINES = 5000
ALLOWED_TAGS = {"html", "head", "meta", "title", "link", "body", "nav", "main", "footer", "a", "h1", "h2", "h3",
                "p", "code", "sub", "section", "table", "thead", "tbody", "tr", "th", "td", "div", "span", "strong",
                "br", "em", "figure", "img", "figcaption", "dl", "dt", "dd", "details", "summary", "pre"}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _hostile_transcript() -> list[dict]:
    def call(call_id: str, name: str, arguments) -> dict:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}

    return [
        {"role": "system", "content": "# Task\n" + "Make reference fast.\n" * 50},
        {"role": "user", "content": "Begin.\n\n## Notes from an earlier attempt\n\n" + HOSTILE,
         "extra": {"skill": True, "elapsed_s": 0.1}},
        {"role": "assistant", "content": "Plan: " + HOSTILE,
         "tool_calls": [call("c1", "bash", json.dumps({"command": f"echo '{HOSTILE}'\nls -la"}))],
         "extra": {"elapsed_s": 3.0, "prompt_tokens": 1000, "completion_tokens": 50, "reasoning": "hmm " + HOSTILE}},
        {"role": "tool", "tool_call_id": "c1", "content": "\n".join(f"line {i}" for i in range(LONG_LINES)),
         "extra": {"tool": "bash", "elapsed_s": 4.0}},
        {"role": "assistant", "content": None, "extra": {"elapsed_s": 9.0},
         "tool_calls": [call("c2", "write_file", json.dumps({"path": "kernel.py", "content": SKILL_KERNEL}))]},
        {"role": "tool", "tool_call_id": "c2", "content": "x" * 1_000_000, "extra": {"tool": "write_file"}},
        {"role": "assistant", "content": None,
         "tool_calls": [call("c3", "submit", "not json {"), "garbage", {"function": "not a dict"},
                        call("c4", HOSTILE, json.dumps({"why": HOSTILE}))]},
        {"role": "tool", "tool_call_id": "c3", "content": "submission 1 (feedback): incorrect\n" + HOSTILE,
         "extra": {"tool": "submit", "elapsed_s": 20.0}},
    ]


@pytest.fixture(scope="module")
def scripted_db(tmp_path_factory) -> Path:
    """Two models and the oracle over four problems; model-a's p01 CuTe→TIRx cell has full transcripts
    full of hostile text (r = 3.0 / 1.5 = 2: help); the oracle's p02 cell submits one kernel twice."""
    path = tmp_path_factory.mktemp("db") / "mkb.duckdb"
    with Store(path) as store:
        for number, family in ((1, "attention"), (2, "moe"), (3, "kv_cache"), (4, "quantization")):
            add_problem(store, number, family)
        base = add_transcript(store, "model-a", "p01_r1_solo_tirx", [
            {"role": "system", "content": "# Task"}, {"role": "assistant", "content": "Writing a kernel."}],
            [("final", judge_record("p01", "tirx", speedup=1.5), BASE_KERNEL)])
        skill = add_transcript(store, "model-a", "p01_r1_cutedsl2tirx_skill", _hostile_transcript(),
                               [("feedback", judge_record("p01", "tirx", "incorrect", None, message=HOSTILE), BASE_KERNEL),
                                ("final", judge_record("p01", "tirx", speedup=3.0, dsl_share=0.93), SKILL_KERNEL)],
                               ended="finish: " + HOSTILE)
        add_trial(store, "model-a", "p01", SC, speedup=2.0)
        add_trial(store, "model-a", "p01", ST, speedup=1.5, attempt_id=base)
        add_trial(store, "model-a", "p01", C2T, speedup=3.0, attempt_id=skill)
        add_trial(store, "model-a", "p01", T2C, status="incorrect")
        add_skill(store, "model-a", "p01_r1_solo_cutedsl", "# Tiling\n\nUse 128-wide tiles.\n" + HOSTILE)
        add_cell_trials(store, "model-a", "p02", {SC: 1.0, ST: 0.5, C2T: "skipped", T2C: 4.0})
        add_cell_trials(store, "model-a", "p03", {SC: None, ST: 2.0, C2T: 1.0, T2C: 1.0})
        add_cell_trials(store, "model-a", "p04", {SC: 1.0, C2T: 0.5, T2C: "infra_error"})
        for problem, speedups in (("p01", {SC: 1.0, ST: 2.0, C2T: 1.0, T2C: 1.0}),
                                  ("p02", {SC: None, ST: 1.5, C2T: 3.0, T2C: None}),
                                  ("p03", {SC: 2.0, ST: 2.0, C2T: 2.0, T2C: 2.5})):
            add_cell_trials(store, MODEL_B, problem, speedups)
        add_run(store, "oracle-run", "reference", is_oracle=True)
        add_cell_trials(store, "reference", "p01", {SC: 1.2, ST: 1.1, C2T: 1.3, T2C: 1.0})
        oracle = [add_transcript(store, "reference", trial, [{"role": "assistant", "content": "Writing the shipped solution."}],
                                 [("final", judge_record("p02", "tirx", speedup=1.1), BASE_KERNEL)])
                  for trial in ("p02_r1_solo_tirx", "p02_r1_cutedsl2tirx_skill")]
        add_trial(store, "reference", "p02", SC, speedup=1.0)
        add_trial(store, "reference", "p02", ST, speedup=1.1, attempt_id=oracle[0])
        add_trial(store, "reference", "p02", C2T, speedup=1.1, attempt_id=oracle[1])
    return path


@pytest.fixture(scope="module")
def scripted_site(scripted_db, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scripted")
    result = run("report", "--db", scripted_db, "--out", out, "--html")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out / "index.html")
    return out


@pytest.fixture(scope="module")
def shipped_site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shipped")
    result = run("report", "--db", SHIPPED_DB, "--out", out, "--html")
    assert result.exit_code == 0, result.output
    return out


def _model_dir(site: Path, model: str) -> Path:
    return site / "site" / slug(model)


HOSTILE_CELL = ("model-a", "cells/p01_r1_cutedsl2tirx.html")


class _Page(HTMLParser):
    """Every tag, attribute and text node of a page."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_site_has_every_page_and_safe_names(scripted_site):
    site = scripted_site / "site"
    assert (site / "style.css").stat().st_size > 1000 and (site / MARKER).is_file()
    for model, cells in (("model-a", 8), (MODEL_B, 6), ("reference", 4)):
        folder = _model_dir(scripted_site, model)
        assert (folder / "cutedsl2tirx.html").is_file() and (folder / "tirx2cutedsl.html").is_file()
        assert len(list((folder / "cells").glob("*.html"))) == cells
    assert len(list(site.glob("*/trials/*.json"))) == 15 + 12 + 7
    for path in site.rglob("*"):
        assert re.fullmatch(r"[a-z0-9._-]+", path.name), path
    assert slug(MODEL_B).startswith("org-i-model-b-i-") and slug("reference") == "reference"
    names = ("../../etc", "A", "a", "", ".", "..", "a/b", "a-b", "a/../b")
    assert len({slug(n) for n in names}) == len(names)
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]*", slug(n)) and ".." not in slug(n) for n in names)


def test_pages_carry_no_markup_scripts_or_outside_links_from_the_data(scripted_site):
    pages = [scripted_site / "index.html", *(scripted_site / "site").rglob("*.html")]
    for path in pages:
        html = path.read_text(encoding="utf-8")
        page = _Page(html)
        assert {tag for tag, _ in page.tags} <= ALLOWED_TAGS, path
        for tag, attrs in page.tags:
            assert not any(name.startswith("on") for name in attrs), (path, tag, attrs)
            for name in ("href", "src"):
                if name in attrs:
                    assert not re.match(r"^([a-z]+:|/)", attrs[name]), (path, attrs[name])
        assert "Content-Security-Policy" in html and "default-src 'none'" in html
    cell = _model_dir(scripted_site, "model-a") / HOSTILE_CELL[1]
    text = "".join(_Page(cell.read_text(encoding="utf-8")).text)
    assert text.count("<script>window.__mkb_pwned = 1") >= 8  # user, assistant, reasoning, bash, tool, ended, skill, diff
    assert "{{ 7 * 7 }}{% raw %}" in text
    assert "<i>model-b</i>" in "".join(_Page((scripted_site / "index.html").read_text(encoding="utf-8")).text)


def test_model_names_cannot_take_the_stylesheet_or_each_others_folders(tmp_path):
    with Store(tmp_path / "names.duckdb") as store:
        add_problem(store, 1, "attention")
        for model in ("style.css", "Model", "model", "model-0d1b0e2a8a"):
            add_cell_trials(store, model, "p01", {SC: 1.0, ST: 1.0, C2T: 2.0, T2C: 1.0})
    out = tmp_path / "report"
    assert run("report", "--db", tmp_path / "names.duckdb", "--out", out, "--html", "--no-figures").exit_code == 0
    assert (out / "site" / "style.css").is_file() and (out / "site" / "style.css-2" / "cutedsl2tirx.html").is_file()
    folders = sorted(p.name for p in (out / "site").iterdir() if p.is_dir())
    assert len(folders) == 4 and "model" in folders


def test_cell_page_shows_both_attempts_gradings_skill_and_diff(scripted_site):
    html = (_model_dir(scripted_site, "model-a") / HOSTILE_CELL[1]).read_text(encoding="utf-8")
    text = re.sub(r"\s+", " ", " ".join(_Page(html).text))
    assert "Base: solo TIRx" in text and "Skill-conditioned: CuTe DSL → TIRx" in text
    assert "p01_r1_solo_tirx" in text and "p01_r1_cutedsl2tirx_skill" in text
    assert "Paired ratio r 2.00" in text and "help" in text
    assert "93.0%" in text  # the final grading's DSL share; the others show a dash
    assert "# Tiling Use 128-wide tiles." in text  # the source's SKILL.md
    assert "+4 −1 lines" in text and "y = tile(x, 128)" in text
    assert html.count("<details") >= 6
    oracle = (_model_dir(scripted_site, "reference") / "cells" / "p02_r1_cutedsl2tirx.html").read_text(encoding="utf-8")
    assert "The two final kernels are identical." in oracle
    skipped = (_model_dir(scripted_site, "model-a") / "cells" / "p02_r1_cutedsl2tirx.html").read_text(encoding="utf-8")
    assert "Skipped: the source solo wrote no SKILL.md" in skipped


def test_long_outputs_are_clipped_on_pages_and_whole_in_the_json(scripted_site):
    folder = _model_dir(scripted_site, "model-a")
    html = (folder / HOSTILE_CELL[1]).read_text(encoding="utf-8")
    assert f"line {LONG_LINES - 1}" not in html and "line 39" in html
    assert f"{LONG_LINES - 40} more lines not shown" in html
    assert "x" * 6000 in html and "x" * 6001 not in html
    assert len(html.encode()) < 200_000
    document = json.loads((folder / "trials" / "p01_r1_cutedsl2tirx_skill.json").read_text(encoding="utf-8"))
    messages = document["attempts"][0]["messages"]
    assert messages[3]["content"].endswith(f"line {LONG_LINES - 1}") and len(messages[5]["content"]) == 1_000_000
    assert document["trial"]["status"] == "passed" and document["attempts"][0]["submissions"][1]["record"][
        "details"]["dsl_share"] == 0.93
    assert document["attempts"][0]["submissions"][1]["kernel_source"] == SKILL_KERNEL


def test_direction_pages_list_cells_by_r_highest_first(scripted_site):
    html = (_model_dir(scripted_site, "model-a") / "cutedsl2tirx.html").read_text(encoding="utf-8")
    rows = re.findall(r'<a href="cells/(p\d\d)_r1_cutedsl2tirx.html">', html)
    assert rows == ["p01", "p02", "p03", "p04"]  # r = 2, 1 (skipped), 0.5, then p04 (no base: incomplete)
    assert "ΔGM" in html and "This model and direction in Table 1" in html


def test_clip_counts_what_it_leaves_out():
    assert clip("a\nb\nc", 2, 100).text == "a\nb" and clip("a\nb\nc", 2, 100).hidden_lines == 1
    assert clip("abc", 5, 2).note == "… 1 more characters not shown; the trial's JSON has the full text"
    assert clip("a\nb", 5, 100).note == "" and clip(None, 5, 5).text == ""
    assert clip("a\nb\nc\n", 1, 100).lines == 3


def test_same_database_gives_the_same_site(scripted_db, tmp_path):
    """Byte for byte (figures are left out here: test_report checks that they are deterministic)."""
    builds = []
    for name in ("first", "second"):
        out = tmp_path / name
        assert run("report", "--db", scripted_db, "--out", out, "--html", "--no-figures").exit_code == 0
        builds.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert builds[0].keys() == builds[1].keys() and len(builds[0]) > 60
    assert [k for k in builds[0] if builds[0][k] != builds[1][k]] == []


def test_rebuild_replaces_its_own_site_but_never_a_foreign_folder(scripted_db, tmp_path):
    out = tmp_path / "report"
    assert run("report", "--db", scripted_db, "--out", out, "--html", "--no-figures").exit_code == 0
    (out / "site" / "stale.html").write_text("old")
    result = run("report", "--db", scripted_db, "--out", out, "--html", "--no-figures", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["site"] == str(out / "index.html")
    assert not (out / "site" / "stale.html").exists()
    assert "No figures in this report" in (out / "index.html").read_text(encoding="utf-8")
    foreign = tmp_path / "foreign"
    (foreign / "site").mkdir(parents=True)
    (foreign / "site" / "notes.txt").write_text("mine")
    result = run("report", "--db", scripted_db, "--out", foreign, "--html", "--no-figures")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        f"Error: {foreign / 'site'} exists and was not written by 'mkb report --html'. Move it away, or choose "
        f"another --out."]
    assert (foreign / "site" / "notes.txt").read_text() == "mine" and not (foreign / "tables").exists()


def test_shipped_site_links_resolve(shipped_site):
    pages = [shipped_site / "index.html", *(shipped_site / "site").rglob("*.html")]
    assert len(pages) == 1 + 2 + 24
    for path in pages:
        for tag, attrs in _Page(path.read_text(encoding="utf-8")).tags:
            target = attrs.get("href") or attrs.get("src")
            if target and not target.startswith("#"):
                assert (path.parent / target.split("#")[0]).is_file(), (path, target)


# --- in a real browser ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run installs it)")
    chromium = Chromium(binary, tmp_path_factory.mktemp("chromium") / "profile")
    yield chromium
    chromium.close()


def _open(browser: Chromium, page: Path, shot: Path) -> None:
    browser.open(page.as_uri())
    browser.screenshot(shot)
    assert browser.console_errors() == [], page


def test_shipped_site_renders_in_chromium(browser, shipped_site, tmp_path):
    _open(browser, shipped_site / "index.html", tmp_path / "shipped-index.png")
    assert browser.evaluate("document.querySelectorAll('table').length") >= 7
    assert "Table 1: skill vs base by model and direction" in browser.evaluate("document.body.innerText")
    images = browser.evaluate("[...document.images].map(i => [i.complete, i.naturalWidth])")
    assert len(images) == 4 and all(done and width > 500 for done, width in images)
    _open(browser, shipped_site / "site" / "reference" / "cells" / "p25_r1_cutedsl2tirx.html",
          tmp_path / "shipped-cell.png")
    text = browser.evaluate("document.body.innerText")
    assert "Transcript (11 messages)" in text and "Gradings" in text and "final" in text
    assert browser.evaluate("document.querySelectorAll('.sides .msg').length") == 22
    assert browser.evaluate("getComputedStyle(document.querySelector('.sides')).gridTemplateColumns").count("px") == 2


def test_hostile_transcript_shows_as_text_and_never_runs(browser, scripted_site, tmp_path):
    _open(browser, scripted_site / "index.html", tmp_path / "scripted-index.png")
    assert "all models" in browser.evaluate("document.body.innerText")
    _open(browser, _model_dir(scripted_site, MODEL_B) / "tirx2cutedsl.html", tmp_path / "scripted-direction.png")
    _open(browser, _model_dir(scripted_site, "model-a") / HOSTILE_CELL[1], tmp_path / "scripted-cell.png")
    assert browser.evaluate("typeof window.__mkb_pwned") == "undefined"
    assert browser.evaluate("document.scripts.length + document.querySelectorAll('style, [onerror]').length") == 0
    assert browser.evaluate("getComputedStyle(document.body).display") == "block"
    assert "Plan: <script>window.__mkb_pwned = 1; console.error('pwned')</script>" in browser.evaluate(
        "document.body.innerText")
    browser.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    browser.screenshot(tmp_path / "scripted-cell-open.png")
    assert browser.evaluate("document.body.innerText").count("window.__mkb_pwned = 1") >= 8
    assert browser.evaluate("typeof window.__mkb_pwned") == "undefined" and browser.console_errors() == []
