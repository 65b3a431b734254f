"""STRIDE's control layer for one ready sub-question: the Supervisor's directive (α_i, z_i) after the program's rules,
and the failure it leaves in F (SIGIR 2026, Sec. 3.2.2).

The rules the paper states as scheduling principles:

- ``z_i ∉ F(c_i)``: a query that already failed for the sub-question is logged as a ``repeated query`` failure and
  replaced by a fresh one (:func:`~rolecall.programs.stride.state.fresh_query`); with none left the directive is
  rejected and the sub-question waits for the next iteration.
- ``answer`` reasons over facts already gathered: with nothing solved and no facts it becomes a search.
- An unreadable action becomes ``retrieve`` (``rewrite`` after a failure); an empty query, or one naming a step not
  solved yet, becomes the first of the sub-question and its reformulations that has not failed.

These functions record into a branch trajectory and only read Ω; the program merges the outcome after the join.
"""

from __future__ import annotations

from dataclasses import asdict

from rolecall.programs.core.plan import fill_references
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.stride.parse import read_action
from rolecall.programs.stride.state import BranchOutcome, Directive, Failure, StrideState, fresh_query, normalize_query
from rolecall.signatures.types import is_null_answer

__all__ = ["MAX_QUERY_CHARS", "supervise", "clean_query", "record_failure"]

MAX_QUERY_CHARS = 200
"""Longest search query sent to the retriever (a small model sometimes writes a paragraph)."""


def supervise(
    program: Program,
    question: str,
    state: StrideState,
    sq_id: int,
    iteration: int,
    branch: Trajectory,
    out: BranchOutcome,
) -> Directive | None:
    """The Supervisor's directive for ``sq_id`` after the rules, or None when it must not run this iteration.

    A repeated failed query goes to ``out.failures``; the Supervisor's step to ``out.supervisor_step``, its meta
    holding the proposed and the executed action and query.
    """
    filled, failed = state.filled(sq_id), state.failed_queries(sq_id)
    attempt = state.attempts.get(sq_id, 0)
    pred = program.call_role(
        "supervisor",
        branch,
        question=question,
        progress=state.render(),
        sub_question=filled,
        failed_queries="; ".join(failed) or "none",
    )
    out.supervisor_step = step = branch.steps[-1]
    proposed_action = " ".join(str(pred.get("action") or "").split()) if pred is not None else ""
    proposed = " ".join(str(pred.get("query") or "").split()) if pred is not None else ""
    step.meta.update(sub_question=sq_id, iteration=iteration, proposed_action=proposed_action)
    step.meta.update(proposed_query=proposed, attempt=attempt, executed=False, resolved=False)
    action = read_action(proposed_action)
    if action is None:
        action = "rewrite" if failed else "retrieve"
        branch.event("supervisor_fallback", sub_question=sq_id, iteration=iteration, action=action)
    if action == "answer" and not state.solved and not state.all_facts():
        action = "rewrite" if failed else "retrieve"
        branch.event("answer_overridden", sub_question=sq_id, iteration=iteration, reason="nothing known yet")
    query = clean_query(proposed, state, sq_id, failed, branch, iteration)
    repeated = action != "answer" and normalize_query(query) in {normalize_query(q) for q in failed}
    if repeated:  # z_i ∈ F(c_i): record it, then replace it with a fresh query or drop the directive
        out.failures.append(Failure(sq_id, query, "repeated query", iteration))
        fresh = fresh_query(filled, failed)
        event = branch.event("repeated_query", sub_question=sq_id, iteration=iteration, query=query, fresh=fresh)
        event.error = f"query {query!r} already failed for sub-question {sq_id}"
        if fresh is None:
            event.error += "; no fresh query left, directive rejected"
            step.meta.update(action=action, query=None, rewrite=False, repeated_query=True)
            return None
        query = fresh
    directive = Directive(sq_id, action, query, proposed, attempt, repeated)
    step.meta.update(action=action, query=query, rewrite=directive.is_rewrite, repeated_query=repeated)
    return directive


def clean_query(
    query: str, state: StrideState, sq_id: int, failed: list[str], branch: Trajectory, iteration: int
) -> str:
    """The Supervisor's query with solved placeholders filled; when it is empty or refers to an unsolved step, the
    first of the sub-question and its reformulations that has not failed yet (event ``query_fallback``)."""
    query, unresolved = fill_references(query[:MAX_QUERY_CHARS], state.solved, before=sq_id)
    if not query.strip() or unresolved or is_null_answer(query):
        reason = "unresolved placeholder" if unresolved else "empty query"
        branch.event("query_fallback", sub_question=sq_id, iteration=iteration, reason=reason, query=query)
        filled = state.filled(sq_id)
        return fresh_query(filled, failed) or filled
    return query.strip()


def record_failure(out: BranchOutcome, iteration: int, branch: Trajectory) -> Failure:
    """The entry of F for a directive that left its sub-question pending, added to ``out.failures`` and recorded as a
    ``failure`` event (with ``error``) in the branch."""
    query = out.directive.query if out.directive is not None else ""
    failure = Failure(out.sq_id, query, out.failure or "no answer", iteration)
    out.failures.append(failure)
    event = branch.event("failure", **asdict(failure))
    event.error = f"sub-question {out.sq_id}: {failure.reason} for query {failure.query!r}"
    return failure
