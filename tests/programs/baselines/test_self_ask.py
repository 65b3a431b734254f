"""Self-Ask with DummyLM: follow-ups answered from retrieval, the history, the final answer, the follow-up budget,
repeated follow-ups, placeholders, the use_retrieval flag, malformed outputs, demos, save / load and
BootstrapFewShot."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs.baselines.self_ask import SelfAsk
from rolecall.utils import SchemaLM

GARBAGE = {"nonsense": "x"}  # unparseable: ChatAdapter fails, then DSPy's JSON fallback consumes a second answer


def follow(question: str) -> dict:
    return {"action": "follow_up", "text": question}


def final(answer: str) -> dict:
    return {"action": "final_answer", "text": answer}


def events(pred) -> list[str]:
    return [s.role for s in pred.trajectory.steps if s.kind == "event"]


def test_follow_ups_are_answered_from_retrieval_until_the_final_answer(retriever):
    lm = DummyLM(
        [
            follow("Who directed Film X?"),
            {"answer": "Ada Quell"},
            follow("Where was Ada Quell born?"),
            {"answer": "Varn"},
            final("Varn"),
        ]
    )
    program = SelfAsk(retriever, lm=lm, demos=None, top_k=2)
    assert list(program.roles) == ["ask", "answer_followup"]
    pred = program(question="Where was the director of Film X born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [("Who directed Film X?", 2), ("Where was Ada Quell born?", 2)]
    roles = [s.role for s in pred.trajectory.steps]
    assert roles == ["ask", "retrieve", "answer_followup", "ask", "retrieve", "answer_followup", "ask"]
    asks = pred.trajectory.role_steps("ask")
    assert asks[0].inputs["history"] == "(none)"
    assert asks[2].inputs["history"] == (
        "Follow up: Who directed Film X?\nIntermediate answer: Ada Quell\n"
        "Follow up: Where was Ada Quell born?\nIntermediate answer: Varn"
    )
    assert [s.meta["turn"] for s in asks] == [0, 1, 2]
    answers = pred.trajectory.role_steps("answer_followup")
    assert [(s.meta["turn"], s.meta["query"]) for s in answers] == [
        (0, "Who directed Film X?"),
        (1, "Where was Ada Quell born?"),
    ]
    assert answers[0].inputs["passages"].startswith("[1] Title 0 | Some text number 0.")
    assert pred.follow_ups == [
        {"follow_up": "Who directed Film X?", "answer": "Ada Quell"},
        {"follow_up": "Where was Ada Quell born?", "answer": "Varn"},
    ]
    assert events(pred) == []


def test_follow_up_budget_is_recorded_and_the_last_answer_is_used(retriever):
    lm = DummyLM([follow("a?"), {"answer": "A"}, follow("b?"), {"answer": "B"}, follow("c?")])
    pred = SelfAsk(retriever, lm=lm, demos=None, max_follow_ups=2)(question="q?")
    assert pred.answer == "B" and [q for q, _ in retriever.calls] == ["a?", "b?"]
    assert events(pred) == ["budget_exhausted", "fallback"]
    budget = pred.trajectory.steps[-2]
    assert budget.error and budget.meta == {"turns": 3, "max_turns": 3}  # the SearchLoop's: max_follow_ups + 1 asks


def test_repeated_follow_up_stops(retriever):
    lm = DummyLM([follow("Who directed X?"), {"answer": "Ada"}, follow("who directed x?")])
    pred = SelfAsk(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == "Ada" and len(retriever.calls) == 1
    assert events(pred) == ["repeated_follow_up", "fallback"]


def test_placeholders_in_follow_ups_are_filled(retriever):
    script = [follow("Who directed X?"), {"answer": "Ada"}, follow("Where was [person from step 1] born?")]
    lm = DummyLM([*script, {"answer": "Varn"}, final("Varn")])
    pred = SelfAsk(retriever, lm=lm, demos=None)(question="q?")
    assert retriever.calls[1][0] == "Where was Ada born?" and pred.answer == "Varn"
    assert pred.follow_ups[1]["follow_up"] == "Where was Ada born?"


def test_use_retrieval_false_answers_closed_book(retriever):
    lm = DummyLM([follow("Who directed X?"), {"answer": "Ada"}, final("Ada")])
    pred = SelfAsk(retriever, lm=lm, demos=None, use_retrieval=False)(question="q?")
    assert pred.answer == "Ada" and retriever.calls == [] and not pred.trajectory.retrievals()
    assert pred.trajectory.role_steps("answer_followup")[0].inputs["passages"] == "(no passages)"


def test_malformed_first_ask_falls_back_to_the_question(retriever):
    lm = DummyLM([GARBAGE, GARBAGE, {"answer": "Varn"}, final("Varn")])
    pred = SelfAsk(retriever, lm=lm, demos=None)(question="Where was Ada born?")
    assert pred.answer == "Varn" and retriever.calls[0][0] == "Where was Ada born?"
    assert pred.trajectory.role_steps("ask")[0].error.startswith("parse error")
    assert events(pred) == ["fallback"]


def test_malformed_later_ask_stops_with_the_last_intermediate_answer(retriever):
    lm = DummyLM([follow("a?"), {"answer": "A"}, GARBAGE, GARBAGE])
    pred = SelfAsk(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == "A" and events(pred) == ["fallback", "fallback"]
    assert pred.trajectory.steps[-2].meta == {"turn": 1, "reason": "ask call failed"}


def test_null_intermediate_answers_are_unknown_and_not_returned(retriever):
    lm = DummyLM([follow("a?"), GARBAGE, GARBAGE, final("none")])
    pred = SelfAsk(retriever, lm=lm, demos=None)(question="q?")
    assert pred.follow_ups == [{"follow_up": "a?", "answer": "unknown"}]
    assert pred.answer == "" and pred.trajectory.parse_rate("answer_followup") == 0.0


def test_failing_lm_and_retriever_never_raise(make_retriever):
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = SelfAsk(make_retriever(error=RuntimeError("no index")), lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and pred.trajectory.errors
    assert "no index" in pred.trajectory.retrievals()[0].error

    broken = SelfAsk(make_retriever(), lm=Boom([]), demos=None)
    broken._run = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_empty_retrieval_is_recorded(make_retriever):
    lm = DummyLM([follow("a?"), {"answer": "A"}, final("A")])
    pred = SelfAsk(make_retriever(lambda q, k: []), lm=lm, demos=None)(question="q?")
    assert pred.answer == "A" and pred.trajectory.retrievals()[0].error == "empty retrieval"
    assert pred.trajectory.role_steps("answer_followup")[0].inputs["passages"] == "(no passages)"


@pytest.mark.parametrize(
    "options",
    [
        {"top_k": 0},
        {"max_follow_ups": 0},
        {"max_passage_chars": 5},
        {"demos": ["x"]},
        {"demos": {"x": []}},
        {"use_retrieval": 1},
        {"max_followups": 3},
    ],
)
def test_invalid_options_raise(options):
    with pytest.raises(ConfigError):
        SelfAsk(**options)


def test_auto_demos_cover_every_role():
    program = SelfAsk()
    assert {role: len(p.demos) for role, p in program.roles.items()} == {"ask": 3, "answer_followup": 3}
    asks = program.ask.demos
    assert [d.action for d in asks] == ["follow_up", "follow_up", "final_answer"]
    assert asks[0].history == "(none)" and asks[1].history.startswith("Follow up: ")
    assert all(set(d.inputs().keys()) == {"question", "history"} and d.text for d in asks)
    followups = program.answer_followup.demos
    assert all(set(d.inputs().keys()) == {"follow_up", "passages"} and d.answer for d in followups)
    assert all(d.answer in d.passages for d in followups)


def test_save_load_round_trip(tmp_path, retriever):
    program = SelfAsk(retriever, top_k=2, max_follow_ups=3, use_retrieval=False)
    program.save(tmp_path / "self_ask")
    loaded = SelfAsk.load(tmp_path / "self_ask", retriever=retriever)
    assert (loaded.top_k, loaded.max_follow_ups, loaded.use_retrieval) == (2, 3, False)
    for role, predictor in program.roles.items():
        assert [d.toDict() for d in loaded.roles[role].demos] == [d.toDict() for d in predictor.demos]
        assert set(loaded.roles[role].demos[0].inputs().keys()) == set(predictor.demos[0].inputs().keys())


def test_bootstrap_few_shot_compiles_self_ask(retriever):
    lm = SchemaLM("Varn")
    trainset = [
        dspy.Example(question=f"Where was person {i} born?", answer="Varn").with_inputs("question") for i in range(2)
    ]
    program = SelfAsk(retriever, lm=lm, demos=None)
    with dspy.context(lm=lm):
        optimizer = dspy.BootstrapFewShot(
            metric=lambda e, p, t=None: e.answer == p.answer, max_bootstrapped_demos=2, max_labeled_demos=0
        )
        compiled = program.compile(optimizer, trainset=trainset)
        assert compiled(question="Where was person 9 born?").answer == "Varn"
    assert set(compiled.roles) == {"ask", "answer_followup"}
    assert compiled.ask.demos and compiled.answer_followup.demos[0].answer == "Varn"
