"""Tests of the inspection commands: ``rolecall programs [NAME]``, ``rolecall show RUN [--question ID]`` and
``rolecall report RUN [--out FILE]``, on the real registry and on runs written by a real (tiny-model) evaluation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rolecall.cli import main
from rolecall.cli_compile import APPLIES_TO, OPTIMIZERS
from rolecall.cli_inspect import OPTIMIZER_SUMMARIES, program_info
from rolecall.evaluation.report import load_run
from rolecall.programs.registry import get_program_class, program_names
from tests.evaluation.test_report import run_tiny_eval


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, smollm_tokenizer):
    """An OPERA run of 2 questions on the tiny random model (read-only; shared with tests/evaluation/test_report.py)."""
    return run_tiny_eval(tmp_path_factory, smollm_tokenizer)


def test_programs_lists_every_program_and_optimizer(capsys):
    assert main(["programs"]) == 0
    out = capsys.readouterr().out
    for name in program_names():
        assert f"{name} " in out and get_program_class(name).__name__ in out
    assert "planner=decomposer+replanner" in out  # REAP's shared planning adapter
    blocks = {}  # optimizer -> its summary and "applies to" lines
    for line in out.split("\noptimizers", 1)[1].splitlines()[1:]:
        if line[:3].strip():
            name = line.split()[0]
        if line.strip():
            blocks[name] = f"{blocks.get(name, '')} {line.strip()}"
    assert list(blocks) == list(OPTIMIZERS)
    for name, programs in APPLIES_TO.items():
        assert "applies to: " + ", ".join(programs) in blocks[name]
    assert "applies to: cascaded_team, d2plan" in blocks["sft"] and "ircot" not in blocks["sft"]


def test_every_optimizer_has_a_summary():
    assert set(OPTIMIZER_SUMMARIES) == set(OPTIMIZERS)


def test_every_program_option_is_documented():
    """The attribute docstring of each option is what `rolecall programs NAME` shows; none may be missing."""
    for name in program_names():
        info = program_info(name)
        fields = [f.name for f in dataclasses.fields(get_program_class(name).Options)]
        assert [o.name for o in info.options] == fields
        assert all(o.doc for o in info.options), (name, [o.name for o in info.options if not o.doc])


def test_one_program_shows_roles_options_and_optimizers(capsys):
    assert main(["programs", "opera"]) == 0
    out = capsys.readouterr().out
    assert "OPERA" in out and "rolecall.programs.opera.program" in out
    for role in ("plan", "analysis", "rewrite", "synthesis"):
        assert f"  {role} " in out
    assert "top_k" in out and "int >= 1" in out and "default 5" in out
    assert "Passages retrieved on a sub-goal's first attempt" in out  # the option's attribute docstring
    assert "a list of int or null" in out and "default None" in out  # k_schedule
    assert "demo_policy" in out and "per_role_adapters" in out  # the switches every program takes
    optimizers = out.split("optimizers", 1)[1]
    assert all(name in optimizers for name in ("sft", "mapgrpo", "grpo")) and "splanrl" not in optimizers


def test_one_program_shows_its_shared_adapters(capsys):
    assert main(["programs", "d2plan"]) == 0
    out = capsys.readouterr().out
    assert "reasoner_plan" in out and "adapter reasoner (shared with" in out and "splanrl" in out


def test_an_unknown_program_gets_one_line_with_the_valid_names(capsys):
    assert main(["programs", "operaa"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'operaa'" in err and "opera" in err and "single_step_rag" in err


def test_show_prints_the_summary_and_a_row_per_question(tiny_run, capsys):
    assert main(["show", str(tiny_run)]) == 0
    out = capsys.readouterr().out
    assert "opera on synthetic (2 questions, bm25 k=5)" in out and "EM" in out and "retrieval recall" in out
    run = load_run(tiny_run)
    for record in run.records:
        row = next(line for line in out.splitlines() if line.startswith(record.id))
        assert record.answers[0] in row and str(record.steps) in row
    assert "--question" in out  # says how to see one trajectory


def test_show_question_renders_the_trajectory_role_by_role(tiny_run, capsys):
    record = load_run(tiny_run).records[0]
    assert main(["show", str(tiny_run), "--question", record.id]) == 0
    out = capsys.readouterr().out
    assert record.question in out and "gold: " + record.answers[0] in out
    lines = out.splitlines()
    assert any(line.lstrip().startswith("1. plan") and "[adapter plan]" in line for line in lines)
    assert "saw:" in out and "said:" in out and "error: parse error" in out
    step = next(s for s in record.trajectory["steps"] if s["kind"] == "retrieval")
    assert step["outputs"]["titles"][0] in out and step["outputs"]["passage_ids"][0] in out
    assert max(len(line) for line in lines) <= 200  # long inputs (passages) are cut


def test_show_an_unknown_question_names_valid_ids(tiny_run, capsys):
    assert main(["show", str(tiny_run), "--question", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'nope'" in err and load_run(tiny_run).records[0].id in err


def test_show_and_report_reject_a_folder_that_is_not_an_eval_run(tmp_path, capsys):
    for command in ("show", "report"):
        assert main([command, str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"rolecall {command}: error:" in err and "not an eval output folder" in err
    assert not (tmp_path / "report.html").exists()


def test_report_writes_run_report_html_or_out(tiny_run, tmp_path, capsys):
    out = tmp_path / "sub" / "page.html"
    assert main(["report", str(tiny_run), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and '<table id="questions">' in text


def test_a_failed_lm_call_is_shown_as_the_questions_error(tmp_path, capsys):
    """A question whose LM call failed (the program itself did not raise) says so in the table, the trajectory and the
    HTML report."""
    run = tmp_path / "run"
    run.mkdir()
    record = {"id": "q1", "question": "who?", "answers": ["x"], "failed_calls": 1,
              "call_error": "answer: RuntimeError: out of memory"}  # fmt: skip
    (run / "records.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["show", str(run)]) == 0
    assert "error: answer: RuntimeError: out of memory" in capsys.readouterr().out
    assert main(["show", str(run), "--question", "q1"]) == 0
    assert "error: answer: RuntimeError: out of memory" in capsys.readouterr().out
    assert main(["report", str(run)]) == 0
    assert "out of memory" in (run / "report.html").read_text()
