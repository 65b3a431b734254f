"""The DSPy metrics of rolecall.evaluation.feedback: GEPA's text feedback names the gold answer and what the run did."""

from __future__ import annotations

import dspy
import pytest

from rolecall.data.synthetic import synthetic_world
from rolecall.evaluation import answer_feedback, answer_score, gold_answers
from rolecall.programs.registry import build_program
from rolecall.retrievers.bm25 import BM25
from rolecall.utils import SchemaLM, ScriptedTextLM


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=4, n_dev=1, n_test=1)


@pytest.fixture(scope="module")
def bm25(world):
    return BM25(world.corpus)


def test_answer_feedback_names_the_gold_answer_and_what_the_run_did(world, bm25):
    example = world.train[0]
    program = build_program("opera", bm25, SchemaLM("Somebody Else"))
    pred = program(question=example.question)
    result = answer_feedback(example.to_dspy(), pred, None, "plan", None)
    assert result.score == 0.0
    lines = result.feedback.splitlines()
    assert lines[0].startswith(f"Wrong: the correct answer is {example.answer!r}; the program answered 'Somebody Else'")
    assert "role calls (plan, analysis" in lines[1] and "retrievals" in lines[1]
    assert "supporting passages" in result.feedback
    assert "Role 'plan' was called once; 0 of its outputs failed to parse. Its last output:" in result.feedback
    right = answer_feedback(example, dspy.Prediction(answer=example.answer))  # a rolecall Example works too
    assert right.score == 1.0 and right.feedback.startswith("Correct")
    assert "No trajectory was recorded" in right.feedback
    none = answer_feedback(example, None)
    assert none.score == 0.0 and "gave no answer" in none.feedback
    assert len(answer_feedback(example, pred, max_chars=80).feedback) == 80


def test_answer_feedback_reports_failures_and_partial_credit():
    gold = dspy.Example(question="Who?", answers=["Ada Lovelace", "Ada"])
    program = build_program("no_retrieval_cot", None, ScriptedTextLM(["no sections here"]))
    pred = program(question="Who?")
    result = answer_feedback(gold, pred, pred_name="answer.predict")
    assert result.score == 0.0 and "Failed steps (1): answer: parse error" in result.feedback
    assert "Role 'answer' was called once; 1 of its outputs failed to parse (first: parse error" in result.feedback
    partial = answer_feedback(gold, dspy.Prediction(answer="Lovelace"))
    assert partial.score == pytest.approx(2 / 3) and partial.feedback.startswith("Partly right")
    assert answer_feedback(gold, dspy.Prediction(answer="Lovelace"), score="em").score == 0.0
    assert answer_score(gold, dspy.Prediction(answer="ada")) == 1.0
    assert gold_answers(dspy.Example(question="q", answer="x")) == ["x"]
    with pytest.raises(ValueError, match="score must be one of"):
        answer_score(gold, None, score="bleu")
    with pytest.raises(ValueError, match="no 'answers' or 'answer'"):
        answer_score(dspy.Example(question="q"), None)
