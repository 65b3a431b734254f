"""D2Plan's gold path on hand-checked synthetic examples (seed-0 world, real BM25); no model: every role is gold."""

from __future__ import annotations

import functools

import dspy

from rolecall.data.types import Example
from rolecall.optimizers.gold.d2plan import d2plan_gold, d2plan_gold_plan
from rolecall.optimizers.gold.runner import gold_steps, gold_trajectories
from rolecall.programs.d2plan.program import D2Plan
from rolecall.retrievers.base import Passage
from rolecall.signatures.d2plan import (
    Purify,
    ReasonerAnswer,
    ReasonerPlan,
    ReasonerRefine,
    ReasonerRevise,
    ReasonerStep,
)
from rolecall.utils import SchemaLM

SIGNATURES = {
    "reasoner_plan": ReasonerPlan,
    "reasoner_step": ReasonerStep,
    "reasoner_refine": ReasonerRefine,
    "reasoner_revise": ReasonerRevise,
    "reasoner_answer": ReasonerAnswer,
    "purifier": Purify,
}
HEJORN = "Which country is the director of the film Hejorn Orbit from?"


def example(world, example_id):
    return next(e for e in world.train if e.id == example_id)


def run(program, e, corpus):
    ((_, pred),) = gold_trajectories(program, [e], functools.partial(d2plan_gold, corpus=corpus))
    return pred


def assert_all_gold_and_parse_back(pred, lm, e):
    """Every role step is gold (the LM was never called), its completion parses back, the answer is gold."""
    assert lm.calls == 0
    roles = pred.trajectory.role_steps()
    assert roles and gold_steps(pred.trajectory) == roles
    for step in roles:
        assert set(step.outputs) == set(SIGNATURES[step.role].output_fields)
        assert dspy.ChatAdapter().parse(SIGNATURES[step.role], step.completion) == step.outputs
    assert pred.answer == e.answer


def calls(pred, role):
    return [s.outputs for s in pred.trajectory.role_steps(role)]


def test_a_two_hop_question_plans_searches_purifies_refines_and_answers_gold(world, bm25):
    # film/hejorn-orbit names the director Shigra Sikarndal, person/shigra-sikarndal says she is from Kriagonia; BM25
    # ranks each first for its sub-question, so each is answered after one search.
    e = example(world, "synthetic-0-train-0002")
    assert e.question == HEJORN and e.answers == ["Kriagonia"]
    lm = SchemaLM("from the lm")
    pred = run(D2Plan(bm25, lm=lm), e, world.corpus)
    assert calls(pred, "reasoner_plan") == [
        {"complexity": "multi-hop", "plan": ["Who directed the film Hejorn Orbit?", "Which country is #A_1 from?"]}
    ]
    assert calls(pred, "reasoner_step") == [
        {"action": "search", "query": "Who directed the film Hejorn Orbit?", "answer": "unknown"},
        {"action": "answer", "query": "none", "answer": "Shigra Sikarndal"},
        {"action": "search", "query": "Which country is Shigra Sikarndal from?", "answer": "unknown"},
        {"action": "answer", "query": "none", "answer": "Kriagonia"},
    ]
    assert calls(pred, "purifier") == [
        {"relevant": "yes", "information": "Hejorn Orbit is a 1999 western film directed by Shigra Sikarndal."},
        {"relevant": "yes", "information": "Shigra Sikarndal is a director from Kriagonia."},
    ]
    (refine,) = pred.trajectory.role_steps("reasoner_refine")
    assert refine.inputs["sub_question"] == "Which country is #A_1 from?"
    assert refine.outputs == {"refined": "Which country is Shigra Sikarndal from?"}
    assert "-> Shigra Sikarndal (Hejorn Orbit is a 1999 western film" in refine.inputs["context"]
    step = pred.trajectory.role_steps("reasoner_step")[1]
    assert step.inputs["notes"] == "[1] relevant: Hejorn Orbit is a 1999 western film directed by Shigra Sikarndal."
    (answer,) = pred.trajectory.role_steps("reasoner_answer")
    assert answer.completion == "[[ ## answer ## ]]\nKriagonia\n\n[[ ## completed ## ]]"
    assert pred.trajectory.role_steps("reasoner_revise") == []
    assert_all_gold_and_parse_back(pred, lm, e)
    assert pred.trajectory.role_steps("reasoner_plan")[0].messages[-1]["content"].count(e.question) == 1


