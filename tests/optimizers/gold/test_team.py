"""The MultiAgent-OPD teams' gold path on hand-checked synthetic examples (seed-0 world, real BM25); no model: every
role is gold."""

from __future__ import annotations

import functools

import dspy
import pytest

from rolecall.data.types import Document, Example, SubStep, doc_id
from rolecall.optimizers.gold import gold_steps, gold_trajectories
from rolecall.optimizers.gold.team import lookup_steps, team_gold
from rolecall.programs.team import CascadedTeam, HierarchicalTeam
from rolecall.retrievers.bm25 import BM25
from rolecall.signatures.team import AnswerFromReports, DelegateOrAnswer, SearchOrReport
from rolecall.utils import SchemaLM

SIGNATURES = {"leader": DelegateOrAnswer, "searcher": SearchOrReport, "answerer": AnswerFromReports}


def example(world, example_id):
    return next(e for e in world.train if e.id == example_id)


def run(program, e, corpus):
    ((_, pred),) = gold_trajectories(program, [e], functools.partial(team_gold, corpus=corpus))
    return pred


def outputs(pred, role):
    return [s.outputs for s in pred.trajectory.role_steps(role)]


def assert_all_gold_and_parse_back(pred, lm):
    """Every role step is gold (the LM was never called) and its completion parses back to its outputs."""
    assert lm.calls == 0
    roles = pred.trajectory.role_steps()
    assert roles and gold_steps(pred.trajectory) == roles
    for step in roles:
        assert set(step.outputs) == set(SIGNATURES[step.role].output_fields)
        assert dspy.ChatAdapter().parse(SIGNATURES[step.role], step.completion) == step.outputs
    assert not [s for s in pred.trajectory.steps if s.kind == "event"]  # no fallback, limit or error


def test_the_leader_delegates_a_two_hop_chain_in_waves_and_answers_with_both_reports(world, bm25):
    # "Which country is the director of the film Hejorn Orbit from?": film/hejorn-orbit names the director Shigra
    # Sikarndal, person/shigra-sikarndal says she is from Kriagonia; BM25 ranks each first for its title.
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM("from the lm")
    pred = run(HierarchicalTeam(bm25, lm=lm), e, world.corpus)
    assert outputs(pred, "leader") == [
        {"action": "delegate", "selected": [], "subtasks": ["Who directed the film Hejorn Orbit?"]},
        {"action": "delegate", "selected": [], "subtasks": ["Which country is Shigra Sikarndal from?"]},
        {"action": "answer", "selected": [1, 2], "subtasks": []},
    ]
    assert outputs(pred, "searcher") == [
        {"action": "search", "content": "Hejorn Orbit"},
        {"action": "report", "content": "Shigra Sikarndal (from Hejorn Orbit)"},
        {"action": "search", "content": "Shigra Sikarndal"},
        {"action": "report", "content": "Kriagonia (from Shigra Sikarndal)"},
    ]
    last = pred.trajectory.role_steps("leader")[-1]
    assert last.inputs["reports"] == (
        "[1] Who directed the film Hejorn Orbit? -> Shigra Sikarndal (from Hejorn Orbit)\n"
        "[2] Which country is Shigra Sikarndal from? -> Kriagonia (from Shigra Sikarndal)"
    )
    assert last.completion == (
        "[[ ## action ## ]]\nanswer\n\n[[ ## selected ## ]]\n[1, 2]\n\n"
        "[[ ## subtasks ## ]]\n[]\n\n[[ ## completed ## ]]"
    )
    (answerer,) = pred.trajectory.role_steps("answerer")
    assert answerer.inputs["reports"] == last.inputs["reports"] and answerer.outputs == {"answer": "Kriagonia"}
    assert pred.answer == "Kriagonia" and pred.selected == [1, 2] and pred.rounds == 2
    assert_all_gold_and_parse_back(pred, lm)


