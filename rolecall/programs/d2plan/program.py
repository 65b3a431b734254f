"""D2Plan: a Reasoner with an explicit, adapted global plan and a Purifier between retriever and Reasoner
(arXiv 2601.08282).

Control flow (Sec. 2.1 and Algorithms 3-5 of the appendix; K = 3 searches, M = 1 revision):

    (c, P) = Plan(q)                                  # c: single-hop -> P = [q]; else P = [p_1..p_n] with #A_j
    i = 1
    while i <= |P|:
        if p_i needs a_j of an unsolved j < i: skip it                  # p_i is not in P's ready set
        p_i <- Refine(q, C, p_i)                      # after a solved p_{i-1} or when p_i needs answers; the rule
                                                      # fill #A_j -> a_j when the rewrite fails (recorded)
        a_i = Search(q, C, p_i)                       # at most K purified searches (rolecall.programs.d2plan.search)
        if p_i failed and revisions < M:
            P[i:] <- Revise(q, C, p_i, failure)       # plan revision; position i runs again in its new form
            continue
        C += (p_i, a_i, evidence); i += 1
    answer = Answer(q, C)                             # without decomposition: the one sub-question's answer

C is the global context (question, current plan, solved sub-answers with their evidence) that every Reasoner call
after planning sees. The trajectory records what SPlanRL's reward needs (plan size, refinements, revisions and their
triggers, the first query after a revision, the Purifier's judgements); :func:`~rolecall.programs.d2plan.facts.
d2plan_facts` reads them back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

import dspy

from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.plan import (
    PlanGraph,
    dependencies,
    drop_repeats,
    fill_references,
    find_references,
    truncate_plan,
)
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.d2plan.context import ContextEntry, SubQuestion, format_context
from rolecall.programs.d2plan.demos import default_d2plan_demos
from rolecall.programs.d2plan.search import SubQuestionSearch
from rolecall.signatures.d2plan import (
    Purify,
    ReasonerAnswer,
    ReasonerPlan,
    ReasonerRefine,
    ReasonerRevise,
    ReasonerStep,
)
from rolecall.signatures.types import is_null_answer

__all__ = ["D2Plan", "D2PlanOptions", "REASONER_ROLES"]

logger = logging.getLogger(__name__)

REASONER_ROLES = ("reasoner_plan", "reasoner_step", "reasoner_refine", "reasoner_revise", "reasoner_answer")
"""The five calls of the paper's one Reasoner generation (one policy: one LoRA adapter by default)."""


@dataclass(kw_only=True)
class D2PlanOptions(PassageOptions):
    """D2Plan's options (budgets of Sec. 3 and the ablations of Tables 2 and 6)."""

    top_k: int = option(5, low=1)
    """Passages per search (the paper retrieves the top 5 with E5)."""
    max_searches: int = option(3, low=1)
    """K: searches per sub-question before it counts as failed (paper: 3)."""
    max_revisions: int = option(1, low=0)
    """M: plan revisions per question (paper: 1)."""
    max_sub_questions: int = option(5, low=1)
    """Plans (and revised plans, counting the solved part) longer than this are cut."""
    max_context_chars: int = option(1200, low=20)
    """Characters of all passages in one prompt (and of the raw notes without the Purifier); 1200 shows all five
    ~200-character passages of the synthetic corpus, later ones are cut first."""
    use_purifier: bool = True
    """False: raw passages go to the Reasoner (the "w/o Purifier" setting of Table 6)."""
    use_plan_adaptation: bool = True
    """False: no refinement and no revision (the "w/o Adapt" ablation of Table 2); placeholders are then filled by
    rule so sub-questions stay searchable."""


