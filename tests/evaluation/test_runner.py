"""Tests of the evaluation runner: aggregation by hand, failure records, threads, JSONL records and resume."""

from __future__ import annotations

import json
import logging
import threading
import time

import dspy
import pytest

from rolecall.data.types import Example
from rolecall.errors import ConfigError, DataFormatError
from rolecall.evaluation import EvaluationSummary, evaluate, format_summary, read_records
from rolecall.programs.core.trajectory import Step, Trajectory


def _trajectory(question: str, retrieved: list[str], answer_ok: bool) -> Trajectory:
    """Three steps: plan (parsed), one retrieval, answer (parsed or not); 2 LM calls, 30 prompt / 5 out tokens."""
    traj = Trajectory(question=question)
    traj.add(Step(kind="role", role="plan", usage={"prompt_tokens": 10, "completion_tokens": 2, "lm_calls": 1}))
    traj.add(Step(kind="retrieval", role="search", inputs={"query": question}, outputs={"passage_ids": retrieved}))
    traj.add(
        Step(
            kind="role",
            role="answer",
            error=None if answer_ok else "could not parse `answer`",
            usage={"prompt_tokens": 20, "completion_tokens": 3, "lm_calls": 1},
        )
    )
    return traj


class Scripted(dspy.Module):
    """Answers from a script: question -> (answer, retrieved ids, answer parsed?), an exception, or a bare answer."""

    def __init__(self, script: dict, delay: float = 0.0) -> None:
        super().__init__()
        self.script, self.delay = script, delay
        self.calls: list[str] = []
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def forward(self, question: str) -> dspy.Prediction:
        with self._lock:
            self.calls.append(question)
            self.threads.add(threading.get_ident())
        time.sleep(self.delay)
        spec = self.script[question]
        if isinstance(spec, Exception):
            raise spec
        if isinstance(spec, str):  # no trajectory at all
            return dspy.Prediction(answer=spec)
        answer, retrieved, ok = spec
        return dspy.Prediction(answer=answer, trajectory=_trajectory(question, retrieved, ok))


EXAMPLES = [
    Example(id="q1", question="Capital of France?", answers=["Paris"], supporting_ids=["d1", "d2"]),
    Example(id="q2", question="Which dog?", answers=["red dog"], supporting_ids=["d3"]),
    Example(id="q3", question="Crash?", answers=["x"], supporting_ids=["d4"]),
    Example(id="q4", question="Colour?", answers=["Blue", "azure"]),
]
SCRIPT = {
    "Capital of France?": ("Paris", ["d1", "x"], True),  # EM 1, F1 1; retrieval recall 1/2
    "Which dog?": ("the big red dog", ["d3#s1"], False),  # EM 0, F1 0.8, cover-EM 1; sentence of d3 -> recall 1
    "Crash?": RuntimeError("boom"),  # scored 0, success False, recall 0 (nothing retrieved)
    "Colour?": "blue",  # EM 1 without a trajectory; no gold ids -> recall None
}


def test_metrics_aggregate_as_worked_by_hand():
    """em = (1+0+0+1)/4 = 0.5; f1 = (1+0.8+0+1)/4 = 0.7; cover-EM = 3/4; success = 3/4 (q3 raised);
    steps = (3+3+0+0)/4 = 1.5; lm_calls = (2+2)/4 = 1; prompt tokens = 60/4 = 15; completion = 10/4 = 2.5;
    parse rate: plan 2/2, answer 1/2; retrieval recall over q1..q3 = (0.5 + 1 + 0)/3 = 0.5."""
    result = evaluate(Scripted(SCRIPT), EXAMPLES, num_threads=1, show_progress=False)
    s = result.summary
    assert s.n == 4 and s.n_run == 4 and s.n_errors == 1
    assert s.em == pytest.approx(0.5)
    assert s.f1 == pytest.approx(0.7)
    assert s.cover_em == pytest.approx(0.75)
    assert s.success_rate == pytest.approx(0.75)
    assert s.steps == pytest.approx(1.5)
    assert s.lm_calls == pytest.approx(1.0)
    assert s.prompt_tokens == pytest.approx(15.0) and s.completion_tokens == pytest.approx(2.5)
    assert s.parse_rates == {"answer": 0.5, "plan": 1.0}
    assert s.retrieval_recall == pytest.approx(0.5)
    assert s.em_ci[0] <= s.em <= s.em_ci[1] and s.f1_ci[0] <= s.f1 <= s.f1_ci[1]
    assert s.wall_s > 0 and s.throughput > 0
    assert [r.id for r in result.records] == ["q1", "q2", "q3", "q4"]