def test_a_single_hop_question_is_not_decomposed_and_needs_no_answer_call(world, bm25):
    e = example(world, "synthetic-0-train-0003")  # "Who is the mother of Nebim Jaroskssen?"
    lm = SchemaLM()
    pred = run(D2Plan(bm25, lm=lm), e, world.corpus)
    assert calls(pred, "reasoner_plan") == [{"complexity": "single-hop", "plan": [e.question]}]
    assert [s["action"] for s in calls(pred, "reasoner_step")] == ["search", "answer"]
    assert calls(pred, "reasoner_step")[0]["query"] == e.question
    assert (
        calls(pred, "purifier")[0]["relevant"] == "yes"
        and "Morwen Shoutro" in calls(pred, "purifier")[0]["information"]
    )
    assert calls(pred, "reasoner_answer") == [] and calls(pred, "reasoner_refine") == []
    assert_all_gold_and_parse_back(pred, lm, e)


def test_a_gold_passage_cut_by_the_context_budget_is_searched_for_by_title_then_by_its_relation(world, bm25):
    # "Who is the spouse of Trabryn Fefelmar?": BM25 ranks four of her films above person/trabryn-fefelmar for the
    # sub-question and for her bare name, and the 1200-character budget shows four passages: two misses. Her name with
    # the words of her key sentence ("She is married to") ranks her own passage first.
    e = example(world, "synthetic-0-train-0027")
    lm = SchemaLM()
    pred = run(D2Plan(bm25, lm=lm), e, world.corpus)
    first = pred.trajectory.retrievals()[0]
    assert first.outputs["passage_ids"][4] == "person/trabryn-fefelmar"
    assert pred.trajectory.role_steps("purifier")[0].inputs["passages"].count("\n") == 3  # four shown
    assert calls(pred, "purifier") == [
        {"relevant": "no", "information": "passages about The Iron Gojin and The Wandering Kiavrern"},
        {"relevant": "no", "information": "passages about The Iron Gojin and The Wandering Kiavrern"},
        {"relevant": "yes", "information": "Trabryn Fefelmar: She is married to Paman Drochornov."},
    ]
    assert [(s["action"], s["query"]) for s in calls(pred, "reasoner_step")] == [
        ("search", "Who is the spouse of Trabryn Fefelmar?"),
        ("search", "Trabryn Fefelmar"),
        ("search", "Trabryn Fefelmar She is married to"),
        ("answer", "none"),
    ]
    assert pred.trajectory.role_steps("reasoner_step")[2].inputs["notes"] == (
        "[1] not relevant: passages about The Iron Gojin and The Wandering Kiavrern\n"
        "[2] not relevant: passages about The Iron Gojin and The Wandering Kiavrern"
    )
    assert_all_gold_and_parse_back(pred, lm, e)


class Outage:
    """BM25 whose first ``misses`` searches without ``spare`` in the query return only distractors."""

    def __init__(self, retriever, corpus, spare, misses):
        self.retriever, self.spare, self.misses = retriever, spare, misses
        self.noise = [Passage(d.id, d.title, d.text) for d in corpus if d.id.startswith("band/")][:5]

    def __call__(self, query, k):
        if self.spare not in query and self.misses > 0:
            self.misses -= 1
            return self.noise[:k]
        return self.retriever(query, k)


def test_a_failed_sub_question_gets_the_remaining_gold_plan_as_its_revision(world, bm25):
    # Sub-question 1 is answered; the three searches of sub-question 2 find only bands, so it fails and the Reasoner
    # revises: the rest of the gold plan, whose #A_1 still points at position 1. Position 2 runs again (refined again)
    # and the index is back.
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM()
    pred = run(D2Plan(Outage(bm25, world.corpus, "Hejorn", 3), lm=lm), e, world.corpus)
    queries = [r.inputs["query"] for r in pred.trajectory.retrievals()]
    assert queries == [
        "Who directed the film Hejorn Orbit?",
        "Which country is Shigra Sikarndal from?",
        "Shigra Sikarndal",
        "Shigra Sikarndal is a director from",
        "Which country is Shigra Sikarndal from?",
    ]
    assert [p["relevant"] for p in calls(pred, "purifier")] == ["yes", "no", "no", "no", "yes"]
    (revise,) = pred.trajectory.role_steps("reasoner_revise")
    assert revise.inputs["failed"] == "Which country is Shigra Sikarndal from?"
    assert revise.inputs["failure"].startswith("3 searches found nothing relevant, only passages about")
    assert revise.outputs == {"plan": ["Which country is #A_1 from?"]}
    assert calls(pred, "reasoner_refine") == [{"refined": "Which country is Shigra Sikarndal from?"}] * 2
    assert calls(pred, "reasoner_step")[-1] == {"action": "answer", "query": "none", "answer": "Kriagonia"}
    assert_all_gold_and_parse_back(pred, lm, e)


