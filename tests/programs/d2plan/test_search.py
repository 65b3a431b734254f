"""D2Plan's per-sub-question search on core's SearchLoop: the Purifier as the loop's observer, K searches and the
extra answering turn, recorded retrievals, fallback queries and the failure triggers."""

from __future__ import annotations

from dspy.utils.dummies import DummyLM

from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.d2plan.context import SubQuestion
from rolecall.programs.d2plan.program import D2Plan
from rolecall.programs.d2plan.search import SubQuestionSearch

IRRELEVANT = {"relevant": "no", "information": "passages about a band"}


def step(action: str, query: str = "none", answer: str = "unknown") -> dict:
    return {"action": action, "query": query, "answer": answer}


def run(retriever, script: list[dict], **options) -> tuple[SubQuestion, Trajectory]:
    program = D2Plan(retriever, lm=DummyLM(script), demos=None, **options)
    trajectory = Trajectory(question="Where was Ada Quell born?")
    sub = SubQuestion(index=2, planned="Where was #A_1 born?", text="Where was Ada Quell born?")
    search = SubQuestionSearch(program, trajectory, sub, question="Q?", context="1. Who? -> Ada Quell\n2. Where?")
    return search.run(), trajectory


def test_purified_searches_until_the_reasoner_answers(retriever):
    script = [
        step("search", "Ada"),
        IRRELEVANT,
        step("search", "Ada Quell"),
        {"relevant": "yes", "information": "Ada Quell was born in Varn."},
        step("answer", answer="Varn"),
    ]
    sub, trajectory = run(retriever, script)
    assert (sub.status, sub.answer, sub.searches, sub.relevant) == ("solved", "Varn", 2, [False, True])
    assert sub.notes == ["passages about a band", "Ada Quell was born in Varn."]
    assert [(s.meta["sub_question"], s.meta["turn"]) for s in trajectory.retrievals()] == [(2, 0), (2, 1)]
    purifier = trajectory.role_steps("purifier")
    assert [s.meta["search"] for s in purifier] == [1, 2]
    steps = trajectory.role_steps("reasoner_step")
    assert [s.meta["turn"] for s in steps] == [0, 1, 2]
    assert steps[2].inputs == {
        "question": "Q?",
        "context": "1. Who? -> Ada Quell\n2. Where?",
        "sub_question": "Where was Ada Quell born?",
        "notes": "[1] not relevant: passages about a band\n[2] relevant: Ada Quell was born in Varn.",
    }
    assert "budget_exhausted" not in [s.role for s in trajectory.steps]


def test_k_irrelevant_searches_fail_without_another_step(retriever):
    sub, trajectory = run(retriever, [step("search", "a"), IRRELEVANT, step("search", "b"), IRRELEVANT], max_searches=2)
    assert (sub.status, sub.failure, sub.searches) == ("failed", "failed_sub_question", 2)
    assert len(trajectory.role_steps("reasoner_step")) == 2
    failed = trajectory.steps[-1]
    assert failed.role == "sub_question_failed" and failed.error.endswith("after 2 searches (failed_sub_question)")


def test_relevant_evidence_gets_one_more_turn_then_an_unanswered_failure(retriever):
    script = [step("search", "a"), {"relevant": "yes", "information": "fact"}, step("search", "b")]
    sub, trajectory = run(retriever, script, max_searches=1)
    assert (sub.status, sub.failure, sub.searches) == ("failed", "unanswered_sub_question", 1)
    assert len(trajectory.role_steps("reasoner_step")) == 2 and len(trajectory.retrievals()) == 1


def test_a_search_without_a_query_falls_back_to_the_sub_question_then_its_names(retriever):
    script = [step("search"), IRRELEVANT, step("search", "unknown"), IRRELEVANT, step("answer", answer="Varn")]
    sub, trajectory = run(retriever, script)
    assert [q for q, _ in retriever.calls] == ["Where was Ada Quell born?", "Ada Quell"]
    assert [s.role for s in trajectory.steps if s.kind == "event"].count("malformed_output") == 2
    assert [s.meta["query"] for s in trajectory.steps if s.role == "query_fallback"] == [
        "Where was Ada Quell born?",
        "Ada Quell",
    ]
    assert sub.status == "solved"
