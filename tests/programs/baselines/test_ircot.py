"""IRCoT with DummyLM: sentence-by-sentence retrieval, the answer cue, the step budget, the passage collection, the
reader and interleave flags, malformed outputs, demos, save / load and BootstrapFewShot."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs.baselines.chains import has_answer_cue
from rolecall.programs.baselines.ircot import IRCoT
from rolecall.retrievers.base import Passage
from rolecall.utils import SchemaLM

GARBAGE = {"nonsense": "x"}  # unparseable: ChatAdapter fails, then DSPy's JSON fallback consumes a second answer


def say(sentence: str) -> dict:
    return {"next_sentence": sentence}


def events(pred) -> list[str]:
    return [s.role for s in pred.trajectory.steps if s.kind == "event"]


def test_each_sentence_is_the_next_query_until_the_answer_cue(retriever):
    lm = DummyLM(
        [
            say("Ada Quell directed Film X."),
            say("Ada Quell was born in Varn. So the answer is Varn."),
            {"answer": "Varn"},
        ]
    )
    program = IRCoT(retriever, lm=lm, demos=None, top_k=2)
    pred = program(question="Where was the director of Film X born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [("Where was the director of Film X born?", 2), ("Ada Quell directed Film X.", 2)]
    assert [s.role for s in pred.trajectory.steps] == ["retrieve", "reason", "retrieve", "reason", "answer"]
    first, second = pred.trajectory.role_steps("reason")
    assert first.inputs["reasoning"] == "(none)" and second.inputs["reasoning"] == "Ada Quell directed Film X."
    assert (first.meta["step"], first.meta["query"]) == (1, "Where was the director of Film X born?")
    assert (second.meta["step"], second.meta["query"]) == (2, "Ada Quell directed Film X.")
    assert [s.meta["query_source"] for s in pred.trajectory.retrievals()] == ["question", "reasoning"]
    answer = pred.trajectory.role_steps("answer")[0]
    assert (
        answer.inputs["reasoning"]
        == pred.reasoning
        == "Ada Quell directed Film X. Ada Quell was born in Varn. So the answer is Varn."
    )
    assert answer.meta == {"step": 3, "concluded": True}
    assert events(pred) == []


def test_only_the_first_sentence_of_a_generation_is_kept(retriever):
    lm = DummyLM(
        [
            say("Ada Quell directed Film X. She was born in 1900. She studied at Y."),
            say("Ada Quell was born in Varn. So the answer is Varn. Then more text."),
            {"answer": "Varn"},
        ]
    )
    pred = IRCoT(retriever, lm=lm, demos=None)(question="q?")
    assert retriever.calls[1][0] == "Ada Quell directed Film X."
    assert pred.reasoning == "Ada Quell directed Film X. Ada Quell was born in Varn. So the answer is Varn."
    assert pred.trajectory.role_steps("reason")[0].outputs["next_sentence"].endswith("studied at Y.")


def test_step_budget_stops_the_chain_and_the_reader_still_answers(retriever):
    lm = DummyLM([say("Fact one."), say("Fact two."), {"answer": "Varn"}])
    pred = IRCoT(retriever, lm=lm, demos=None, max_steps=2)(question="q?")
    assert pred.answer == "Varn"
    assert len(pred.trajectory.role_steps("reason")) == 2
    assert [q for q, _ in retriever.calls] == ["q?", "Fact one."]  # no retrieval after the last allowed sentence
    (budget,) = [s for s in pred.trajectory.steps if s.role == "budget_exhausted"]
    assert budget.error and budget.meta == {"turns": 2, "max_turns": 2}  # the SearchLoop's budget event
    assert pred.trajectory.role_steps("answer")[0].meta["concluded"] is False


def test_repeated_sentence_stops_the_chain(retriever):
    lm = DummyLM([say("Ada was born in Varn."), say("Ada was born in Varn."), {"answer": "Varn"}])
    pred = IRCoT(retriever, lm=lm, demos=None)(question="q?")
    assert events(pred) == ["repeated_sentence"] and pred.reasoning == "Ada was born in Varn."
    assert pred.answer == "Varn" and len(retriever.calls) == 2


def test_passages_are_collected_newest_first_and_capped(make_retriever):
    def fn(query, k):
        tag = "q" if query == "q?" else "s"
        return [Passage(f"{tag}{i}", f"{tag.upper()}{i}", f"text {tag}{i}") for i in range(k)]

    retriever = make_retriever(fn)
    lm = DummyLM([say("First fact."), say("So the answer is A."), {"answer": "A"}])
    pred = IRCoT(retriever, lm=lm, demos=None, top_k=2, max_passages=3)(question="q?")
    shown = pred.trajectory.role_steps("reason")[1].inputs["passages"]
    assert shown.splitlines() == ["[1] S0 | text s0", "[2] S1 | text s1", "[3] Q0 | text q0"]
    assert pred.trajectory.role_steps("answer")[0].inputs["passages"] == shown


def test_reader_false_reads_the_answer_after_the_cue(retriever):
    program = IRCoT(
        retriever, lm=DummyLM([say("Ada was born in Varn, so the answer is: Varn.")]), demos=None, reader=False
    )
    assert list(program.roles) == ["reason"]
    pred = program(question="q?")
    assert pred.answer == "Varn" and not pred.trajectory.role_steps("answer")

    pred = IRCoT(retriever, lm=DummyLM([say("One."), say("Two.")]), demos=None, reader=False, max_steps=2)(
        question="q?"
    )
    assert pred.answer == "" and events(pred) == ["budget_exhausted", "no_answer"]


def test_interleave_false_retrieves_once(retriever):
    lm = DummyLM([say("Fact one."), say("So the answer is B."), {"answer": "B"}])
    pred = IRCoT(retriever, lm=lm, demos=None, interleave=False)(question="q?")
    assert pred.answer == "B" and retriever.calls == [("q?", 4)]
    assert pred.trajectory.role_steps("reason")[1].meta["query"] == "q?"


def test_failed_reader_falls_back_to_the_chains_answer(retriever):
    lm = DummyLM([say("So the answer is Varn."), GARBAGE, GARBAGE])
    pred = IRCoT(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == "Varn"
    assert pred.trajectory.role_steps("answer")[0].error.startswith("parse error")
    assert events(pred) == ["fallback"]


def test_malformed_reason_is_recorded_and_the_reader_answers(retriever):
    lm = DummyLM([GARBAGE, GARBAGE, {"answer": "Varn"}])
    pred = IRCoT(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == "Varn" and pred.trajectory.parse_rate("reason") == 0.0
    (fallback,) = [s for s in pred.trajectory.steps if s.kind == "event"]
    assert fallback.meta == {"step": 1, "reason": "reason call failed"}
    assert pred.trajectory.role_steps("answer")[0].inputs["reasoning"] == "(none)"


def test_failing_lm_and_retriever_never_raise(make_retriever):
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = IRCoT(make_retriever(error=RuntimeError("no index")), lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and len(pred.trajectory.errors) == 3  # retrieval, reason, answer
    assert "no index" in pred.trajectory.retrievals()[0].error

    broken = IRCoT(make_retriever(), lm=Boom([]), demos=None)
    broken._run = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_empty_retrieval_is_recorded(make_retriever):
    lm = DummyLM([say("So the answer is A."), {"answer": "A"}])
    pred = IRCoT(make_retriever(lambda q, k: []), lm=lm, demos=None)(question="q?")
    assert pred.trajectory.retrievals()[0].error == "empty retrieval"
    assert pred.trajectory.role_steps("reason")[0].inputs["passages"] == "(no passages)"


@pytest.mark.parametrize(
    "options",
    [
        {"top_k": 0},
        {"max_steps": 0},
        {"max_passages": 0},
        {"max_passage_chars": 10},
        {"demos": "many"},
        {"interleave": "no"},
        {"no_such_option": 1},
    ],
)
def test_invalid_options_raise(options):
    with pytest.raises(ConfigError):
        IRCoT(**options)


def test_auto_demos_cover_every_role():
    program = IRCoT()
    assert {role: len(p.demos) for role, p in program.roles.items()} == {"reason": 3, "answer": 3}
    reason = program.reason.demos
    assert all(set(d.inputs().keys()) == {"question", "passages", "reasoning"} and d.next_sentence for d in reason)
    assert [has_answer_cue(d.next_sentence) for d in reason] == [False, True, True]
    assert reason[0].reasoning == "(none)" and reason[1].reasoning != "(none)"
    assert all(len(d.passages) < 900 for d in reason)
    assert all(d.answer and d.reasoning for d in program.answer.demos)
    assert list(IRCoT(reader=False).roles) == ["reason"]  # the answer demos are dropped with the role
    custom = {"reason": [dspy.Example(question="q", passages="p", reasoning="(none)", next_sentence="s")]}
    assert len(IRCoT(demos=custom).reason.demos) == 1 and IRCoT(demos=custom).answer.demos == []
    with pytest.raises(ConfigError):
        IRCoT(demos={"plan": []})


def test_save_load_round_trip(tmp_path, retriever):
    program = IRCoT(retriever, top_k=2, max_steps=3, max_passages=6, interleave=False)
    program.save(tmp_path / "ircot")
    loaded = IRCoT.load(tmp_path / "ircot", retriever=retriever)
    assert (loaded.top_k, loaded.max_steps, loaded.max_passages, loaded.interleave) == (2, 3, 6, False)
    assert loaded.lm_kwargs == program.lm_kwargs and loaded.retriever is retriever
    for role, predictor in program.roles.items():
        assert [d.toDict() for d in loaded.roles[role].demos] == [d.toDict() for d in predictor.demos]
        assert loaded.roles[role].demos[0].inputs().keys() == predictor.demos[0].inputs().keys()
    assert list(IRCoT.load(_saved(tmp_path, IRCoT(reader=False)), retriever=retriever).roles) == ["reason"]


def _saved(tmp_path, program):
    path = tmp_path / "other"
    program.save(path)
    return path


def test_bootstrap_few_shot_compiles_ircot(retriever):
    lm = SchemaLM("Varn")
    trainset = [
        dspy.Example(question=f"Where was person {i} born?", answer="Varn").with_inputs("question") for i in range(2)
    ]
    program = IRCoT(retriever, lm=lm, demos=None)
    with dspy.context(lm=lm):
        optimizer = dspy.BootstrapFewShot(
            metric=lambda e, p, t=None: e.answer == p.answer, max_bootstrapped_demos=2, max_labeled_demos=0
        )
        compiled = program.compile(optimizer, trainset=trainset)
        assert compiled(question="Where was person 9 born?").answer == "Varn"
    assert set(compiled.roles) == {"reason", "answer"}
    assert len(compiled.reason.demos) == 2 and compiled.answer.demos[0].answer == "Varn"
