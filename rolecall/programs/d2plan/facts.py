"""What SPlanRL's reward reads from a D2Plan run (arXiv 2601.08282, Sec. 2.3; PAPERS.md section 4).

``R = R_f (α R_p + β R_a + R_ans)``: R_f needs every tag well formed, R_p the plan size against the hop count, R_a the
refinements (R_refine) and the revisions with their trigger and the first query after them (R_revise's c, r, R_t,
R_q). :func:`d2plan_facts` reads them back from the events a :class:`~rolecall.programs.d2plan.program.D2Plan` run
records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rolecall.programs.core.trajectory import Trajectory

__all__ = ["D2PlanFacts", "Refinement", "Revision", "d2plan_facts"]


@dataclass
class Refinement:
    """One Reasoner refinement of the next sub-question (from a ``refinement`` event).

    Attributes:
        sub_question: 1-based plan position of the refined sub-question.
        had_placeholder_before: the planned text held ``#A_j``.
        has_placeholder_after: the Reasoner's rewrite still held a placeholder, or there was no usable rewrite.
        rule_filled: the text that ran was filled by rule instead (the rewrite was missing, kept a placeholder or
            dropped a needed answer; ``reason`` says which).
        reason: None, ``"unparseable"``, ``"empty"``, ``"placeholder_left"`` or ``"answer_missing"``.
        text: the sub-question as it ran.
    """

    sub_question: int
    had_placeholder_before: bool
    has_placeholder_after: bool
    rule_filled: bool
    reason: str | None
    text: str


@dataclass
class Revision:
    """One plan revision (from a ``revision`` event).

    Attributes:
        sub_question: 1-based position of the failed sub-question the revised plan starts at.
        trigger: ``"failed_sub_question"`` (K searches, no relevant evidence) or ``"unanswered_sub_question"`` (the
            Purifier found relevant evidence but the Reasoner never answered).
        applied: the Reasoner wrote a non-empty revised plan, which replaced the remaining plan.
        plan_before: the remaining plan it replaced.
        plan_after: the revised remaining plan.
    """

    sub_question: int
    trigger: str
    applied: bool
    plan_before: list[str]
    plan_after: list[str]


@dataclass
class D2PlanFacts:
    """The facts of one D2Plan run that SPlanRL's reward ``R = R_f (α R_p + β R_a + R_ans)`` needs.

    Attributes:
        plan_size: sub-questions in the initial plan (1 when the question was not decomposed).
        is_multi_hop: the Reasoner judged the question multi-hop.
        tags_well_formed: every role output parsed and no output was malformed (empty plan, search without a query):
            R_f.
        refinements: the Reasoner's refinements, in order.
        revisions: the plan revisions, in order.
        first_query_after_revision: the first search query after the first applied revision (None if none): R_q.
        first_query_after_revision_ids: the passage ids that query retrieved.
        purifier_relevant: the Purifier's judgement of each purified search (None: unparseable); empty without it.
        searches_per_sub_question: searches of each executed sub-question, in execution order (a revised position
            appears once per run of it).
        dependent_sub_questions: positions of executed sub-questions whose planned text held ``#A_j``.
    """

    plan_size: int = 0
    is_multi_hop: bool = False
    tags_well_formed: bool = False
    refinements: list[Refinement] = field(default_factory=list)
    revisions: list[Revision] = field(default_factory=list)
    first_query_after_revision: str | None = None
    first_query_after_revision_ids: list[str] = field(default_factory=list)
    purifier_relevant: list[bool | None] = field(default_factory=list)
    searches_per_sub_question: list[int] = field(default_factory=list)
    dependent_sub_questions: list[int] = field(default_factory=list)

    @property
    def revised(self) -> bool:
        """r: a revision was applied."""
        return any(r.applied for r in self.revisions)

    @property
    def every_dependent_refined(self) -> bool:
        """R_refine's condition: each dependent sub-question was rewritten by the Reasoner without placeholders (a
        rule fill does not count). True when no sub-question depended on another."""
        ok = {r.sub_question for r in self.refinements if not r.has_placeholder_after and not r.rule_filled}
        return all(i in ok for i in self.dependent_sub_questions)


def d2plan_facts(trajectory: Trajectory) -> D2PlanFacts:
    """Read :class:`D2PlanFacts` back from a D2Plan trajectory (also one rebuilt with ``Trajectory.from_dict``).

    Example:
        >>> d2plan_facts(Trajectory()).plan_size
        0
    """
    facts = D2PlanFacts()
    events = [s for s in trajectory.steps if s.kind == "event"]
    plan = next((e for e in events if e.role == "plan"), None)
    if plan is not None:
        facts.plan_size, facts.is_multi_hop = int(plan.meta.get("size", 0)), bool(plan.meta.get("is_multi_hop"))
    roles = trajectory.role_steps()
    facts.tags_well_formed = bool(roles) and all(s.ok for s in roles) and not any(e.role == "error" for e in events)
    facts.tags_well_formed &= not any(e.role == "malformed_output" for e in events)
    fields = ("sub_question", "had_placeholder_before", "has_placeholder_after", "rule_filled", "reason", "text")
    facts.refinements = [Refinement(**{f: e.meta.get(f) for f in fields}) for e in events if e.role == "refinement"]
    fields = ("sub_question", "trigger", "applied", "plan_before", "plan_after")
    facts.revisions = [Revision(**{f: e.meta.get(f) for f in fields}) for e in events if e.role == "revision"]
    revision_at = next(
        (k for k, s in enumerate(trajectory.steps) if s.role == "revision" and s.meta.get("applied")), None
    )
    if revision_at is not None:
        first = next((s for s in trajectory.steps[revision_at:] if s.kind == "retrieval"), None)
        if first is not None:
            facts.first_query_after_revision = first.inputs.get("query")
            facts.first_query_after_revision_ids = list(first.outputs.get("passage_ids", []))
    facts.purifier_relevant = [
        (s.outputs.get("relevant") == "yes") if s.ok else None for s in trajectory.role_steps("purifier")
    ]
    done = [e for e in events if e.role == "sub_question_done"]
    facts.searches_per_sub_question = [int(e.meta.get("searches", 0)) for e in done]
    facts.dependent_sub_questions = [
        e.meta["sub_question"] for e in done if e.meta.get("had_placeholder") and e.meta.get("status") != "skipped"
    ]
    return facts
