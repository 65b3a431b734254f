"""D2Plan: a Reasoner with an explicit, adapted global plan and a Purifier between retriever and Reasoner
(arXiv 2601.08282).

Control flow (Sec. 2.1 and Algorithms 3-5 of the appendix; K = 3 searches, M = 1 revision):

    (c, P) = Plan(q)                                  # c: single-hop -> P = [q]; else P = [p_1..p_n] with #A_j
    i = 1
    while i <= |P|:
        if p_i needs a_j of an unsolved j < i: skip it
        p_i <- Refine(p_i, solved)                    # after a solved p_{i-1} or when p_i needs answers; the rule
                                                      # fill #A_j -> a_j when the rewrite fails (recorded)
        notes = []
        repeat:                                       # at most K searches
            (action, query, a_i) = Step(p_i, notes)   # answering without a search is allowed (Table 20)
            if action = answer: solved, break
            (J_k, I_k) = Purify(p_i, retrieve(query, k))   # relevance + key information, or a short summary
            notes += (J_k, I_k)
        until K searches (then one more Step, unless every J_k said irrelevant)
        if p_i failed and revisions < M:
            P[i:] <- Revise(q, solved, p_i, failure)  # plan revision; position i runs again in its new form
            continue
        i += 1
    answer = Answer(q, solved)                        # without decomposition: the one sub-question's answer

The trajectory records what SPlanRL's reward needs (plan size, refinements, revisions and their triggers, the first
query after a revision, the Purifier's judgements); :func:`d2plan_facts` reads them back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.d2plan.demos import NO_NOTES, default_d2plan_demos, format_solved
from rolecall.programs.d2plan.facts import D2PlanFacts, Refinement, Revision, d2plan_facts
from rolecall.programs.d2plan.refs import answer_refs, drop_repeats, fill_answer_refs, has_answer_refs
from rolecall.retrievers.base import Passage, Retriever
from rolecall.signatures.d2plan import (
    Purify,
    ReasonerAnswer,
    ReasonerPlan,
    ReasonerRefine,
    ReasonerRevise,
    ReasonerStep,
)
from rolecall.signatures.types import is_null_answer

__all__ = ["D2Plan", "SubQuestion", "D2PlanFacts", "Refinement", "Revision", "d2plan_facts"]


logger = logging.getLogger(__name__)

_MAX_TOKENS = {
    "reasoner_plan": 112,
    "reasoner_step": 56,
    "reasoner_refine": 40,
    "reasoner_revise": 112,
    "reasoner_answer": 32,
    "purifier": 72,
}

Status = Literal["solved", "failed", "skipped"]


@dataclass
class SubQuestion:
    """One executed sub-question: its planned text, the text it ran as, and what came of it."""

    index: int
    planned: str
    text: str
    answer: str = ""
    status: Status = "failed"
    searches: int = 0
    relevant: list[bool | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failure: str = ""


class D2Plan(Program):
    """Dual-agent dynamic global planning: a Reasoner that plans, refines and revises, and a Purifier of retrievals.

    Luo, Wu and Feng, "D2Plan: Dual-Agent Dynamic Global Planning for Complex Retrieval-Augmented Reasoning",
    arXiv 2601.08282. The paper's Reasoner is one tagged generation; here it is five roles (``reasoner_plan``,
    ``reasoner_step``, ``reasoner_refine``, ``reasoner_revise``, ``reasoner_answer``) trained as one policy, plus the
    ``purifier`` (see :mod:`rolecall.signatures.d2plan`).

    Args:
        retriever: the retriever tool.
        lm: LM for every role (a ``LocalLM`` gets one LoRA adapter per role, see :class:`Program`).
        demos: ``"auto"`` (built-in demos from a small synthetic world), None (zero-shot, or keep what a loaded state
            sets), or a dict role -> list of ``dspy.Example``.
        top_k: passages per search (the paper retrieves the top-5 passages with E5).
        max_searches: K, searches per sub-question before it counts as failed (paper: 3).
        max_revisions: M, plan revisions per question (paper: 1).
        max_sub_questions: plans (and revised plans, counting the solved part) longer than this are cut.
        max_passage_chars: characters of one passage shown to an LM.
        max_context_chars: characters of all passages in one prompt (and of the raw notes without the Purifier);
            1200 shows all five ~200-character passages of the synthetic corpus, later ones are cut first.
        use_purifier: False -> raw passages go to the Reasoner (the "w/o Purifier" setting of Table 6).
        use_plan_adaptation: False -> no refinement and no revision (the "w/o Adapt" ablation of Table 2);
            placeholders are then filled by rule so sub-questions stay searchable.
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls (default ``dspy.settings.adapter``).
        lm_kwargs: LM call arguments by role, ``"*"`` for all. Default: stop on ChatAdapter's completion marker and
            token budgets plan 112, step 56, refine 40, revise 112, answer 32, purifier 72.

    Raises:
        ConfigError: a budget below its minimum (``top_k``, ``max_searches``, ``max_sub_questions`` >= 1,
            ``max_revisions`` >= 0, 20 <= ``max_passage_chars`` <= ``max_context_chars``), or ``demos`` that are not
            ``"auto"``, None or a dict of D2Plan's roles.

    Example:
        >>> program = D2Plan(retriever, lm=LocalLM())                                    # doctest: +SKIP
        >>> pred = program(question="Who is the father-in-law of Kranra Vrasov?")         # doctest: +SKIP
        >>> d2plan_facts(pred.trajectory).plan_size                                       # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Literal["auto"] | dict[str, list[dspy.Example]] | None = "auto",
        top_k: int = 5,
        max_searches: int = 3,
        max_revisions: int = 1,
        max_sub_questions: int = 5,
        max_passage_chars: int = 300,
        max_context_chars: int = 1200,
        use_purifier: bool = True,
        use_plan_adaptation: bool = True,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        for name, value, low in (
            ("top_k", top_k, 1),
            ("max_searches", max_searches, 1),
            ("max_revisions", max_revisions, 0),
            ("max_sub_questions", max_sub_questions, 1),
        ):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.max_searches, self.max_revisions = top_k, max_searches, max_revisions
        self.max_sub_questions = max_sub_questions
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self.use_purifier, self.use_plan_adaptation = use_purifier, use_plan_adaptation
        self._config |= {
            "top_k": top_k,
            "max_searches": max_searches,
            "max_revisions": max_revisions,
            "max_sub_questions": max_sub_questions,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
            "use_purifier": use_purifier,
            "use_plan_adaptation": use_plan_adaptation,
        }
        # roles: plain attributes so named_predictors() and DSPy's optimizers see them
        self.reasoner_plan = dspy.Predict(ReasonerPlan)
        self.reasoner_step = dspy.Predict(ReasonerStep)
        if use_plan_adaptation:
            self.reasoner_refine = dspy.Predict(ReasonerRefine)
            self.reasoner_revise = dspy.Predict(ReasonerRevise)
        self.reasoner_answer = dspy.Predict(ReasonerAnswer)
        if use_purifier:
            self.purifier = dspy.Predict(Purify)
        self._set_initial_demos(demos)
        self._bind_lm()

    def _set_initial_demos(self, demos: Any) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            demos = default_d2plan_demos()
        if not isinstance(demos, dict):
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")
        unknown = sorted(set(demos) - set(_MAX_TOKENS))
        if unknown:  # an ablated role's demos are skipped, a misspelt role is an error
            raise ConfigError(f"demos for unknown roles {unknown}; D2Plan's roles are {sorted(_MAX_TOKENS)}")
        self.set_demos({role: d for role, d in demos.items() if role in self.roles})

    # ------------------------------------------------------------------ forward
    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question``; returns ``Prediction(answer, trajectory, complexity, plan, sub_questions)``; never
        raises."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        complexity, plan = self._plan(question, trajectory)
        initial = list(plan)
        done: dict[int, SubQuestion] = {}  # the latest sub-question at each plan position
        executed: list[SubQuestion] = []
        revisions, i = 0, 1
        while i <= len(plan):
            sub = self._execute(i, plan[i - 1], done, trajectory)
            executed.append(sub)
            done[i] = sub
            if sub.status == "failed" and self.use_plan_adaptation and revisions < self.max_revisions:
                revisions += 1
                revised = self._revise(question, plan, sub, done, trajectory)
                if revised:
                    plan = plan[: i - 1] + revised
                    continue  # position i runs again, in its revised form
            i += 1
        answer = self._final_answer(question, plan, executed, done, trajectory)
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            complexity=complexity,
            plan=initial,
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
        plan = drop_repeats([str(s).strip() for s in raw if str(s).strip()])
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
        if len(plan) > self.max_sub_questions:
            trajectory.event("plan_truncated", planned=len(plan), kept=self.max_sub_questions)
            plan = plan[: self.max_sub_questions]
        trajectory.event(
            "plan",
            complexity=complexity,
            is_multi_hop=complexity == "multi-hop",
            plan=plan,
            size=len(plan),
            source=source,
        )
        return complexity, plan

    # ------------------------------------------------------------------ one sub-question
    def _execute(self, i: int, planned: str, done: dict[int, SubQuestion], trajectory: Trajectory) -> SubQuestion:
        refs = answer_refs(planned)
        blocked = [j for j in refs if j < i and (j not in done or done[j].status != "solved")]
        if blocked:
            sub = SubQuestion(index=i, planned=planned, text=planned, status="skipped", failure="dependency_failed")
            trajectory.event(
                "sub_question_skipped", sub_question=i, blocked_by=blocked
            ).error = f"sub-question {i} needs the answers of unsolved sub-questions {blocked}"
        else:
            text = self._prepare(i, planned, done, trajectory)
            sub = self._solve(SubQuestion(index=i, planned=planned, text=text), trajectory)
        trajectory.event(
            "sub_question_done",
            sub_question=i,
            planned=planned,
            text=sub.text,
            had_placeholder=bool(refs),
            status=sub.status,
            answer=sub.answer,
            searches=sub.searches,
            relevant=sub.relevant,
        )
        return sub

    def _prepare(self, i: int, planned: str, done: dict[int, SubQuestion], trajectory: Trajectory) -> str:
        """The text sub-question ``i`` runs as: the Reasoner's refinement when the previous one was solved or ``i``
        depends on solved ones; else (and whenever the refinement is missing, keeps a placeholder or drops a needed
        answer) the plan's text with ``#A_j`` filled by rule."""
        answers = {j: s.answer for j, s in done.items() if s.status == "solved"}
        had_refs = has_answer_refs(planned)
        previous = done.get(i - 1)
        if not (self.use_plan_adaptation and i > 1 and (had_refs or (previous and previous.status == "solved"))):
            filled, unresolved = fill_answer_refs(planned, answers, before=i)
            if had_refs:
                trajectory.event("placeholder_filled", sub_question=i, by="rule", text=filled, unresolved=unresolved)
            return filled
        solved = format_solved([(j, s.text, s.answer) for j, s in sorted(done.items()) if j < i])
        pred = self.call_role("reasoner_refine", trajectory, sub_question=planned, solved=solved)
        trajectory.steps[-1].meta.update(sub_question=i)
        refined = str(pred.refined).strip() if pred is not None and pred.refined else ""
        usable = bool(refined) and not is_null_answer(refined)
        left = not usable or has_answer_refs(refined)
        needed = [answers[j] for j in answer_refs(planned) if j in answers]
        text, unresolved, reason = refined, [], None
        if left:  # no usable rewrite, or it kept a placeholder: fill the rewrite (or the plan's own text) by rule
            text, unresolved = fill_answer_refs(refined if usable else planned, answers, before=i)
            reason = "placeholder_left" if usable else ("unparseable" if pred is None else "empty")
        elif any(a.lower() not in refined.lower() for a in needed):  # it lost a needed answer: the rule is safer
            text, unresolved = fill_answer_refs(planned, answers, before=i)
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

    def _solve(self, sub: SubQuestion, trajectory: Trajectory) -> SubQuestion:
        """At most K searches, each purified, until the Reasoner answers; else the sub-question failed.

        After the K-th search the Reasoner gets one more turn to answer, unless the Purifier judged every search
        irrelevant (then the sub-question has failed)."""
        tried: set[str] = set()
        for turn in range(self.max_searches + 1):
            if sub.searches >= self.max_searches and all(r is False for r in sub.relevant):
                break  # K searches, none relevant: failed without asking the Reasoner again (Algorithm 3)
            pred = self.call_role("reasoner_step", trajectory, sub_question=sub.text, notes=self._notes(sub))
            trajectory.steps[-1].meta.update(sub_question=sub.index, turn=turn)
            action = str(pred.action) if pred is not None else "search"
            answer = str(pred.answer or "").strip() if pred is not None else ""
            if action == "answer" and not is_null_answer(answer):
                sub.answer, sub.status = answer, "solved"
                return sub
            if sub.searches >= self.max_searches:
                break
            query = str(pred.query or "").strip() if pred is not None else ""
            if is_null_answer(query):
                if pred is not None and action == "search":
                    trajectory.event(
                        "malformed_output", role="reasoner_step", reason="search without a query"
                    ).error = "search without a query"
                query = next((q for q in (sub.text, _names(sub.text)) if q and q not in tried), sub.text)
                trajectory.event("query_fallback", sub_question=sub.index, turn=turn, query=query)
            tried.add(query)
            passages = self.retrieve(trajectory, query, self.top_k)
            sub.searches += 1
            trajectory.steps[-1].meta.update(sub_question=sub.index, search=sub.searches)
            relevant, information = self._purify(sub, passages, trajectory)
            sub.relevant.append(relevant)
            sub.notes.append(information)
        sub.status = "failed"
        sub.failure = "unanswered_sub_question" if any(r is True for r in sub.relevant) else "failed_sub_question"
        trajectory.event(
            "sub_question_failed", sub_question=sub.index, trigger=sub.failure
        ).error = f"sub-question {sub.index} unsolved after {sub.searches} searches ({sub.failure})"
        return sub

    def _purify(self, sub: SubQuestion, passages: list[Passage], trajectory: Trajectory) -> tuple[bool | None, str]:
        """The Purifier's (relevant?, key information or summary); raw passages and None without it."""
        shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
        if not self.use_purifier:
            return None, shown
        if not passages:  # nothing to judge: no LM call
            return False, "the search returned no passages"
        pred = self.call_role("purifier", trajectory, sub_question=sub.text, passages=shown)
        trajectory.steps[-1].meta.update(sub_question=sub.index, search=sub.searches)
        about = "passages about " + ", ".join(dict.fromkeys(p.title for p in passages[:3]))
        if pred is None:
            return None, about
        information = str(pred.information or "").strip()
        return str(pred.relevant) == "yes", about if is_null_answer(information) else information

    def _notes(self, sub: SubQuestion) -> str:
        """What the Reasoner sees of this sub-question's searches: the Purifier's labelled notes, or raw passages."""
        if not sub.notes:
            return NO_NOTES
        if self.use_purifier:
            labels = {True: "relevant: ", False: "not relevant: ", None: ""}
            return "\n".join(
                f"[{k}] {labels[r]}{n}" for k, (r, n) in enumerate(zip(sub.relevant, sub.notes, strict=True), 1)
            )
        kept: list[str] = []  # raw passages: the latest searches that fit the context budget
        for k in range(len(sub.notes), 0, -1):
            block = f"Search {k}:\n{sub.notes[k - 1]}"
            if kept and sum(len(b) for b in kept) + len(block) > self.max_context_chars:
                break
            kept.insert(0, block)
        return "\n".join(kept)

    # ------------------------------------------------------------------ adaptation and answer
    def _revise(
        self, question: str, plan: list[str], sub: SubQuestion, done: dict[int, SubQuestion], trajectory: Trajectory
    ) -> list[str]:
        i = sub.index
        solved = format_solved([(j, s.text, s.answer) for j, s in sorted(done.items()) if j < i])
        found = "; ".join(sub.notes[-2:]) if self.use_purifier and sub.notes else "no usable passages"
        if sub.failure == "unanswered_sub_question":
            failure = f"{sub.searches} searches found {found}, but no answer"[:400]
        else:
            failure = f"{sub.searches} searches found nothing relevant, only {found}"[:400]
        pred = self.call_role(
            "reasoner_revise", trajectory, question=question, solved=solved, failed=sub.text, failure=failure
        )
        trajectory.steps[-1].meta.update(sub_question=i)
        raw = list(pred.plan) if pred is not None and pred.plan else []
        revised = drop_repeats([str(s).strip() for s in raw if str(s).strip()], offset=i - 1)
        keep = max(1, self.max_sub_questions - (i - 1))
        if len(revised) > keep:
            trajectory.event("plan_truncated", planned=len(revised), kept=keep, sub_question=i)
            revised = revised[:keep]
        step = trajectory.event(
            "revision",
            sub_question=i,
            trigger=sub.failure,
            applied=bool(revised),
            plan_before=plan[i - 1 :],
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
        plan: list[str],
        executed: list[SubQuestion],
        done: dict[int, SubQuestion],
        trajectory: Trajectory,
    ) -> str:
        if len(plan) == 1 and len(executed) == 1:  # no decomposition: the sub-question was the question
            return executed[0].answer
        solved = format_solved([(j, s.text, s.answer) for j, s in sorted(done.items())])
        pred = self.call_role("reasoner_answer", trajectory, question=question, solved=solved)
        answer = str(pred.answer or "").strip() if pred is not None else ""
        if is_null_answer(answer):
            last = next((s.answer for _, s in sorted(done.items(), reverse=True) if s.status == "solved"), "")
            trajectory.event("answer_fallback", answer=last)
            return last
        return answer


def _names(text: str) -> str:
    """The capitalised words of ``text`` after its first word: a mechanical entity query when the Reasoner gave none
    (``"In which city was Staekys Granuvell born?"`` -> ``"Staekys Granuvell"``)."""
    words = [w.strip("?.,;:!'\"") for w in text.split()[1:]]
    return " ".join(w for w in words if w[:1].isupper() or w[:1].isdigit())