def test_failed_and_bare_predictions_become_records():
    result = evaluate(Scripted(SCRIPT), EXAMPLES, num_threads=2, show_progress=False)
    q1, q2, q3, q4 = result.records
    assert q1.success and q1.error is None and q1.steps == 3 and q1.retrieved_ids == ["d1", "x"]
    assert q1.trajectory["steps"][1]["outputs"]["passage_ids"] == ["d1", "x"]
    assert q2.parse == {"plan": {"calls": 1, "parsed": 1}, "answer": {"calls": 1, "parsed": 0}}
    assert q2.precision == pytest.approx(2 / 3) and q2.recall == pytest.approx(1.0)
    assert q3.error == "RuntimeError: boom" and q3.prediction == "" and not q3.success
    assert q3.trajectory is None and q3.steps == 0 and q3.retrieval_recall == 0.0
    assert q4.success and q4.em == 1.0 and q4.trajectory is None and q4.retrieval_recall is None


def test_empty_or_missing_answer_is_not_a_success():
    program = lambda question: dspy.Prediction(reasoning="hmm")  # noqa: E731 - no `answer` field at all
    record = evaluate(program, EXAMPLES[:1], show_progress=False).records[0]
    assert record.prediction == "" and not record.success and record.error is None and record.em == 0.0


def test_accepts_dspy_examples_and_ids_by_position():
    examples = [
        dspy.Example(question="a?", answer="yes").with_inputs("question"),
        dspy.Example(question="b?", answers=["no", "nope"], supporting_ids=["d"]).with_inputs("question"),
        EXAMPLES[0].to_dspy(),
    ]
    program = Scripted({"a?": "yes", "b?": "nope", "Capital of France?": "Paris"})
    result = evaluate(program, examples, show_progress=False)
    assert [r.id for r in result.records] == ["#0", "#1", "q1"]
    assert [r.em for r in result.records] == [1.0, 1.0, 1.0]
    assert result.records[1].answers == ["no", "nope"] and result.records[2].supporting_ids == ["d1", "d2"]


def test_many_threads_and_dspy_context_reach_workers():
    lm = dspy.utils.DummyLM([])

    def program(question: str) -> dspy.Prediction:
        time.sleep(0.05)
        return dspy.Prediction(answer="yes" if dspy.settings.lm is lm else "no")

    examples = [Example(id=str(i), question=f"q{i}?", answers=["yes"]) for i in range(12)]
    scripted = Scripted({ex.question: "yes" for ex in examples}, delay=0.05)
    start = time.perf_counter()
    result = evaluate(scripted, examples, num_threads=6, show_progress=False)
    assert time.perf_counter() - start < 12 * 0.05  # ran concurrently
    assert len(scripted.threads) > 1 and [r.id for r in result.records] == [ex.id for ex in examples]
    with dspy.context(lm=lm):
        assert evaluate(program, examples, num_threads=4, show_progress=False).summary.em == 1.0


def test_writes_records_and_summary(tmp_path):
    result = evaluate(Scripted(SCRIPT), EXAMPLES, num_threads=3, output_dir=tmp_path / "run", show_progress=True)
    lines = (tmp_path / "run" / "records.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == ["q1", "q2", "q3", "q4"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["em"] == pytest.approx(0.5) and summary["parse_rate/answer"] == pytest.approx(0.5)
    assert summary["program"] == "Scripted" and result.output_dir == tmp_path / "run"
    assert {r.id: r for r in read_records(tmp_path / "run" / "records.jsonl")}["q2"] == result.records[1]


def test_resume_after_a_killed_run(tmp_path, caplog):
    """A killed run left q1 and q2 complete and q3 half-written: resume re-runs q3 and runs q4, nothing else."""
    out = tmp_path / "run"
    evaluate(Scripted(SCRIPT), EXAMPLES[:2], output_dir=out, show_progress=False)
    path = out / "records.jsonl"
    full_q3 = json.dumps({"id": "q3", "question": "Crash?", "answers": ["x"], "prediction": "x"})
    with path.open("a") as f:
        f.write(full_q3[:25])  # killed mid-write: no closing brace, no newline

    program = Scripted(SCRIPT)
    with caplog.at_level(logging.WARNING, logger="rolecall.evaluation.records"):
        result = evaluate(program, EXAMPLES, output_dir=out, show_progress=False, resume=True)
    assert "truncated" in caplog.text
    assert sorted(program.calls) == ["Colour?", "Crash?"]
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]  # every line parses
    assert sorted(ids) == ["q1", "q2", "q3", "q4"]
    assert result.summary.n == 4 and result.summary.n_run == 2 and result.summary.em == pytest.approx(0.5)

    again = Scripted(SCRIPT)
    evaluate(again, EXAMPLES, output_dir=out, show_progress=False, resume=True)
    assert again.calls == [] and len(path.read_text().splitlines()) == 4


