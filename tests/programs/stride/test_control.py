"""STRIDE's control rules for one ready sub-question, without an LM: the Supervisor's query cleaned and filled, and a
failed directive's entry of F recorded in its branch."""

from __future__ import annotations

from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.stride.control import MAX_QUERY_CHARS, clean_query, record_failure
from rolecall.programs.stride.state import BranchOutcome, Directive, Failure, StrideState


def _state() -> StrideState:
    state, _ = StrideState.from_plan(["Who directed Film X?", "Where was [person from step 1] born?"])
    state.resolve(1, "Ada Quell")
    return state


def test_clean_query_fills_solved_references_and_cuts_long_queries():
    branch = Trajectory()
    assert clean_query("[person from step 1] birthplace", _state(), 2, [], branch, 1) == "Ada Quell birthplace"
    assert len(clean_query("word " * 100, _state(), 2, [], branch, 1)) <= MAX_QUERY_CHARS
    assert not branch.steps


def test_clean_query_falls_back_to_a_query_not_failed_yet():
    branch = Trajectory()
    state = _state()
    assert clean_query("", state, 2, [], branch, 3) == "Where was Ada Quell born?"
    assert clean_query("#2 birthplace", state, 2, ["Where was Ada Quell born?"], branch, 3) == "Ada Quell born"
    assert [(s.role, s.meta["reason"], s.meta["iteration"]) for s in branch.steps] == [
        ("query_fallback", "empty query", 3),
        ("query_fallback", "unresolved placeholder", 3),
    ]


def test_record_failure_adds_to_the_outcome_and_the_branch():
    branch = Trajectory()
    out = BranchOutcome(sq_id=2, directive=Directive(2, "retrieve", "Ada birthplace"), failure="no facts")
    failure = record_failure(out, 4, branch)
    assert failure == Failure(2, "Ada birthplace", "no facts", 4) and out.failures == [failure]
    (event,) = branch.steps
    assert event.role == "failure" and event.meta == {
        "sub_question": 2,
        "query": "Ada birthplace",
        "reason": "no facts",
        "iteration": 4,
    }
    assert event.error == "sub-question 2: no facts for query 'Ada birthplace'"