class D2Plan(Program):
    """Dual-agent dynamic global planning: a Reasoner that plans, refines and revises, and a Purifier of retrievals.

    Luo, Wu and Feng, "D2Plan: Dual-Agent Dynamic Global Planning for Complex Retrieval-Augmented Reasoning",
    arXiv 2601.08282. The paper's Reasoner is one tagged generation; here it is five roles (:data:`REASONER_ROLES`)
    sharing one ``reasoner`` adapter by default (SPlanRL trains them as one policy), plus the ``purifier`` with its
    own adapter (see :mod:`rolecall.signatures.d2plan`). Options: :class:`D2PlanOptions`; the other arguments are
    :class:`~rolecall.programs.core.program.Program`'s. Default token budgets: plan 112, step 56, refine 40,
    revise 112, answer 32, purifier 72.

    Example:
        >>> program = D2Plan(retriever, lm=LocalLM())                                    # doctest: +SKIP
        >>> pred = program(question="Who is the father-in-law of Kranra Vrasov?")         # doctest: +SKIP
        >>> d2plan_facts(pred.trajectory).plan_size                                       # doctest: +SKIP
    """

    Options: ClassVar[type[D2PlanOptions]] = D2PlanOptions
    ROLES: ClassVar[tuple[str, ...]] = (*REASONER_ROLES, "purifier")
    MAX_TOKENS: ClassVar[dict[str, int]] = {
        "reasoner_plan": 112,
        "reasoner_step": 56,
        "reasoner_refine": 40,
        "reasoner_revise": 112,
        "reasoner_answer": 32,
        "purifier": 72,
    }

    def _build_roles(self) -> None:
        self.reasoner_plan = dspy.Predict(ReasonerPlan)
        self.reasoner_step = dspy.Predict(ReasonerStep)
        if self.use_plan_adaptation:
            self.reasoner_refine = dspy.Predict(ReasonerRefine)
            self.reasoner_revise = dspy.Predict(ReasonerRevise)
        self.reasoner_answer = dspy.Predict(ReasonerAnswer)
        if self.use_purifier:
            self.purifier = dspy.Predict(Purify)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        return default_d2plan_demos()

    def default_adapter_groups(self) -> dict[str, list[str]]:
        """One ``reasoner`` adapter for the five Reasoner calls; the Purifier keeps its own."""
        return {"reasoner": list(REASONER_ROLES)}

    # ------------------------------------------------------------------ control flow
    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        complexity, texts = self._plan(question, trajectory)
        plan, _ = PlanGraph.from_texts(texts)
        done: dict[int, SubQuestion] = {}  # the latest sub-question at each plan position
        executed: list[SubQuestion] = []
        revisions, i = 0, 1
        while i <= len(plan.steps):
            sub = self._execute(question, plan, i, done, trajectory)
            executed.append(sub)
            done[i] = sub
            if sub.status == "solved":
                plan.resolve(i, sub.answer)
            elif sub.status == "failed" and self.use_plan_adaptation and revisions < self.max_revisions:
                revisions += 1
                revised = self._revise(question, plan, sub, done, trajectory)
                if revised:  # position i runs again, in its revised form
                    plan = _replace_rest(plan, i, revised)
                    continue
            i += 1
        answer = self._final_answer(question, plan, executed, done, trajectory)
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            complexity=complexity,
            plan=texts,
            sub_questions=[
                {
                    "index": s.index,
                    "sub_question": s.text,
                    "answer": s.answer,
                    "status": s.status,
                    "searches": s.searches,
                }
                for s in executed
            ],
        )

    def _plan(self, question: str, trajectory: Trajectory) -> tuple[str, list[str]]:
        pred = self.call_role("reasoner_plan", trajectory, question=question)
        complexity = str(pred.complexity) if pred is not None else ""
        raw = list(pred.plan) if pred is not None and pred.plan else []
        plan = drop_repeats([str(s).strip() for s in raw if str(s).strip()], style="answer_ref")
        source, malformed = "model", None
        if pred is None:
            plan, source = [question], "fallback"
        elif complexity == "single-hop":  # no decomposition: the question is the one sub-question
            malformed = "single-hop with several sub-questions" if len(plan) > 1 else None
            plan = [question]
        elif not plan:
            plan, source, malformed = [question], "fallback", "empty plan"
        if malformed:
            trajectory.event("malformed_output", role="reasoner_plan", reason=malformed).error = malformed
        plan = truncate_plan(plan, self.max_sub_questions, trajectory)
        is_multi_hop = complexity == "multi-hop"
        trajectory.event(
            "plan", complexity=complexity, is_multi_hop=is_multi_hop, plan=plan, size=len(plan), source=source
        )
        return complexity, plan

    def _context(self, plan: PlanGraph, done: dict[int, SubQuestion], upto: int | None = None) -> str:
        """The global context C: the current plan, the sub-questions run before position ``upto`` (all without it)
        as they ran, each solved one with its answer and evidence."""
        entries: list[ContextEntry] = []
        for step in plan.steps:
            sub = done.get(step.id)
            if sub is None or (upto is not None and step.id >= upto):
                entries.append((step.id, step.text, None, ""))
            elif sub.status == "solved":
                entries.append((step.id, sub.text, sub.answer, sub.evidence(self.max_passage_chars)))
            else:
                entries.append((step.id, sub.text, "", ""))
        return format_context(entries)

    # ------------------------------------------------------------------ one sub-question
    def _execute(
        self, question: str, plan: PlanGraph, i: int, done: dict[int, SubQuestion], trajectory: Trajectory
    ) -> SubQuestion:
        planned = plan.get(i).text
        if i not in plan.ready():  # it needs the answer of an unsolved earlier sub-question
            blocked = [j for j in plan.get(i).depends_on if j not in plan.answers]
            sub = SubQuestion(index=i, planned=planned, text=planned, status="skipped", failure="dependency_failed")
            trajectory.event(
                "sub_question_skipped", sub_question=i, blocked_by=blocked
            ).error = f"sub-question {i} needs the answers of unsolved sub-questions {blocked}"
        else:
            text = self._prepare(question, plan, i, done, trajectory)
            sub = SubQuestion(index=i, planned=planned, text=text)
            context = self._context(plan, done, upto=i)
            sub = SubQuestionSearch(self, trajectory, sub, question=question, context=context).run()
        trajectory.event(
            "sub_question_done",
            sub_question=i,
            planned=planned,
            text=sub.text,
            had_placeholder=bool(dependencies(planned)),
            status=sub.status,
            answer=sub.answer,
            searches=sub.searches,
            relevant=sub.relevant,
        )
        return sub

    def _prepare(
        self, question: str, plan: PlanGraph, i: int, done: dict[int, SubQuestion], trajectory: Trajectory
    ) -> str:
        """The text sub-question ``i`` runs as: the Reasoner's refinement when the previous one was solved or ``i``
        depends on solved ones; else (and whenever the refinement is missing, keeps a placeholder or drops a needed
        answer) the plan's text with ``#A_j`` filled by rule."""
        planned, answers = plan.get(i).text, plan.answers
        had_refs = bool(find_references(planned))
        previous = done.get(i - 1)
        if not (self.use_plan_adaptation and i > 1 and (had_refs or (previous and previous.status == "solved"))):
            filled, unresolved = fill_references(planned, answers, before=i)
            if had_refs:
                trajectory.event("placeholder_filled", sub_question=i, by="rule", text=filled, unresolved=unresolved)
            return filled
        context = self._context(plan, done, upto=i)
        pred = self.call_role("reasoner_refine", trajectory, question=question, context=context, sub_question=planned)
        trajectory.steps[-1].meta.update(sub_question=i)
        refined = str(pred.refined).strip() if pred is not None and pred.refined else ""
        usable = bool(refined) and not is_null_answer(refined)
        left = not usable or bool(find_references(refined))
        needed = [answers[j] for j in plan.get(i).depends_on if j in answers]
        text, unresolved, reason = refined, [], None
        if left:  # no usable rewrite, or it kept a placeholder: fill the rewrite (or the plan's own text) by rule
            text, unresolved = fill_references(refined if usable else planned, answers, before=i)
            reason = "placeholder_left" if usable else ("unparseable" if pred is None else "empty")
        elif any(a.lower() not in refined.lower() for a in needed):  # it lost a needed answer: the rule is safer
            text, unresolved = fill_references(planned, answers, before=i)
            reason = "answer_missing"
        trajectory.event(
            "refinement",
            sub_question=i,
            had_placeholder_before=had_refs,
            has_placeholder_after=left,
            rule_filled=reason is not None,
            reason=reason,
            text=text,
            unresolved=unresolved,
        )
        return text

    # ------------------------------------------------------------------ adaptation and answer
    def _revise(
        self, question: str, plan: PlanGraph, sub: SubQuestion, done: dict[int, SubQuestion], trajectory: Trajectory
    ) -> list[str]:
        i = sub.index
        found = "; ".join(sub.notes[-2:]) if self.use_purifier and sub.notes else "no usable passages"
        if sub.failure == "unanswered_sub_question":
            failure = f"{sub.searches} searches found {found}, but no answer"[:400]
        else:
            failure = f"{sub.searches} searches found nothing relevant, only {found}"[:400]
        context = self._context(plan, done, upto=i)
        pred = self.call_role(
            "reasoner_revise", trajectory, question=question, context=context, failed=sub.text, failure=failure
        )
        trajectory.steps[-1].meta.update(sub_question=i)
        raw = list(pred.plan) if pred is not None and pred.plan else []
        revised = drop_repeats([str(s).strip() for s in raw if str(s).strip()], offset=i - 1, style="answer_ref")
        keep = max(1, self.max_sub_questions - (i - 1))
        revised = truncate_plan(revised, keep, trajectory, sub_question=i)
        step = trajectory.event(
            "revision",
            sub_question=i,
            trigger=sub.failure,
            applied=bool(revised),
            plan_before=[s.text for s in plan.steps[i - 1 :]],
            plan_after=revised,
        )
        if not revised:
            step.error = "revision unparseable" if pred is None else "revision empty"
            if pred is not None:
                trajectory.event("malformed_output", role="reasoner_revise", reason="empty plan").error = "empty plan"
        return revised

    def _final_answer(
        self,
        question: str,
        plan: PlanGraph,
        executed: list[SubQuestion],
        done: dict[int, SubQuestion],
        trajectory: Trajectory,
    ) -> str:
        if len(plan.steps) == 1 and len(executed) == 1:  # no decomposition: the sub-question was the question
            return executed[0].answer
        pred = self.call_role("reasoner_answer", trajectory, question=question, context=self._context(plan, done))
        answer = str(pred.answer or "").strip() if pred is not None else ""
        if is_null_answer(answer):
            last = next((s.answer for _, s in sorted(done.items(), reverse=True) if s.status == "solved"), "")
            trajectory.event("answer_fallback", answer=last)
            return last
        return answer


def _replace_rest(plan: PlanGraph, i: int, revised: list[str]) -> PlanGraph:
    """``plan`` with positions ``i`` onwards replaced by ``revised``, keeping the answers of positions before ``i``."""
    new, _ = PlanGraph.from_texts([s.text for s in plan.steps[: i - 1]] + revised)
    new.answers = {j: a for j, a in plan.answers.items() if j < i}
    return new
