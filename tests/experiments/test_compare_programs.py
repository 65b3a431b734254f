"""experiments/compare_programs.py: rows, the table, the chart and resumable runs (with a scripted LM)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from rolecall.retrievers.bm25 import BM25
from rolecall.utils import SchemaLM

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "compare_programs.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_programs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_resume_and_report(compare, tmp_path):
    examples, corpus = compare.load_dataset_with_corpus("synthetic", 3)
    assert len(examples) == 3 and corpus
    lm = SchemaLM(examples[0].answer)
    args = argparse.Namespace(out=tmp_path, threads=2, fresh=False)
    retriever = BM25(corpus)
    for name in ("single_step_rag", "no_retrieval_cot"):
        row = compare.run_one(name, "synthetic", examples, retriever, lm, args)
        assert row["n"] == 3 and row["em"] >= 1 / 3 - 1e-9  # SchemaLM answers the first question right
        assert row["n_errors"] == 0 and row["tokens"] >= 0
    calls = lm.calls
    compare.run_one("single_step_rag", "synthetic", examples, retriever, lm, args)
    assert lm.calls == calls, "a finished run must be resumed, not rerun"

    rows = compare.saved_rows(tmp_path)
    assert {(r["dataset"], r["program"]) for r in rows} == {
        ("synthetic", "single_step_rag"),
        ("synthetic", "no_retrieval_cot"),
    }
    assert all(r["em_ci"][0] <= r["em"] <= r["em_ci"][1] for r in rows)
    note_args = argparse.Namespace(k=5, limit=3, threads=2, concurrent_programs=4)
    compare.write_report(rows, tmp_path, note=compare.setup_note(note_args))
    table = (tmp_path / "compare_programs.md").read_text()
    assert table.startswith("# rolecall programs") and "first 3 questions" in table
    assert "| single_step_rag |" in table and "cover-EM" in table and "success" in table and "EM 95% CI" in table
    assert (tmp_path / "compare_programs.png").stat().st_size > 1000
    csv_text = (tmp_path / "compare_programs.csv").read_text()
    assert csv_text.startswith("program,dataset,n,em,f1") and csv_text.splitlines()[0].endswith("em_ci_low,em_ci_high")


def test_missing_real_dataset_is_skipped(compare, monkeypatch, tmp_path):
    monkeypatch.setitem(compare.DATA_FILES, "musique", tmp_path / "absent.jsonl")
    assert compare.load_dataset_with_corpus("musique", 5) is None


def test_cli_rejects_unknown_names(compare):
    with pytest.raises(SystemExit):
        compare.main(["--programs", "nope", "--report-only"])


def test_report_states_the_settings_the_runs_were_made_with(compare, tmp_path):
    args = argparse.Namespace(out=tmp_path, k=5, limit=50, threads=8, concurrent_programs=4)
    assert compare.run_settings(args).threads == 8, "no saved settings: this command's"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "settings.json").write_text('{"threads": 2, "limit": 7, "k": 5, "concurrent_programs": 1}')
    note = compare.setup_note(compare.run_settings(args))
    assert "first 7 questions" in note and "Up to 2 questions per program and 1 programs" in note
    (tmp_path / "runs" / "settings.json").write_text("{not json")
    assert compare.run_settings(args).limit == 50