def test_corrupt_line_before_the_end_is_an_error(tmp_path):
    path = tmp_path / "records.jsonl"
    good = json.dumps({"id": "q1", "question": "?", "answers": ["a"]})
    path.write_text(f"{{broken\n{good}\n")
    with pytest.raises(DataFormatError, match="records.jsonl:1"):
        read_records(path)


def test_option_errors(tmp_path):
    program = Scripted(SCRIPT)
    with pytest.raises(ConfigError, match="empty"):
        evaluate(program, [], show_progress=False)
    with pytest.raises(ConfigError, match="num_threads"):
        evaluate(program, EXAMPLES, num_threads=0, show_progress=False)
    with pytest.raises(ConfigError, match="output_dir"):
        evaluate(program, EXAMPLES, resume=True, show_progress=False)
    with pytest.raises(ConfigError, match="unique"):
        evaluate(program, [EXAMPLES[0], EXAMPLES[0]], show_progress=False)
    with pytest.raises(DataFormatError, match="answer"):
        evaluate(program, [dspy.Example(question="no gold?")], show_progress=False)
    evaluate(program, EXAMPLES[:1], output_dir=tmp_path, show_progress=False)
    with pytest.raises(ConfigError, match="resume=True"):
        evaluate(program, EXAMPLES[:1], output_dir=tmp_path, show_progress=False)


def test_metric_prefix_and_summary_table():
    result = evaluate(Scripted(SCRIPT), EXAMPLES, metric_prefix="test/", show_progress=False)
    assert result.metrics["test/em"] == pytest.approx(0.5) and "test/em/ci_low" in result.metrics
    table = format_summary(result.summary)
    assert "parse rate: answer" in table and "retrieval recall" in table and "0.500" in table


def test_summary_of_no_records_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        EvaluationSummary.from_records([])


class FailingCalls(dspy.Module):
    """A program whose first role call fails the way a failed LM call does in ``Program.call_role``; it still answers
    (a fallback) on the question "Recovers?"."""

    def forward(self, question: str) -> dspy.Prediction:
        traj = Trajectory(question=question)
        failed = Step(kind="role", role="plan", error="RuntimeError: CUDA out of memory", meta={"call_failed": True})
        traj.add(failed)
        traj.add(Step(kind="role", role="answer", error="parse error: no `answer` field"))
        return dspy.Prediction(answer="Paris" if question == "Recovers?" else "", trajectory=traj)


def test_failed_role_calls_count_as_errors():
    """Both questions had a failed LM call: two errors, though neither program call raised and one answered (EM 1);
    a parse error alone is not a failed call."""
    examples = [Example(id="a", question="Recovers?", answers=["Paris"]), Example(id="b", question="?", answers=["x"])]
    result = evaluate(FailingCalls(), examples, num_threads=1, show_progress=False)
    a, b = result.records
    assert (a.failed_calls, a.call_error, a.error) == (1, "plan: RuntimeError: CUDA out of memory", None)
    assert a.em == 1.0 and a.success and b.failed_calls == 1 and not b.success
    assert result.summary.n_errors == 2 and "2 errors" in format_summary(result.summary)
    assert evaluate(Scripted(SCRIPT), EXAMPLES, show_progress=False).summary.n_errors == 1  # the raise only


def test_an_example_without_gold_answers_is_an_error():
    with pytest.raises(DataFormatError, match="example 1 \\(id 'q9'\\) has no gold answer"):
        evaluate(Scripted(SCRIPT), [EXAMPLES[0], Example(id="q9", question="?", answers=[])], show_progress=False)


@pytest.mark.parametrize(
    "line, problem",
    [
        ("null", "a record is a JSON object, got NoneType"),
        ("[1, 2]", "a record is a JSON object, got list"),
        ('{"id": "q1", "question": "?"}', "the record has no 'answers'"),
        ('{"id": 3, "question": "?", "answers": ["a"]}', "field 'id' should be a string"),
        ('{"id": "q", "question": "?", "answers": ["a"], "em": "high"}', "field 'em' should be a number"),
    ],
)
def test_a_record_line_of_the_wrong_shape_is_an_error_naming_the_line(tmp_path, line, problem):
    path = tmp_path / "records.jsonl"
    good = json.dumps({"id": "q1", "question": "?", "answers": ["a"]})
    path.write_text(f"{good}\n{line}\n{good}\n")
    with pytest.raises(DataFormatError, match="records.jsonl:2: not a valid evaluation record") as info:
        read_records(path)
    assert problem in str(info.value)
