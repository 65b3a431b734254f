"""STRIDE's state Ω on the shared plan graph: ready set, filling, failure log, the rendered plan views, to_dict, and the
causal rewrites STRIDE-FT reads back from a trajectory."""

from __future__ import annotations

import pytest

from rolecall.programs.core.plan import PlanGraph
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.stride.state import (
    BranchOutcome,
    Directive,
    StrideState,
    causal_rewrite_steps,
    format_facts,
    fresh_query,
)


def test_state_ready_filled_and_failures():
    state, dropped = StrideState.from_plan(["a?", "b?", "c [x from step 1] #2?", "d [x from step 9]?"])
    assert dropped == ["4->9"] and state.ready() == [1, 2, 4]
    state.resolve(1, "A", ["fa"])
    assert state.ready() == [2, 4] and state.filled(3) == "c A #2?"
    state.log_failure(2, "b?", "no facts", 1)
    state.log_failure(2, "b?", "repeated query", 2)
    assert state.failed_queries(2) == ["b?"]
    state.resolve(2, "B")
    assert state.ready() == [3, 4] and state.pending == [3, 4] and state.filled(3) == "c A B?"
    assert state.known_answers() == ["a? -> A", "b? -> B"] and state.all_facts() == ["fa"]
    assert state.last_solved() == 2
    with pytest.raises(ValueError):
        state.resolve(3, "unknown")
    assert state.to_dict()["failures"][1] == {
        "sub_question": 2,
        "query": "b?",
        "reason": "repeated query",
        "iteration": 2,
    }


def test_state_is_a_view_of_the_shared_plan_graph():
    state, _ = StrideState.from_plan(["Who directed X?", "Where was [person from step 1] born?"], ["s1", "s2"])
    assert isinstance(state.graph, PlanGraph) and state.plan is state.graph.steps
    state.resolve(1, " Ada Quell ", ["X was directed by Ada Quell."])
    assert state.solved is state.graph.answers and state.graph.answers == {1: "Ada Quell"}
    assert state.graph.ready() == state.ready() == [2] and state.get(2).depends_on == (1,)
    assert state.to_dict() == {
        "strategy": ["s1", "s2"],
        "plan": [
            {"id": 1, "text": "Who directed X?", "depends_on": []},
            {"id": 2, "text": "Where was [person from step 1] born?", "depends_on": [1]},
        ],
        "solved": {"1": "Ada Quell"},
        "pending": [2],
        "facts": {"1": ["X was directed by Ada Quell."]},
        "failures": [],
    }


def test_render_shows_the_concrete_plan_and_render_plan_the_whole_p_q():
    state, _ = StrideState.from_plan(
        ["Who directed X?", "Where was [person from step 1] born?"], ["Find the director."]
    )
    state.resolve(1, "Ada Quell")
    assert state.render() == "1. Who directed X? -> Ada Quell\n2. Where was Ada Quell born? -> pending"
    assert state.render_plan() == f"Strategy:\n1. Find the director.\nPlan:\n{state.render()}"
    no_strategy, _ = StrideState.from_plan(["a?"])
    assert no_strategy.render_plan() == no_strategy.render() == "1. a? -> pending"


def test_branch_outcome_and_directive():
    assert not BranchOutcome(sq_id=1).resolved and not BranchOutcome(sq_id=1, answer="unknown").resolved
    assert BranchOutcome(sq_id=1, answer="Varn").resolved
    assert not Directive(1, "retrieve", "q").is_rewrite and Directive(1, "retrieve", "q", attempt=1).is_rewrite
    assert not Directive(1, "answer", "q", attempt=2).is_rewrite


def test_fresh_query_and_format_facts():
    question = "In which city was the band Thuvex Hollows formed?"
    assert fresh_query(question, []) == question
    assert fresh_query(question, [question]) == "city band Thuvex Hollows formed"
    assert fresh_query(question, [question, "city band thuvex hollows formed"]) == "Thuvex Hollows"
    assert fresh_query("Ada", ["ada"]) is None
    assert format_facts([]) == "(no facts)" and format_facts(["a" * 50, "b" * 50], max_chars=60) == "- " + "a" * 50


def test_causal_rewrites_need_execution_a_retry_and_resolution():
    trajectory = Trajectory()
    metas = [
        {"executed": True, "attempt": 1, "resolved": True},
        {"executed": False, "attempt": 1, "resolved": True},
        {"executed": True, "attempt": 0, "resolved": True},
        {"executed": True, "attempt": 2, "resolved": False},
    ]
    for meta in metas:
        trajectory.add(Step(kind="role", role="supervisor", meta=meta))
    assert causal_rewrite_steps(trajectory) == [trajectory.steps[0]]
