"""The bounded search loop: act, search, observe; the turn budget and its exhaustion event."""

from __future__ import annotations

import dspy

from rolecall.programs import Program, Trajectory
from rolecall.programs.core.search import SearchAction, SearchLoop


class Searcher(Program):
    ROLES = ()

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:  # pragma: no cover - not used
        return dspy.Prediction(answer="", trajectory=trajectory)


def test_searches_until_the_policy_answers(make_retriever):
    program, trajectory = Searcher(make_retriever()), Trajectory()
    script = iter([SearchAction("search", "first"), SearchAction("continue"), SearchAction("answer", "Varn")])
    notes = []
    loop = SearchLoop(
        program,
        trajectory,
        act=lambda lp: next(script),
        k=2,
        max_turns=5,
        observe=lambda lp, obs: notes.append(obs.query),
        meta={"sub_question": 1},
    ).run()
    assert loop.answer == "Varn" and loop.searches == 1 and loop.turn == 3 and not loop.exhausted
    (retrieval,) = trajectory.retrievals()
    assert retrieval.inputs == {"query": "first", "k": 2} and retrieval.meta == {"sub_question": 1, "turn": 0}
    assert notes == ["first"] and [p.id for p in loop.passages] == ["p0", "p1"]


def test_the_budget_ends_the_loop_with_a_recorded_event(make_retriever):
    program, trajectory = Searcher(make_retriever()), Trajectory()
    loop = SearchLoop(program, trajectory, act=lambda lp: SearchAction("search", f"q{lp.turn}"), k=1, max_turns=2)
    loop.run()
    assert loop.exhausted and loop.answer is None and loop.searches == 2
    event = trajectory.steps[-1]
    assert event.role == "budget_exhausted" and event.meta["max_turns"] == 2 and "2 turns" in event.error
    assert loop.step() is None  # a finished loop does nothing


def test_stepwise_driving_and_a_search_outside_the_policy(make_retriever):
    program, trajectory = Searcher(make_retriever()), Trajectory()
    loop = SearchLoop(program, trajectory, act=lambda lp: SearchAction("stop"), k=1, max_turns=3)
    loop.search("the question", source="question")  # no turn spent
    assert loop.turn == 0 and trajectory.steps[-1].meta["source"] == "question"
    assert loop.step().kind == "stop" and loop.done and loop.answer is None and not loop.exhausted