def test_an_intersection_question_delegates_the_two_lookups_at_once_and_leaves_the_third_step_to_the_answerer(
    world, bm25
):
    # Step 3, "Which person is in both #1 and #2?", has the films of steps 1 and 2 as its passages: nothing to search.
    e = example(world, "synthetic-0-train-0001")
    assert e.type == "intersection" and lookup_steps(e) == [0, 1]
    lm = SchemaLM()
    pred = run(HierarchicalTeam(bm25, lm=lm), e, world.corpus)
    first, answer = outputs(pred, "leader")
    assert first["subtasks"] == [
        "Which actors appeared in the film Broken Threads of Draebus?",
        "Which actors appeared in the film The Crimson Stiachas?",
    ]
    assert answer == {"action": "answer", "selected": [1, 2], "subtasks": []}
    reports = [o["content"] for o in outputs(pred, "searcher") if o["action"] == "report"]
    assert reports == [
        "Stovas Thujelsk, Lasys Fanane and Haepa Liaraevmar (from Broken Threads of Draebus)",
        "Stovas Thujelsk, Fatelle Maemdal and Hiadia Krornane (from The Crimson Stiachas)",
    ]
    assert pred.answer == "Stovas Thujelsk"
    assert_all_gold_and_parse_back(pred, lm)


def test_the_cascaded_searcher_reports_once_one_search_showed_both_hops(world, bm25):
    # The search "Hejorn Orbit" shows the film and, third, its director's own passage: both hops are in the notes.
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM()
    pred = run(CascadedTeam(bm25, lm=lm), e, world.corpus)
    first, report = pred.trajectory.role_steps("searcher")
    assert first.inputs == {"subtask": e.question, "notes": "none yet"}
    assert first.outputs == {"action": "search", "content": "Hejorn Orbit"}
    assert "[3] Shigra Sikarndal | Shigra Sikarndal is a director from Kriagonia" in report.inputs["notes"]
    assert report.outputs == {"action": "report", "content": "Kriagonia (from Shigra Sikarndal)"}
    assert report.completion == (
        "[[ ## action ## ]]\nreport\n\n[[ ## content ## ]]\nKriagonia (from Shigra Sikarndal)\n\n[[ ## completed ## ]]"
    )
    assert pred.answer == "Kriagonia" and pred.report == "Kriagonia (from Shigra Sikarndal)"
    assert_all_gold_and_parse_back(pred, lm)


@pytest.mark.parametrize("team", [CascadedTeam, HierarchicalTeam])
def test_a_missed_title_search_retries_with_the_sub_question_then_the_passages_opening(world, bm25, team):
    # "Who is the spouse of Trabryn Fefelmar?": her name and the question both find three of the films she directed
    # (k = 3); "Trabryn Fefelmar is a director" finds her own passage, which says she is married to Paman Drochornov.
    e = example(world, "synthetic-0-train-0027")
    lm = SchemaLM()
    pred = run(team(bm25, lm=lm), e, world.corpus)
    assert [s.inputs["query"] for s in pred.trajectory.retrievals()] == [
        "Trabryn Fefelmar",
        "Who is the spouse of Trabryn Fefelmar?",
        "Trabryn Fefelmar is a director",
    ]
    assert pred.trajectory.retrievals()[-1].outputs["passage_ids"][0] == "person/trabryn-fefelmar"
    report = pred.trajectory.role_steps("searcher")[-1]
    assert report.outputs == {"action": "report", "content": "Paman Drochornov (from Trabryn Fefelmar)"}
    assert "Paman Drochornov" in report.inputs["notes"]  # the report's answer is in what the Searcher was shown
    assert pred.answer == "Paman Drochornov"
    assert_all_gold_and_parse_back(pred, lm)


def test_several_answer_candidates_give_one_gold_candidate_that_wins_the_vote(world, bm25):
    e = example(world, "synthetic-0-train-0002")
    lm = SchemaLM()
    program = HierarchicalTeam(bm25, lm=lm, answer_candidates=5)
    assert program.lm_kwargs["answerer"]["n"] == 5  # an LM call would draw five samples; the gold call draws none
    pred = run(program, e, world.corpus)
    (answerer,) = pred.trajectory.role_steps("answerer")
    assert answerer.meta["candidates"] == ["Kriagonia"] and answerer.meta["votes"] == {"kriagonia": 1}
    assert pred.answer == "Kriagonia" and pred.candidates == ["Kriagonia"]
    assert_all_gold_and_parse_back(pred, lm)


