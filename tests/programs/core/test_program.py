"""Program base: roles, per-role LMs, recorded role calls (messages, completions, errors, usage), retrieval steps,
thread-safe recording, compile delegation, deepcopy and save / load."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError, ModelLoadError
from rolecall.programs import Program, Trajectory, format_passages
from rolecall.retrievers.base import Passage


class QA(Program):
    """A two-role toy program: ``qa`` (Predict) and ``think`` (ChainOfThought)."""

    def __init__(self, retriever=None, *, lm=None, demos=None, per_role_adapters=True, tag: str = "x"):
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters)
        self._config = {"tag": tag}
        self.qa = dspy.Predict("question -> answer")
        self.think = dspy.ChainOfThought("question -> answer")
        if demos:
            self.set_demos(demos)
        self._bind_lm()

    def forward(self, question: str) -> dspy.Prediction:
        trajectory = Trajectory(question=question)
        pred = self.call_role("qa", trajectory, question=question)
        return dspy.Prediction(answer=pred.answer if pred else "", trajectory=trajectory)


def test_roles_are_named_after_attributes():
    program = QA()
    assert list(program.roles) == ["qa", "think"]
    assert all(isinstance(p, dspy.Predict) for p in program.roles.values())
    assert program.roles["think"] is program.think.predict


def test_lm_is_bound_to_every_role_and_set_role_lm_overrides():
    shared, special = DummyLM([{"answer": "shared"}]), DummyLM([{"answer": "special"}])
    program = QA(lm=shared)
    assert all(program.role_lm(r) is shared for r in program.roles)
    program.set_role_lm("qa", special)
    assert program.role_lm("qa") is special and program.role_lm("think") is shared
    assert program(question="q").answer == "special"
    with pytest.raises(ConfigError, match="no role 'nope'"):
        program.set_role_lm("nope", special)


def test_bind_role_adapters_gives_each_role_its_view():
    class FakeLocal:
        def __init__(self):
            self.views = {}

        def for_role(self, name):
            self.views[name] = DummyLM([{"answer": name}])
            return self.views[name]

    program, local = QA(), FakeLocal()
    program.bind_role_adapters(local)
    assert sorted(local.views) == ["qa", "think"]
    assert program.role_lm("qa") is local.views["qa"]
    with pytest.raises(ConfigError):
        program.bind_role_adapters(DummyLM([]))


def test_call_role_records_messages_completion_outputs_and_usage():
    program = QA(lm=DummyLM([{"answer": "Paris"}]))
    trajectory = Trajectory(question="Capital of France?")
    pred = program.call_role("qa", trajectory, question="Capital of France?")
    assert pred.answer == "Paris"
    (step,) = trajectory.steps
    assert step.kind == "role" and step.role == "qa" and step.ok
    assert step.inputs == {"question": "Capital of France?"}
    assert step.outputs == {"answer": "Paris"}
    assert step.messages[0]["role"] == "system" and "Capital of France?" in step.messages[-1]["content"]
    assert "[[ ## answer ## ]]" in step.completion and "Paris" in step.completion
    assert step.usage["lm_calls"] == 1 and step.seconds > 0


def test_call_role_records_parse_errors_and_fallback_attempts():
    lm = DummyLM([{"wrong_field": "x"}, {"wrong_field": "y"}])
    program = QA(lm=lm)
    trajectory = Trajectory()
    assert program.call_role("qa", trajectory, question="q") is None
    (step,) = trajectory.steps
    assert step.error.startswith("parse error")
    # ChatAdapter fell back to JSONAdapter: both attempts are kept
    assert step.usage["lm_calls"] == 2 and len(step.meta["attempts"]) == 2
    assert trajectory.parse_rate("qa") == 0.0


def test_call_role_records_lm_exceptions():
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("server down")

    program = QA(lm=Boom([]))
    trajectory = Trajectory()
    assert program.call_role("qa", trajectory, question="q") is None
    assert "server down" in trajectory.steps[0].error


def test_recording_is_thread_safe():
    questions = [f"question number {i} ?" for i in range(8)]
    lm = DummyLM({q: {"answer": f"answer-{i}"} for i, q in enumerate(questions)})
    program = QA(lm=lm)
    with ThreadPoolExecutor(8) as pool:
        preds = list(pool.map(lambda q: program(question=q), questions))
    for i, (q, pred) in enumerate(zip(questions, preds, strict=True)):
        (step,) = pred.trajectory.steps
        assert pred.answer == f"answer-{i}"
        assert q in step.messages[-1]["content"]
        others = [o for o in questions if o != q]
        assert not any(o in m["content"] for o in others for m in step.messages)
        assert f"answer-{i}" in step.completion and step.usage["lm_calls"] == 1


def test_retrieve_records_ids_and_failures(make_retriever):
    program = QA(make_retriever())
    trajectory = Trajectory()
    passages = program.retrieve(trajectory, "query", 3)
    assert [p.id for p in passages] == ["p0", "p1", "p2"]
    assert trajectory.steps[-1].outputs == {
        "passage_ids": ["p0", "p1", "p2"],
        "titles": ["Title 0", "Title 1", "Title 2"],
    }
    assert trajectory.steps[-1].inputs == {"query": "query", "k": 3}

    program.retriever = make_retriever(error=RuntimeError("index gone"))
    assert program.retrieve(trajectory, "query", 3) == []
    assert "index gone" in trajectory.steps[-1].error

    program.retriever = make_retriever(lambda q, k: [])
    assert program.retrieve(trajectory, "query", 3) == []
    assert trajectory.steps[-1].error == "empty retrieval"

    program.retriever = None
    assert program.retrieve(trajectory, "query", 3) == []
    assert trajectory.steps[-1].error == "no retriever"
    assert trajectory.retrieved_ids == ["p0", "p1", "p2"]


def test_format_passages_truncates_each_and_in_total():
    long = Passage("a", "T", "word " * 200)
    text = format_passages([long, long, long], max_chars=100, max_total_chars=250)
    lines = text.splitlines()
    assert len(lines) == 2 and all(len(line) <= 105 for line in lines) and lines[0].startswith("[1] T | word")
    assert format_passages([]) == "(no passages)"
    assert format_passages(["plain"]) == "[1] plain"


def test_compile_delegates_and_passes_valset_only_when_given():
    calls = []

    class Optimizer:
        def compile(self, student, **kwargs):
            calls.append(kwargs)
            return student

    program = QA()
    assert program.compile(Optimizer(), trainset=[1]) is program
    program.compile(Optimizer(), trainset=[1], valset=[2], extra=3)
    assert calls == [{"trainset": [1]}, {"trainset": [1], "valset": [2], "extra": 3}]


def test_deepcopy_copies_predictors_but_shares_lm_and_retriever(retriever):
    lm = DummyLM([])
    program = QA(retriever, lm=lm)
    clone = copy.deepcopy(program)
    assert clone.retriever is retriever and clone.role_lm("qa") is lm
    assert clone.qa is not program.qa
    reset = program.reset_copy()  # what BootstrapFewShot does: predictor LMs cleared, the binding survives
    assert reset.qa.lm is None and reset.role_lm("qa") is lm


def test_save_load_round_trip(tmp_path):
    demo = dspy.Example(question="q1", answer="a1").with_inputs("question")
    program = QA(demos={"qa": [demo]}, tag="saved")
    program.qa.signature = program.qa.signature.with_instructions("Answer tersely.")
    program.save(tmp_path / "prog")
    loaded = QA.load(tmp_path / "prog")
    assert loaded._config == {"tag": "saved"}
    assert [d.toDict() for d in loaded.qa.demos] == [{"question": "q1", "answer": "a1"}]
    assert loaded.qa.signature.instructions == "Answer tersely."
    assert '"lm": null' in (tmp_path / "prog" / "program.json").read_text()
    with pytest.raises(ModelLoadError):
        QA.load(tmp_path / "missing")
