"""Tests of reading an eval run back (``load_run``, ``step_views``) and of its static HTML report, rendered in a real
headless Chromium (skipped, with the reason, where no Chromium is installed; ``make test`` installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rolecall.cli import main
from rolecall.errors import ConfigError
from rolecall.evaluation.report import load_run, render_html, step_views, write_report
from tests.conftest import make_tiny_llama


def run_tiny_eval(tmp_path_factory, tokenizer, *, program: str = "opera", limit: int = 2) -> Path:
    """A real ``rolecall eval`` of ``program`` on ``limit`` synthetic questions with a tiny random Llama: the records
    hold real trajectories (role calls that fail to parse, fallbacks, retrievals). Runs once per test session (the
    folder is shared, so tests must not change it). Returns the run folder."""
    folder = tmp_path_factory.getbasetemp() / f"tiny-eval-{program}-{limit}"
    model_dir, out = folder / "tiny", folder / "run"
    if (out / "summary.json").is_file():
        return out
    make_tiny_llama(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    argv = ["eval", "--program", program, "--model", str(model_dir), "--limit", str(limit), "--max-tokens", "8"]
    assert main([*argv, "--out", str(out), "--no-progress", "--threads", "2"]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, smollm_tokenizer) -> Path:
    """An OPERA run of 2 questions on the tiny model (read-only: copy it before changing it)."""
    return run_tiny_eval(tmp_path_factory, smollm_tokenizer)


@pytest.fixture
def schema_run(tmp_path) -> Path:
    """An OPERA run whose roles answer well-formed (SchemaLM): every role's outputs parse, the first answer is right."""
    import dspy

    from rolecall.data.synthetic import synthetic_world
    from rolecall.evaluation import evaluate
    from rolecall.programs.opera.program import OPERA
    from rolecall.retrievers.bm25 import BM25
    from rolecall.utils.dummies import SchemaLM

    world = synthetic_world(seed=0)
    examples = list(world.splits["test"][:2])
    lm = SchemaLM(examples[0].answer)
    with dspy.context(lm=lm):
        evaluate(OPERA(BM25(list(world.corpus), default_k=3), lm=lm), examples, output_dir=tmp_path, num_threads=1,
                 show_progress=False)  # fmt: skip
    return tmp_path


def test_load_run_reads_records_summary_and_config(tiny_run):
    run = load_run(tiny_run)
    assert len(run.records) == 2 and run.config["program"] == "opera" and run.summary["n"] == 2
    assert run.title == "opera on synthetic (2 questions, bm25 k=5)"
    assert run.record(run.records[1].id) is run.records[1]


def test_an_unknown_question_id_names_some_valid_ones(tiny_run):
    run = load_run(tiny_run)
    with pytest.raises(ConfigError) as err:
        run.record("nope")
    message = str(err.value)
    assert "\n" not in message and "'nope'" in message and run.records[0].id in message


@pytest.mark.parametrize(
    "layout, message",
    [
        ({}, "not an eval output folder (no records.jsonl)"),
        ({"program.json": "{}"}, "rolecall eval --load"),  # a compile output folder
        ({"before/records.jsonl": "", "after/records.jsonl": ""}, "after, before"),  # a demo folder: name its runs
        ({"records.jsonl": ""}, "no finished question yet"),
    ],
)
def test_a_folder_that_is_not_an_eval_run_gets_one_line(tmp_path, layout, message):
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as err:
        load_run(tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_run(tmp_path / "missing")


def test_step_views_of_a_tiny_model_run(tiny_run):
    """Each step says which role (and adapter) acted, what it saw, what it said or why it failed, what it retrieved."""
    record = load_run(tiny_run).records[0]
    views = step_views(record)
    assert len(views) == record.steps
    plan = views[0]
    assert (plan.kind, plan.name, plan.adapter) == ("role", "plan", "plan")
    assert plan.saw == [("question", record.question)]
    assert plan.error.startswith("parse error") and plan.said[0][0] == "raw completion"  # nothing parsed: the raw text
    assert plan.tokens > 0
    retrieval = next(v for v in views if v.kind == "retrieval")
    step = next(s for s in record.trajectory["steps"] if s["kind"] == "retrieval")
    assert retrieval.retrieved == list(zip(step["outputs"]["titles"], step["outputs"]["passage_ids"], strict=True))
    assert ("query", record.question) in retrieval.saw
    assert any(v.kind == "event" and v.notes for v in views)  # e.g. plan_fallback, reason=plan unparseable
    assert all(name != "attempts" for v in views for name, _ in v.notes)  # the raw retries stay in the JSON


def test_step_views_show_parsed_outputs_and_rewards(schema_run):
    record = load_run(schema_run).records[0]
    assert record.em == 1.0
    views = step_views(record)
    synthesis = next(v for v in views if v.name == "synthesis")
    assert ("answer", record.prediction) in synthesis.said and synthesis.error is None
    step = dict(record.trajectory["steps"][0], meta={"reward": 0.75, "reward/format": 1.0})  # as an optimizer logs
    record.trajectory["steps"][0] = step
    assert step_views(record)[0].rewards == {"reward": 0.75, "reward/format": 1.0}


class _Questions(HTMLParser):
    """Collects the rows of ``<table id="questions">`` and the ``<details>`` blocks of a rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.details = 0
        self._in_table = self._in_cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "table" and ("id", "questions") in attrs:
            self._in_table = True
        elif tag == "tr" and self._in_table:
            self.rows.append([])
        elif tag in ("td", "th") and self._in_table:
            self._in_cell = True
            self.rows[-1].append("")
        elif tag == "details":
            self.details += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = False
        elif tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.rows[-1][-1] += data


def test_report_has_a_row_and_a_trajectory_per_question(tiny_run, tmp_path):
    run = load_run(tiny_run)
    page = _Questions()
    page.feed(render_html(run))
    header, *rows = page.rows
    assert header[:5] == ["#", "id", "question", "prediction", "gold"] and len(rows) == 2
    assert [r[1] for r in rows] == [r.id for r in run.records]
    assert page.details >= 2


def test_report_escapes_every_text_and_needs_nothing_outside(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["question"] = record["trajectory"]["question"] = "<script>alert('x')</script> & <b>bold</b>?"
    record["prediction"] = "</td></tr></table><h1>broken</h1>"
    record["trajectory"]["steps"][0]["inputs"]["question"] = "<img src=x onerror=alert(1)>"
    (run_dir / "records.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    path = write_report(run_dir)
    assert path == run_dir / "report.html"
    text = path.read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text and "<h1>broken" not in text and "<b>bold" not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;?" in text
    assert "http://" not in text and "https://" not in text and "<link" not in text  # self-contained: no assets
    page = _Questions()
    page.feed(text)
    assert len(page.rows) == 3 and page.rows[1][3] == record["prediction"]  # the prediction stayed in its cell


@pytest.fixture
def chromium() -> str:
    """The Chromium binary (skips, with the reason, when none is on PATH)."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium binary on PATH: `make test` installs it (apt-get install chromium) where it can")


def test_report_renders_in_a_headless_browser(chromium, tiny_run, tmp_path):
    """Chromium loads the page, and its DOM (after parsing, as a reader sees it) holds one row per question."""
    run = load_run(tiny_run)
    report = write_report(tiny_run, tmp_path / "report.html")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path}"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=180, check=True).stdout  # fmt: skip
    page = _Questions()
    page.feed(dom)
    assert [r[1] for r in page.rows[1:]] == [r.id for r in run.records]
    assert page.details >= len(run.records)
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", "--window-size=1200,900", report.as_uri()],
                   capture_output=True, timeout=180, check=True)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
