"""The Search-R1 agent's gold path on hand-checked synthetic examples (seed-0 world, real BM25); no model: every turn
is gold, except where the builder leaves a call to the LM."""

from __future__ import annotations

import functools
from dataclasses import replace

import dspy

from rolecall.data.types import Document, Example
from rolecall.optimizers.gold import search_r1_gold
from rolecall.optimizers.gold.runner import gold_steps, gold_trajectories
from rolecall.optimizers.gold.search_r1 import relation_words, shown_passages
from rolecall.optimizers.sft import GOLD_BUILDERS
from rolecall.programs.baselines.agent_demos import search_r1_demos
from rolecall.programs.baselines.search_r1 import SearchR1Agent
from rolecall.programs.baselines.search_r1_actions import FORCE_ANSWER_NOTE
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.opera.program import OPERA
from rolecall.signatures.baselines import SearchR1Turn
from rolecall.utils import SchemaLM

AMBER = "In which country is the headquarters city of the company that produced the film The Amber Thiatrath located?"
AMBER_QUERIES = [
    "Which company produced the film The Amber Thiatrath?",
    "In which city is the company Totom Pictures headquartered?",
    "In which country is the city of Jegay located?",
]


def example(world, example_id):
    return next(e for e in world.train if e.id == example_id)


def run(program, e, corpus):
    ((_, pred),) = gold_trajectories(program, [e], functools.partial(search_r1_gold, corpus=corpus))
    return pred


def turns(pred):
    return [s.outputs for s in pred.trajectory.role_steps("agent")]


def assert_all_gold_valid_and_parse_back(pred, lm, e):
    """Every agent turn is gold (the LM was never called), a valid action, parses back; the answer is gold."""
    assert lm.calls == 0
    steps = pred.trajectory.role_steps("agent")
    assert steps and gold_steps(pred.trajectory) == steps
    for step in steps:
        assert step.meta["valid_action"] is True and step.meta["format_error"] is None
        assert dspy.ChatAdapter().parse(SearchR1Turn, step.completion) == step.outputs
    assert pred.answer == e.answer and pred.format_valid


def test_the_builder_is_registered_for_sft():
    assert GOLD_BUILDERS[SearchR1Agent] is search_r1_gold


def test_a_three_hop_question_searches_each_filled_sub_question_in_order_then_answers(world, bm25):
    # The Amber Thiatrath was produced by Totom Pictures, headquartered in Jegay, a city of Gatesh; BM25 ranks each
    # hop's gold passage first for its filled sub-question (and not for the earlier ones), so one search per hop.
    e = example(world, "synthetic-0-train-0049")
    assert e.question == AMBER and e.answers == ["Gatesh"]
    lm = SchemaLM("from the lm")
    pred = run(SearchR1Agent(bm25, lm=lm), e, world.corpus)
    assert_all_gold_valid_and_parse_back(pred, lm, e)
    assert turns(pred) == [
        {"reasoning": f"First find: {AMBER_QUERIES[0]}", "action": f"<search>{AMBER_QUERIES[0]}</search>"},
        {
            "reasoning": f"Found Totom Pictures. Now find: {AMBER_QUERIES[1]}",
            "action": f"<search>{AMBER_QUERIES[1]}</search>",
        },
        {"reasoning": f"Found Jegay. Now find: {AMBER_QUERIES[2]}", "action": f"<search>{AMBER_QUERIES[2]}</search>"},
        {"reasoning": "Found Gatesh. Done.", "action": "<answer>Gatesh</answer>"},
    ]
    assert [r.inputs["query"] for r in pred.trajectory.retrievals()] == AMBER_QUERIES
    assert [s.meta["action"] for s in pred.trajectory.role_steps("agent")] == ["search"] * 3 + ["answer"]
    # the final turn is exactly the demos' final move for this example
    (demo,) = search_r1_demos([e], world.corpus, n=1)["agent"]
    assert turns(pred)[-1] == {"reasoning": demo.reasoning, "action": demo.action}
    last = pred.trajectory.role_steps("agent")[-1]
    assert set(shown_passages(last.inputs["interaction"], pred.trajectory.retrievals())) >= {
        "film/the-amber-thiatrath",
        "company/totom-pictures",
        "city/jegay",
    }


def test_a_step_shown_by_an_earlier_search_is_not_searched_again(world, bm25):
    # "Who directed the film Hejorn Orbit?" shows both film/hejorn-orbit and person/shigra-sikarndal (she is from
    # Kriagonia), so the second hop is already covered and the agent answers after one search.
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM()
    pred = run(SearchR1Agent(bm25, lm=lm), e, world.corpus)
    assert_all_gold_valid_and_parse_back(pred, lm, e)
    assert [r.inputs["query"] for r in pred.trajectory.retrievals()] == ["Who directed the film Hejorn Orbit?"]
    assert turns(pred)[-1] == {"reasoning": "Found Kriagonia. Done.", "action": "<answer>Kriagonia</answer>"}


