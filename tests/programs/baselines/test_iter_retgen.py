"""Iter-RetGen with DummyLM: T iterations querying with question + last generation, the query_with and
stop_when_stable flags, failed iterations, demos, save / load and BootstrapFewShot."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs.baselines.iter_retgen import IterRetGen
from rolecall.retrievers.base import Passage
from rolecall.utils import SchemaLM

GARBAGE = {"nonsense": "x"}  # unparseable: ChatAdapter fails, then DSPy's JSON fallback consumes a second answer


def gen(reasoning: str, answer: str) -> dict:
    return {"reasoning": reasoning, "answer": answer}


def events(pred) -> list[str]:
    return [s.role for s in pred.trajectory.steps if s.kind == "event"]


def test_each_iteration_queries_with_the_question_and_the_last_generation(retriever):
    lm = DummyLM([gen("Ada directed X.", "Ada"), gen("Ada was born in Varn.", "Varn"), gen("Still Varn.", "Varn")])
    program = IterRetGen(retriever, lm=lm, demos=None, top_k=2)
    assert list(program.roles) == ["generate"]
    pred = program(question="Where was X's director born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [
        ("Where was X's director born?", 2),
        ("Where was X's director born? Ada directed X. Ada", 2),
        ("Where was X's director born? Ada was born in Varn. Varn", 2),
    ]
    steps = pred.trajectory.role_steps("generate")
    assert [(s.meta["iteration"], s.meta["query"]) for s in steps] == [
        (t, q) for t, (q, _) in enumerate(retriever.calls, 1)
    ]
    assert all(
        s.inputs["question"] == "Where was X's director born?" for s in steps
    )  # the generator never sees y_{t-1}
    assert [s.meta["iteration"] for s in pred.trajectory.retrievals()] == [1, 2, 3]
    assert [g["answer"] for g in pred.generations] == ["Ada", "Varn", "Varn"]
    assert events(pred) == []


def test_the_last_iterations_answer_is_final(retriever):
    lm = DummyLM([gen("r1", "A"), gen("r2", "B")])
    pred = IterRetGen(retriever, lm=lm, demos=None, iterations=2)(question="q?")
    assert pred.answer == "B" and len(retriever.calls) == 2


def test_each_iteration_sees_only_its_own_passages(make_retriever):
    retriever = make_retriever(lambda q, k: [Passage(f"d{len(q)}", f"T{len(q)}", f"about {q}")])
    lm = DummyLM([gen("r", "A"), gen("r", "A")])
    pred = IterRetGen(retriever, lm=lm, demos=None, iterations=2)(question="q?")
    first, second = (s.inputs["passages"] for s in pred.trajectory.role_steps("generate"))
    assert first == "[1] T2 | about q?" and second == "[1] T6 | about q? r A"


def test_query_with_answer_uses_only_the_last_answer(retriever):
    lm = DummyLM([gen("long reasoning", "Ada"), gen("more", "Varn")])
    IterRetGen(retriever, lm=lm, demos=None, iterations=2, query_with="answer")(question="q?")
    assert [q for q, _ in retriever.calls] == ["q?", "q? Ada"]


def test_stop_when_stable_stops_on_a_repeated_answer(retriever):
    lm = DummyLM([gen("r1", "Ada"), gen("r2", "Varn"), gen("r3", "varn."), gen("r4", "never")])
    pred = IterRetGen(retriever, lm=lm, demos=None, iterations=5, stop_when_stable=True)(question="q?")
    assert pred.answer == "varn." and len(retriever.calls) == 3
    (converged,) = [s for s in pred.trajectory.steps if s.kind == "event"]
    assert converged.role == "converged" and converged.meta["iteration"] == 3


def test_iteration_budget_is_recorded_when_never_stable(retriever):
    lm = DummyLM([gen("r1", "A"), gen("r2", "B")])
    pred = IterRetGen(retriever, lm=lm, demos=None, iterations=2, stop_when_stable=True)(question="q?")
    assert pred.answer == "B" and events(pred) == ["budget_exhausted"]
    assert pred.trajectory.steps[-1].meta == {"iterations": 2}


def test_failed_iteration_keeps_the_previous_query_and_answer(retriever):
    lm = DummyLM([gen("Ada directed X.", "Ada"), GARBAGE, GARBAGE, GARBAGE, GARBAGE])
    pred = IterRetGen(retriever, lm=lm, demos=None)(question="q?")
    assert [q for q, _ in retriever.calls] == ["q?", "q? Ada directed X. Ada", "q? Ada directed X. Ada"]
    assert pred.answer == "Ada"
    assert events(pred) == ["fallback", "fallback", "fallback"]  # two failed iterations, then the answer fallback
    assert pred.trajectory.steps[-1].meta["iteration"] == 1
    assert pred.trajectory.parse_rate("generate") == pytest.approx(1 / 3)


def test_null_last_answer_falls_back_to_an_earlier_one(retriever):
    lm = DummyLM([gen("r1", "Ada"), gen("r2", "unknown")])
    pred = IterRetGen(retriever, lm=lm, demos=None, iterations=2)(question="q?")
    assert pred.answer == "Ada" and events(pred) == ["fallback"]


def test_a_null_answer_does_not_steer_retrieval(retriever):
    lm = DummyLM([gen("r1", "Ada"), gen("r2", "unknown"), gen("r3", "Varn")])
    pred = IterRetGen(retriever, lm=lm, demos=None, query_with="answer")(question="q?")
    assert [q for q, _ in retriever.calls] == ["q?", "q? Ada", "q? Ada"] and pred.answer == "Varn"


def test_failing_lm_and_retriever_never_raise(make_retriever):
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = IterRetGen(make_retriever(error=RuntimeError("no index")), lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and pred.generations == [] and len(pred.trajectory.errors) == 6
    assert "no index" in pred.trajectory.retrievals()[0].error

    broken = IterRetGen(make_retriever(), lm=Boom([]), demos=None)
    broken._run = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_empty_retrieval_is_recorded(make_retriever):
    pred = IterRetGen(make_retriever(lambda q, k: []), lm=DummyLM([gen("r", "A")]), demos=None, iterations=1)(
        question="q?"
    )
    assert pred.answer == "A" and pred.trajectory.retrievals()[0].error == "empty retrieval"
    assert pred.trajectory.role_steps("generate")[0].inputs["passages"] == "(no passages)"


@pytest.mark.parametrize(
    "options",
    [
        {"top_k": 0},
        {"iterations": 0},
        {"query_with": "question"},
        {"max_context_chars": 50},
        {"demos": "some"},
        {"stop_when_stable": "yes"},
        {"max_iterations": 2},
    ],
)
def test_invalid_options_raise(options):
    with pytest.raises(ConfigError):
        IterRetGen(**options)


def test_auto_demos():
    demos = IterRetGen().roles["generate"].demos
    assert len(demos) == 3
    assert all(set(d.inputs().keys()) == {"question", "passages"} and d.reasoning and d.answer for d in demos)
    assert all(d.passages.count("\n") >= 1 for d in demos)  # at least two passages each
    with pytest.raises(ConfigError):
        IterRetGen(demos={"answer": []})


def test_save_load_round_trip(tmp_path, retriever):
    program = IterRetGen(retriever, top_k=3, iterations=2, query_with="answer", stop_when_stable=True)
    program.save(tmp_path / "irg")
    loaded = IterRetGen.load(tmp_path / "irg", retriever=retriever)
    assert (loaded.top_k, loaded.iterations, loaded.query_with, loaded.stop_when_stable) == (3, 2, "answer", True)
    assert [d.toDict() for d in loaded.roles["generate"].demos] == [d.toDict() for d in program.roles["generate"].demos]
    assert set(loaded.roles["generate"].demos[0].inputs().keys()) == {"question", "passages"}


def test_bootstrap_few_shot_compiles_iter_retgen(retriever):
    lm = SchemaLM("Varn")
    trainset = [
        dspy.Example(question=f"Where was person {i} born?", answer="Varn").with_inputs("question") for i in range(2)
    ]
    program = IterRetGen(retriever, lm=lm, demos=None, iterations=2)
    with dspy.context(lm=lm):
        optimizer = dspy.BootstrapFewShot(
            metric=lambda e, p, t=None: e.answer == p.answer, max_bootstrapped_demos=2, max_labeled_demos=0
        )
        compiled = program.compile(optimizer, trainset=trainset)
        assert compiled(question="Where was person 9 born?").answer == "Varn"
    assert list(compiled.roles) == ["generate"] and compiled.roles["generate"].demos
    assert compiled.roles["generate"].demos[0].answer == "Varn"