def test_a_failure_at_the_first_position_revises_to_the_whole_gold_plan(world, bm25):
    e = example(world, "synthetic-0-train-0002")
    pred = run(D2Plan(Outage(bm25, world.corpus, "no such word", 3), lm=SchemaLM()), e, world.corpus)
    assert calls(pred, "reasoner_revise") == [{"plan": d2plan_gold_plan(e)}]
    assert calls(pred, "reasoner_step")[3]["query"] == "Who directed the film Hejorn Orbit?"  # an empty notebook again
    assert pred.answer == "Kriagonia"


def test_without_the_purifier_the_step_reads_the_raw_passages_it_was_shown(world, bm25):
    e = example(world, "synthetic-0-train-0027")
    lm = SchemaLM()
    pred = run(D2Plan(bm25, lm=lm, use_purifier=False), e, world.corpus)
    assert calls(pred, "purifier") == []
    steps = pred.trajectory.role_steps("reasoner_step")
    assert [s.outputs["action"] for s in steps] == ["search", "search", "search", "answer"]
    assert "Search 3:\n[1] Trabryn Fefelmar | Trabryn Fefelmar is a director" in steps[3].inputs["notes"]
    assert_all_gold_and_parse_back(pred, lm, e)


def test_a_gold_passage_cut_before_its_answer_is_not_relevant(world, bm25):
    # With 60 characters a passage, "Hejorn Orbit is a 1999 western film directed by Shigra..." hides the director.
    e = example(world, "synthetic-0-train-0002")
    pred = run(D2Plan(bm25, lm=SchemaLM(), max_passage_chars=60), e, world.corpus)
    purified = pred.trajectory.role_steps("purifier")
    assert purified[0].inputs["passages"].startswith("[1] Hejorn Orbit | Hejorn Orbit is a 1999 western film")
    assert {s.outputs["relevant"] for s in purified} == {"no"}
    assert "Shigra Sikarndal" not in [s["answer"] for s in calls(pred, "reasoner_step")]


def test_without_a_corpus_the_title_comes_from_the_retrievals(world, bm25):
    e = example(world, "synthetic-0-train-0027")
    pred = run(D2Plan(bm25, lm=SchemaLM()), e, None)
    # person/trabryn-fefelmar was retrieved (fifth) before the second query: its title is known, its text is not
    assert [s["query"] for s in calls(pred, "reasoner_step")][:3] == [
        e.question,
        "Trabryn Fefelmar",
        "Trabryn Fefelmar",
    ]


def test_an_example_without_a_decomposition_is_left_to_the_lm(world, bm25):
    e = Example("x", HEJORN, ["Kriagonia"])
    lm = SchemaLM()
    pred = run(D2Plan(bm25, lm=lm), e, world.corpus)
    assert lm.calls > 0 and gold_steps(pred.trajectory) == []


def test_every_question_type_ends_with_the_gold_answer_across_threads(world, bm25):
    examples = world.train[:15]
    assert {e.type for e in examples} >= {"comparison", "intersection", "bridge_comparison", "yes_no", "single"}
    lm = SchemaLM()
    runs = gold_trajectories(
        D2Plan(bm25, lm=lm), examples, functools.partial(d2plan_gold, corpus=world.corpus), num_threads=3
    )
    assert [e.id for e, _ in runs] == [e.id for e in examples]
    for e, pred in runs:
        assert_all_gold_and_parse_back(pred, lm, e)
        assert not [s for s in pred.trajectory.steps if s.kind == "event" and s.error]


def test_the_gold_plan_is_written_as_the_demos_write_it(world):
    e = example(world, "synthetic-0-train-0006")
    assert d2plan_gold_plan(e) == [
        "Which company produced the film Qufo Meridian?",
        "Which company produced the film Yaehound Hollow?",
        "In which year was the company #A_1 founded?",
        "In which year was the company #A_2 founded?",
    ]
    assert d2plan_gold_plan(example(world, "synthetic-0-train-0003")) == ["Who is the mother of Nebim Jaroskssen?"]