def test_a_missed_search_falls_back_to_the_title_then_the_title_with_the_relation(world, bm25):
    # Trabryn Fefelmar directed three films whose passages name her twice each, so BM25 ranks them above her own
    # passage for the sub-question and for her bare name; her passage words the relation "She is married to".
    e = example(world, "synthetic-0-train-0027")
    lm = SchemaLM()
    pred = run(SearchR1Agent(bm25, lm=lm), e, world.corpus)
    assert_all_gold_valid_and_parse_back(pred, lm, e)
    queries = ["Who is the spouse of Trabryn Fefelmar?", "Trabryn Fefelmar", "Trabryn Fefelmar She is married to"]
    assert [r.inputs["query"] for r in pred.trajectory.retrievals()] == queries
    assert [t["reasoning"] for t in turns(pred)[1:]] == [
        "Not found yet. Now find: Trabryn Fefelmar",
        "Not found yet. Now find: Trabryn Fefelmar She is married to",
        "Found Paman Drochornov. Done.",
    ]
    assert "person/trabryn-fefelmar" not in pred.trajectory.retrievals()[1].outputs["passage_ids"]
    assert "person/trabryn-fefelmar" in pred.trajectory.retrievals()[2].outputs["passage_ids"]


def test_without_a_corpus_the_title_comes_from_the_id_and_all_misses_move_on_to_the_answer(world, bm25):
    # No corpus, and a gold id the retriever never returns: the title is the id's title part ("Trabryn Fefelmar"),
    # there is no relation query; with every gold query run the agent moves on (here: to the answer).
    e = example(world, "synthetic-0-train-0027")
    (step,) = e.decomposition
    e = Example(e.id, e.question, e.answers, decomposition=[replace(step, supporting_ids=["Trabryn Fefelmar::0"])])
    lm = SchemaLM()
    pred = run(SearchR1Agent(bm25, lm=lm), e, None)
    assert_all_gold_valid_and_parse_back(pred, lm, e)
    assert [r.inputs["query"] for r in pred.trajectory.retrievals()] == [
        "Who is the spouse of Trabryn Fefelmar?",
        "Trabryn Fefelmar",
    ]


def test_the_forced_turn_gets_the_gold_answer(world, bm25):
    e = example(world, "synthetic-0-train-0049")
    lm = SchemaLM()
    pred = run(SearchR1Agent(bm25, lm=lm, max_turns=1), e, world.corpus)
    assert_all_gold_valid_and_parse_back(pred, lm, e)
    first, forced = pred.trajectory.role_steps("agent")
    assert first.meta["action"] == "search" and forced.meta["forced"] is True
    assert forced.inputs["interaction"].endswith(FORCE_ANSWER_NOTE)
    assert forced.outputs == {"reasoning": "Found Gatesh. Done.", "action": "<answer>Gatesh</answer>"}


def test_no_decomposition_other_programs_and_roles_are_left_to_the_lm(world, bm25):
    e = example(world, "synthetic-0-train-0049")
    override = search_r1_gold(e, corpus=world.corpus)
    assert override(OPERA(bm25, lm=SchemaLM()), "agent", {}, Trajectory()) is None
    assert override(SearchR1Agent(bm25, lm=SchemaLM()), "answer", {}, Trajectory()) is None
    lm = SchemaLM("from the lm")
    bare = Example("x", e.question, e.answers)  # no decomposition
    pred = run(SearchR1Agent(bm25, lm=lm, max_turns=1), bare, world.corpus)
    assert lm.calls >= 1 and gold_steps(pred.trajectory) == []
    assert search_r1_gold(bare)(SearchR1Agent(bm25, lm=lm), "agent", {"interaction": ""}, Trajectory()) is None


def test_relation_words_drop_the_title_and_the_answer():
    doc = Document("p", "Varn", "Varn is a city. It is the capital of Ostria. It has a river.")
    assert relation_words(doc, "Ostria") == ["It", "is", "the", "capital", "of"]
    assert relation_words(doc, "Nowhere") == ["is", "a", "city"]  # no sentence holds it: the first


def test_nearly_every_gold_path_of_200_train_questions_ends_valid_with_the_gold_answer(world, bm25):
    # Measured on the seed-0 world: 200/200 end with the gold answer and every turn valid and gold; 196/200 show a
    # gold passage of every step before answering (the other 4 are 3- and 4-hop questions whose 4-turn budget runs
    # out after a miss, so the forced turn answers).
    lm = SchemaLM()
    runs = gold_trajectories(
        SearchR1Agent(bm25, lm=lm), world.train[:200], functools.partial(search_r1_gold, corpus=world.corpus)
    )
    good = covered = 0
    for e, pred in runs:
        steps = pred.trajectory.role_steps("agent")
        good += pred.answer == e.answer and all(s.meta.get("gold") and s.meta["valid_action"] for s in steps)
        shown = shown_passages(steps[-1].inputs["interaction"], pred.trajectory.retrievals())
        covered += all(not s.supporting_ids or set(s.supporting_ids) & set(shown) for s in e.decomposition or [])
    assert lm.calls == 0
    assert good / len(runs) >= 0.95 and covered / len(runs) >= 0.95
