"""NoRetrievalCoT and SingleStepRAG with DummyLM: answers, recorded steps, token budgets, options, demos and failure
handling."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs import NoRetrievalCoT, SingleStepRAG
from rolecall.programs.core.calls import COMPLETED_MARKER


def test_no_retrieval_cot_answers_with_reasoning():
    lm = DummyLM([{"reasoning": "Paris is in France.", "answer": "Paris"}])
    program = NoRetrievalCoT(lm=lm, demos=None)
    assert list(program.roles) == ["answer"]
    pred = program(question="Capital of France?")
    assert pred.answer == "Paris"
    (step,) = pred.trajectory.steps
    assert step.outputs == {"reasoning": "Paris is in France.", "answer": "Paris"} and step.messages
    assert not pred.trajectory.retrievals()


def test_single_step_rag_retrieves_once_then_answers(retriever):
    lm = DummyLM([{"reasoning": "Passage 1 says so.", "answer": "Varn"}])
    program = SingleStepRAG(retriever, lm=lm, demos=None, top_k=3)
    pred = program(question="Where was Ada born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [("Where was Ada born?", 3)]
    answer_step = pred.trajectory.role_steps("answer")[0]
    assert answer_step.inputs["passages"].startswith("[1] Title 0 | Some text number 0.")
    assert pred.trajectory.retrieved_ids == ["p0", "p1", "p2"]


def test_baselines_never_raise(make_retriever):
    lm = DummyLM([{"nonsense": "x"}, {"nonsense": "y"}])
    pred = SingleStepRAG(make_retriever(error=RuntimeError("down")), lm=lm, demos=None)(question="q?")
    assert pred.answer == "" and len(pred.trajectory.errors) == 2

    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = NoRetrievalCoT(lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and "no model" in pred.trajectory.steps[0].error


def test_auto_demos():
    cot, rag = NoRetrievalCoT(), SingleStepRAG()
    assert len(cot.roles["answer"].demos) == 3 and len(rag.roles["answer"].demos) == 3
    demo = rag.roles["answer"].demos[0]
    assert set(demo.inputs().keys()) == {"question", "passages"} and demo.reasoning and demo.answer
    assert "passages" not in cot.roles["answer"].demos[0]


def test_baseline_save_load(tmp_path, retriever):
    program = SingleStepRAG(retriever, top_k=7)
    program.save(tmp_path / "rag")
    loaded = SingleStepRAG.load(tmp_path / "rag", retriever=retriever)
    assert loaded.top_k == 7
    assert [d.toDict() for d in loaded.roles["answer"].demos] == [d.toDict() for d in program.roles["answer"].demos]


def test_bootstrap_compiles_baseline():
    lm = DummyLM([{"reasoning": "r", "answer": "a"}] * 4)
    trainset = [dspy.Example(question=f"q{i}", answer="a").with_inputs("question") for i in range(2)]
    compiled = NoRetrievalCoT(lm=lm, demos=None).compile(
        dspy.BootstrapFewShot(metric=lambda e, p, t=None: e.answer == p.answer, max_labeled_demos=0),
        trainset=trainset,
    )
    assert len(compiled.roles["answer"].demos) == 2


def test_the_answer_role_has_a_token_budget(retriever):
    """Like every other program, the direct baselines stop on the completion marker and cap the answer's tokens."""
    for program_class in (NoRetrievalCoT, SingleStepRAG):
        lm = DummyLM([{"reasoning": "r", "answer": "a"}])
        program = program_class(retriever, lm=lm, demos=None)
        assert program.MAX_TOKENS == {"answer": 128}
        assert program.lm_kwargs == {"*": {"stop": [COMPLETED_MARKER]}, "answer": {"max_tokens": 128}}
        program(question="q?")
        assert lm.history[-1]["kwargs"] == {"stop": [COMPLETED_MARKER], "max_tokens": 128}


@pytest.mark.parametrize(
    ("program_class", "options", "message"),
    [
        (NoRetrievalCoT, {"top_k": 3}, "NoRetrievalCoT has no option 'top_k'"),
        (SingleStepRAG, {"top_k": 0}, "option top_k must be an int >= 1, got 0"),
        (SingleStepRAG, {"max_passage_chars": 500, "max_context_chars": 100}, "max_context_chars (100) must be >="),
        (SingleStepRAG, {"top_k": "3"}, "option top_k must be an int"),
    ],
)
def test_options_are_checked_with_a_message(program_class, options, message):
    with pytest.raises(ConfigError) as info:
        program_class(**options)
    assert message in str(info.value)