def test_a_wave_never_holds_more_subtasks_than_the_team_allows(world, bm25):
    # Four lookups: the two films' companies, then the companies' founding years; one Searcher per wave here.
    e = example(world, "synthetic-0-train-0006")
    lm = SchemaLM()
    pred = run(HierarchicalTeam(bm25, lm=lm, max_subtasks=1, max_steps=20), e, world.corpus)
    assert [o["subtasks"] for o in outputs(pred, "leader")] == [
        ["Which company produced the film Qufo Meridian?"],
        ["Which company produced the film Yaehound Hollow?"],
        ["In which year was the company Noter Pictures founded?"],
        ["In which year was the company Totom Pictures founded?"],
        [],
    ]
    assert outputs(pred, "leader")[-1]["selected"] == [1, 2, 3, 4] and pred.answer == "Qufo Meridian"
    assert_all_gold_and_parse_back(pred, lm)


def test_without_a_corpus_title_hash_ids_are_recognized_by_title():
    docs = [
        ("Varn", "Varn is a city in the country of Ostria, on the river Melk."),
        ("Ostria", "Ostria is a country whose capital is Dellin. Its official language is Ostrian."),
        ("Morrow Books", "Morrow Books is a publisher founded by Ada Quell in 1950."),
        ("Kelpie Road", "Kelpie Road is a band formed in 1990 by Ivo Brask and Nell Ardo."),
    ]
    corpus = [Document(doc_id(t, x), t, x) for t, x in docs]
    varn, ostria = corpus[0].id, corpus[1].id
    e = Example(
        "e",
        "What is the official language of the country in which the city of Varn lies?",
        ["Ostrian"],
        decomposition=[
            SubStep("In which country is the city of Varn located?", "Ostria", [varn]),
            SubStep("What is the official language of #1?", "Ostrian", [ostria]),
        ],
    )
    lm = SchemaLM()
    pred = run(HierarchicalTeam(BM25(corpus), lm=lm, top_k=1), e, None)
    assert [o["content"] for o in outputs(pred, "searcher")] == [
        "Varn",
        "Ostria (from Varn)",
        "Ostria",
        "Ostrian (from Ostria)",
    ]
    assert pred.answer == "Ostrian"
    assert_all_gold_and_parse_back(pred, lm)


def test_no_gold_means_the_lm_answers(world, bm25):
    e = example(world, "synthetic-0-train-0002")
    override = team_gold(e, corpus=world.corpus)
    program = HierarchicalTeam(bm25, lm=SchemaLM())
    assert override(program, "searcher", {"subtask": "Who is Ada Quell?", "notes": "none yet"}, None) is None
    assert override(program, "planner", {}, None) is None
    bare = Example("bare", e.question, e.answers)  # no decomposition: no role has a gold output
    for role in ("leader", "searcher", "answerer"):
        assert team_gold(bare)(program, role, {"question": e.question, "subtask": e.question}, None) is None
    lm = SchemaLM("unknown")
    pred = run(CascadedTeam(bm25, lm=lm), bare, world.corpus)
    assert lm.calls > 0 and gold_steps(pred.trajectory) == []


@pytest.mark.parametrize("team", [CascadedTeam, HierarchicalTeam])
def test_the_runner_keeps_each_examples_override_across_threads(world, bm25, team):
    examples = world.train[:8]  # comparison, intersection, compositional, single, inference, ... types
    lm = SchemaLM()
    runs = gold_trajectories(
        team(bm25, lm=lm, max_passage_chars=200),
        examples,
        functools.partial(team_gold, corpus=world.corpus),
        num_threads=4,
    )
    assert [e.id for e, _ in runs] == [e.id for e in examples]
    assert all(pred.answer == e.answer for e, pred in runs) and lm.calls == 0
    assert all(gold_steps(p.trajectory) == p.trajectory.role_steps() for _, p in runs)
