"""OPERA: plan sub-goals, then answer each with retrieval, analysis and query rewriting (arXiv 2508.16438).

Control flow (Sec. 3.2 and the reference code):

    P = {p_1..p_m} = Plan(q)                                  # Goal Planning Module
    for i = 1..m:
        p_i <- p_i with each [t from step j] replaced by a_j  # placeholder filling, j < i
        query <- p_i
        for attempt r = 0..R:                                 # R = max_rewrites
            D_i <- retrieve(query, k_r)                       # k schedule (5, 10, 15)
            (φ, a_i, c_i, ρ_i) = Analyze(p_i, D_i)            # Eq. 8
            if φ = yes: break
            query <- Rewrite(p_i, D_i, ρ_i)                   # reasoning-driven retrieval
    answer = Synthesize(q, {p_i -> a_i})                      # the reference code's final step (default)
           | a_m                                              # the paper's rule, final_synthesis=False

Deviation from the paper: ``final_synthesis=True`` is the default. The paper answers with the last sub-goal's answer,
which caps EM wherever the answer is not one (on the synthetic world 36% of questions are comparisons or yes/no).

The Trajectory Memory Component is the :class:`~rolecall.programs.core.trajectory.Trajectory` every run returns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.core.memo import OnceMemo
from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.plan import drop_repeats, fill_placeholders, truncate_plan
from rolecall.programs.core.text import format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.opera.demos import default_opera_demos
from rolecall.retrievers.base import Passage
from rolecall.signatures.opera import AnalyzeAnswer, PlanSubGoals, RewriteQuery, SynthesizeAnswer
from rolecall.signatures.types import CONFIDENCE_SCORES, is_null_answer

__all__ = ["OPERA", "OPERAOptions", "SubGoalResult"]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class OPERAOptions(PassageOptions):
    """Options of :class:`OPERA` (reference-code defaults; ``max_passage_chars`` / ``max_context_chars`` inherited)."""

    top_k: int = option(5, low=1)
    """Passages retrieved on a sub-goal's first attempt (the paper's k = 5)."""
    k_schedule: tuple[int, ...] | None = None
    """Passages retrieved on attempt 0, 1, 2, ... of a sub-goal; the last value repeats. None: ``(top_k, 2 top_k,
    3 top_k)`` (reference code: 5, 10, 15)."""
    max_rewrites: int = option(2, low=0)
    """Rewrite-and-retrieve rounds per sub-goal after a "no" (reference code: 2)."""
    max_steps: int = option(6, low=1)
    """Budget of retrieve-and-analyze rounds per question (reference code: 6); when spent the run stops and records
    ``budget_exhausted``."""
    max_sub_goals: int = option(5, low=1)
    """Plans longer than this are cut (recorded as ``plan_truncated``)."""
    use_plan_agent: bool = True
    """False: the question itself is the only sub-goal (the paper's "w/o Plan Agent" ablation)."""
    use_rewrite: bool = True
    """False: one retrieve-and-analyze round per sub-goal (the paper's "w/o Rewrite" ablation)."""
    final_synthesis: bool = True
    """True (default, a deviation from the paper): a ``synthesis`` role answers from all sub-goal answers, as in the
    reference code; False: the last sub-goal's answer is the answer (the paper's rule)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k_schedule is None:
            self.k_schedule = (self.top_k, 2 * self.top_k, 3 * self.top_k)
        self.k_schedule = tuple(self.k_schedule)
        if not self.k_schedule or any(k < 1 for k in self.k_schedule):
            raise ConfigError(f"option k_schedule must be a non-empty list of ints >= 1, got {list(self.k_schedule)!r}")


@dataclass
class SubGoalResult:
    """What OPERA learned about one sub-goal."""

    index: int
    text: str
    filled: str
    answer: str = ""
    sufficient: bool = False
    confidence: float = 0.0
    attempts: int = 0
    seen_ids: set[str] = field(default_factory=set)


@dataclass
class _StepBudget:
    """Retrieve-and-analyze rounds left for one question (``max_steps``)."""

    left: int


class OPERA(PassageProgram):
    """Orchestrated Planner-Executor Reasoning Architecture: Plan, Analysis-Answer and Rewrite agents over a retriever.

    Liu et al., "OPERA: A Reinforcement Learning-Enhanced Orchestrated Planner-Executor Architecture for
    Reasoning-Oriented Multi-Hop Retrieval", arXiv 2508.16438. Roles: ``plan`` (question -> sub-goals), ``analysis``
    (sub-goal, passages -> sufficient, answer, confidence, missing_information), ``rewrite`` (sub-goal, passages,
    missing_information -> query) and ``synthesis`` (question, sub-goal answers -> answer; off with
    ``final_synthesis=False``). Options: :class:`OPERAOptions`; the other arguments: :class:`Program`. Default token
    budgets: plan 128, analysis 72, rewrite 40, synthesis 48.

    Example:
        >>> program = OPERA(retriever, lm=LocalLM())                           # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, pred.trajectory.parse_rate("plan")                    # doctest: +SKIP
    """

    Options: ClassVar[type[OPERAOptions]] = OPERAOptions
    ROLES: ClassVar[tuple[str, ...]] = ("plan", "analysis", "rewrite", "synthesis")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"plan": 128, "analysis": 72, "rewrite": 40, "synthesis": 48}

    # the options, mirrored as attributes by Program.__init__
    top_k: int
    k_schedule: tuple[int, ...]
    max_rewrites: int
    max_steps: int
    max_sub_goals: int
    use_plan_agent: bool
    use_rewrite: bool
    final_synthesis: bool

    def _build_roles(self) -> None:
        if self.use_plan_agent:
            self.plan = dspy.Predict(PlanSubGoals)
        self.analysis = dspy.Predict(AnalyzeAnswer)
        if self.use_rewrite:
            self.rewrite = dspy.Predict(RewriteQuery)
        if self.final_synthesis:
            self.synthesis = dspy.Predict(SynthesizeAnswer)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """The built-in demos of every role (:func:`~rolecall.programs.opera.demos.default_opera_demos`)."""
        return default_opera_demos()

    # ------------------------------------------------------------------ entry points
    def execute_plan(
        self, question: str, sub_goals: Sequence[str], *, memo: OnceMemo[tuple[SubGoalResult, int]] | None = None
    ) -> dspy.Prediction:
        """Run the executor (analysis, rewrite and, when on, synthesis) on a given plan; never raises.

        MAPGRPO scores a candidate plan by executing it downstream (f_exec of Eq. 7) with this method. With a
        ``memo`` shared across calls, each distinct filled-in sub-goal is solved once: plans that share a sub-goal
        (and the same answers before it) reuse its answer, valid while the analysis and rewrite agents do not
        change. A reused sub-goal's retrieval and analysis steps are in the trajectory of the call that solved it.
        """
        trajectory = Trajectory(question=question)
        plan = [str(s).strip() for s in sub_goals if str(s).strip()][: self.max_sub_goals] or [question]
        return self.guarded(trajectory, self._run, question, trajectory, plan, memo)

    def _run(
        self,
        question: str,
        trajectory: Trajectory,
        plan: list[str] | None = None,
        memo: OnceMemo[tuple[SubGoalResult, int]] | None = None,
    ) -> dspy.Prediction:
        """Plan (unless ``plan`` is given), solve the sub-goals in order, then answer."""
        sub_goals = plan if plan is not None else self._plan(question, trajectory)
        results: list[SubGoalResult] = []
        budget = _StepBudget(self.max_steps)
        for index, text in enumerate(sub_goals, start=1):
            if budget.left <= 0:
                step = trajectory.event("budget_exhausted", sub_goal=index, max_steps=self.max_steps)
                step.error = f"step budget of {self.max_steps} spent before sub-goal {index} of {len(sub_goals)}"
                break
            if memo is None:
                results.append(self._solve(index, text, results, trajectory, budget))
            else:
                results.append(self._solve_once(memo, index, text, results, trajectory, budget))
        answer = self._final_answer(question, results, trajectory)
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            sub_goals=[{"sub_goal": r.filled, "answer": r.answer} for r in results],
        )

    # ------------------------------------------------------------------ the agents
    def _plan(self, question: str, trajectory: Trajectory) -> list[str]:
        if not self.use_plan_agent:
            return [question]
        pred = self.call_role("plan", trajectory, question=question)
        raw = list(pred.sub_goals) if pred is not None and pred.sub_goals else []
        sub_goals = [str(s).strip() for s in raw if str(s).strip()]
        sub_goals = drop_repeats(sub_goals)  # repeats would only redo work; later placeholders are renumbered
        if not sub_goals:
            reason = "plan unparseable" if pred is None else "plan empty"
            trajectory.event("plan_fallback", reason=reason)
            return [question]
        return truncate_plan(sub_goals, self.max_sub_goals, trajectory)

    def _solve(
        self, index: int, text: str, done: list[SubGoalResult], trajectory: Trajectory, budget: _StepBudget
    ) -> SubGoalResult:
        """Retrieve, analyze and rewrite for sub-goal ``index`` until a sufficient answer or the rounds run out."""
        filled, unresolved = fill_placeholders(text, {r.index: r.answer for r in done}, before=index)
        if unresolved:
            trajectory.event("unresolved_placeholder", sub_goal=index, placeholders=unresolved)
        result = SubGoalResult(index=index, text=text, filled=filled)
        query = filled
        rounds = 1 + (self.max_rewrites if self.use_rewrite else 0)
        best: tuple[float, str] = (-1.0, "")
        for attempt in range(rounds):
            if budget.left <= 0:
                step = trajectory.event("budget_exhausted", sub_goal=index, attempt=attempt, max_steps=self.max_steps)
                step.error = f"step budget of {self.max_steps} spent inside sub-goal {index}"
                break
            budget.left -= 1
            result.attempts += 1
            k = self.k_schedule[min(attempt, len(self.k_schedule) - 1)]
            retrieved = self.retrieve(trajectory, query, k)
            retrieval = trajectory.steps[-1]
            passages, shown, shown_ids = self.show_unseen_first(retrieved, result.seen_ids)
            retrieval.meta["shown_ids"] = shown_ids  # what the analysis agent saw (rewards and gold labels read it)
            pred = self.call_role("analysis", trajectory, sub_goal=filled, passages=shown)
            trajectory.steps[-1].meta.update(sub_goal=index, attempt=attempt, k=k)
            sufficient, answer, confidence, missing = _read_analysis(pred)
            if not is_null_answer(answer) and confidence > best[0]:
                best = (confidence, answer)
            if sufficient and not is_null_answer(answer):
                result.answer, result.sufficient, result.confidence = answer, True, confidence
                return result
            if attempt + 1 < rounds:
                query = self._rewrite(index, attempt, filled, passages, missing, trajectory)
        if best[1]:
            result.answer, result.confidence = best[1], best[0]
        trajectory.event("unresolved_sub_goal", sub_goal=index, best_guess=best[1] or None)
        return result

    def _solve_once(
        self,
        memo: OnceMemo[tuple[SubGoalResult, int]],
        index: int,
        text: str,
        done: list[SubGoalResult],
        trajectory: Trajectory,
        budget: _StepBudget,
    ) -> SubGoalResult:
        """:meth:`_solve` through ``memo``: a sub-goal's outcome depends only on its filled-in text and on the rounds
        the budget allows it (the retriever and the agents being fixed), so that pair is the key."""
        filled, _ = fill_placeholders(text, {r.index: r.answer for r in done}, before=index)
        rounds = min(budget.left, 1 + (self.max_rewrites if self.use_rewrite else 0))

        def solve() -> tuple[SubGoalResult, int]:
            own = _StepBudget(rounds)
            return self._solve(index, text, done, trajectory, own), rounds - own.left

        result, used = memo.get((filled, rounds), solve)
        budget.left -= used
        return replace(result, index=index, text=text, seen_ids=set(result.seen_ids))

    def _rewrite(
        self, index: int, attempt: int, sub_goal: str, passages: list[Passage], missing: str, trajectory: Trajectory
    ) -> str:
        # the rewrite agent sees the insufficient passages in half the context budget, one numbered line each
        budget = self.max_context_chars // 2
        shown = format_passages(passages, max_chars=min(self.max_passage_chars, budget), max_total_chars=budget)
        pred = self.call_role(
            "rewrite", trajectory, sub_goal=sub_goal, passages=shown, missing_information=missing or "the answer"
        )
        trajectory.steps[-1].meta.update(sub_goal=index, attempt=attempt)
        query = str(pred.query).strip() if pred is not None and pred.query else ""
        if not query:
            # keep going with a mechanical reformulation rather than repeating the same query
            query = f"{sub_goal} {missing}".strip() if missing else sub_goal
            trajectory.event("rewrite_fallback", sub_goal=index, attempt=attempt, query=query)
        return query

    def _final_answer(self, question: str, results: list[SubGoalResult], trajectory: Trajectory) -> str:
        """The synthesis role's answer (``final_synthesis``), else, or when it gives none, the last sub-goal's."""
        last = results[-1].answer if results else ""
        if not self.final_synthesis or not results:
            return last
        evidence = "\n".join(f"{r.filled} -> {r.answer or 'unknown'}" for r in results)
        pred = self.call_role("synthesis", trajectory, question=question, evidence=evidence)
        answer = str(pred.answer).strip() if pred is not None and pred.answer else ""
        if is_null_answer(answer):
            trajectory.event("synthesis_fallback", reason="no answer" if pred is not None else "unparseable")
            return last
        return answer


def _read_analysis(pred: dspy.Prediction | None) -> tuple[bool, str, float, str]:
    """``(sufficient, answer, confidence in [0, 1], missing_information)`` of an analysis output (a failed call: no)."""
    if pred is None:
        return False, "", 0.0, ""
    sufficient = str(pred.get("sufficient") or "").strip().lower() == "yes"
    answer = str(pred.get("answer") or "").strip()
    raw_conf = pred.get("confidence")
    try:
        confidence = float(raw_conf)
    except (TypeError, ValueError):
        confidence = CONFIDENCE_SCORES.get(str(raw_conf).strip().lower(), 0.5)
    missing = str(pred.get("missing_information") or "").strip()
    return sufficient, answer, max(0.0, min(1.0, confidence)), "" if is_null_answer(missing) else missing
