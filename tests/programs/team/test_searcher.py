"""The Searcher's prompt formats, its fallback report and the Answerer's vote; the module imports nothing lazily and
pulls in no evaluation code (the import cycle programs <-> evaluation is gone)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys

from rolecall.evaluation import metrics
from rolecall.programs.team import base, program, searcher
from rolecall.programs.team.searcher import SearcherRun, fallback_report, format_notes, format_reports, majority_vote
from rolecall.retrievers.base import Passage
from rolecall.utils import text


def test_majority_vote_rules():
    assert majority_vote(["a", "B", "b", "a"]) == ("a", {"a": 2, "b": 2})
    assert majority_vote([None, "unknown", "Paris"]) == ("Paris", {"paris": 1})
    assert majority_vote(["unknown", None]) == ("unknown", {"unknown": 1})
    assert majority_vote([None, " "]) == ("", {})
    assert majority_vote(["The Varn", "varn!"]) == ("The Varn", {"varn": 2})  # SQuAD normalization


def test_format_notes_shrinks_old_searches_first():
    passages = [Passage(f"d{i}", f"T{i}", "x" * 80) for i in range(3)]
    notes = format_notes([("first", passages), ("second", passages)], max_passage_chars=100, max_notes_chars=300)
    assert notes.startswith("Search 1: first\nSearch 2: second\n[1] T0 | ")


def test_reports_and_fallback_reports_are_cut_at_a_word():
    run = SearcherRun(1, "Where?", history=[("q", [Passage("d", "Varn", "Varn is a   city " + "very " * 20)])])
    report = fallback_report(run, max_report_chars=40)
    assert report == "(unfinished) Varn: Varn is a city..." and len(report) <= 40
    assert fallback_report(SearcherRun(2, "x")) == "(unfinished) nothing found"
    run.report = "a " * 30
    assert format_reports([run], max_report_chars=20) == "[1] Where? -> a a a a a a a a..."
    assert format_reports([]) == "none yet" and format_reports([], empty="no reports") == "no reports"


def test_normalize_answer_lives_in_a_leaf_module_that_metrics_re_exports():
    assert metrics.normalize_answer is text.normalize_answer
    assert "normalize_answer" in metrics.__all__


def test_team_modules_import_nothing_inside_functions():
    for module in (searcher, base, program):
        tree = ast.parse(inspect.getsource(module))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        lazy = [n.lineno for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert lazy == [], f"{module.__name__} imports inside a function at lines {lazy}"


def test_importing_the_teams_does_not_import_evaluation():
    code = "import sys, rolecall.programs.team; print(any(m.startswith('rolecall.evaluation') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
