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
    answer = a_m                                              # (or Synthesize(q, {p_i, a_i}) with final_synthesis)

The Trajectory Memory Component is the :class:`~rolecall.programs.core.trajectory.Trajectory` every run returns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.core.plan import fill_placeholders
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.opera.demos import default_opera_demos
from rolecall.retrievers.base import Passage, Retriever
from rolecall.signatures.opera import AnalyzeAnswer, PlanSubGoals, RewriteQuery, SynthesizeAnswer
from rolecall.signatures.types import CONFIDENCE_SCORES, is_null_answer

__all__ = ["OPERA", "SubGoalResult"]

logger = logging.getLogger(__name__)

_MAX_TOKENS = {"plan": 128, "analysis": 72, "rewrite": 40, "synthesis": 48}


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


class OPERA(Program):
    """Orchestrated Planner-Executor Reasoning Architecture: Plan, Analysis-Answer and Rewrite agents over a retriever.

    Liu et al., "OPERA: A Reinforcement Learning-Enhanced Orchestrated Planner-Executor Architecture for
    Reasoning-Oriented Multi-Hop Retrieval", arXiv 2508.16438. Roles: ``plan`` (question -> sub-goals), ``analysis``
    (sub-goal, passages -> sufficient, answer, confidence, missing_information) and ``rewrite`` (sub-goal, passages,
    missing_information -> query); ``synthesis`` when ``final_synthesis=True``.

    Args:
        retriever: the retriever tool.
        lm: LM for every role (a ``LocalLM`` gets one LoRA adapter per role, see :class:`Program`).
        demos: ``"auto"`` (built-in demos from a small synthetic world), None (zero-shot, or keep what a loaded state
            sets), or a dict role -> list of ``dspy.Example``.
        top_k: passages retrieved on the first attempt (the paper's k = 5).
        k_schedule: passages retrieved on attempt 0, 1, 2, ... (default ``(top_k, 2 top_k, 3 top_k)``); the last value
            repeats.
        max_rewrites: rewrite-and-retrieve rounds per sub-goal after a "no" (reference code: 2).
        max_steps: budget of retrieve-and-analyze rounds per question (reference code: 6); when spent the run stops
            and records ``budget_exhausted``.
        max_sub_goals: plans longer than this are cut (recorded as ``plan_truncated``).
        max_passage_chars: characters of one passage shown to an LM.
        max_context_chars: characters of all passages shown in one prompt.
        use_plan_agent: False -> the question itself is the only sub-goal (the "w/o Plan Agent" ablation).
        use_rewrite: False -> one retrieve-and-analyze round per sub-goal (the "w/o Rewrite" ablation).
        final_synthesis: answer with a ``synthesis`` role over all sub-goal answers instead of the last sub-goal's.
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls (default ``dspy.settings.adapter``).
        lm_kwargs: LM call arguments by role, ``"*"`` for all (see :class:`Program`). Default: stop on ChatAdapter's
            completion marker, and token budgets plan 192, analysis 128, rewrite 64, synthesis 64 (a plan of five
            sub-goals needs about 130 tokens).

    Example:
        >>> program = OPERA(retriever, lm=LocalLM())                           # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, pred.trajectory.parse_rate("plan")                    # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Literal["auto"] | dict[str, list[dspy.Example]] | None = "auto",
        top_k: int = 5,
        k_schedule: Sequence[int] | None = None,
        max_rewrites: int = 2,
        max_steps: int = 6,
        max_sub_goals: int = 5,
        max_passage_chars: int = 300,
        max_context_chars: int = 900,
        use_plan_agent: bool = True,
        use_rewrite: bool = True,
        final_synthesis: bool = False,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        k_schedule = tuple(k_schedule) if k_schedule is not None else (top_k, 2 * top_k, 3 * top_k)
        _check_options(top_k, k_schedule, max_rewrites, max_steps, max_sub_goals, max_passage_chars, max_context_chars)
        self.top_k, self.k_schedule = top_k, k_schedule
        self.max_rewrites, self.max_steps, self.max_sub_goals = max_rewrites, max_steps, max_sub_goals
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self.use_plan_agent, self.use_rewrite, self.final_synthesis = use_plan_agent, use_rewrite, final_synthesis
        self._config |= {
            "top_k": top_k,
            "k_schedule": list(k_schedule),
            "max_rewrites": max_rewrites,
            "max_steps": max_steps,
            "max_sub_goals": max_sub_goals,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
            "use_plan_agent": use_plan_agent,
            "use_rewrite": use_rewrite,
            "final_synthesis": final_synthesis,
        }
        # roles: plain attributes so named_predictors() and DSPy's optimizers see them
        if use_plan_agent:
            self.plan = dspy.Predict(PlanSubGoals)
        self.analysis = dspy.Predict(AnalyzeAnswer)
        if use_rewrite:
            self.rewrite = dspy.Predict(RewriteQuery)
        if final_synthesis:
            self.synthesis = dspy.Predict(SynthesizeAnswer)
        self._set_initial_demos(demos)
        self._bind_lm()

    def _set_initial_demos(self, demos: Any) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            demos = default_opera_demos()
        if not isinstance(demos, dict):
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")
        self.set_demos({role: d for role, d in demos.items() if role in self.roles})

    # ------------------------------------------------------------------ forward
    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question``; returns ``Prediction(answer, trajectory, sub_goals)`` and never raises."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def execute_plan(self, question: str, sub_goals: Sequence[str]) -> dspy.Prediction:
        """Run the executor (analysis and rewrite agents) on a given plan; never raises.

        MAPGRPO scores a candidate plan by executing it downstream (f_exec of Eq. 7) with this method.
        """
        trajectory = Trajectory(question=question)
        try:
            plan = [str(s).strip() for s in sub_goals if str(s).strip()][: self.max_sub_goals] or [question]
            return self._run(question, trajectory, plan=plan)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory, plan: list[str] | None = None) -> dspy.Prediction:
        sub_goals = plan if plan is not None else self._plan(question, trajectory)
        results: list[SubGoalResult] = []
        budget = [self.max_steps]
        for index, text in enumerate(sub_goals, start=1):
            if budget[0] <= 0:
                step = trajectory.event("budget_exhausted", sub_goal=index, max_steps=self.max_steps)
                step.error = f"step budget of {self.max_steps} spent before sub-goal {index} of {len(sub_goals)}"
                break
            results.append(self._solve(index, text, results, trajectory, budget))
        answer = self._final_answer(question, results, trajectory)
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            sub_goals=[{"sub_goal": r.filled, "answer": r.answer} for r in results],
        )

    def _plan(self, question: str, trajectory: Trajectory) -> list[str]:
        if not self.use_plan_agent:
            return [question]
        pred = self.call_role("plan", trajectory, question=question)
        raw = list(pred.sub_goals) if pred is not None and pred.sub_goals else []
        sub_goals = [str(s).strip() for s in raw if str(s).strip()]
        sub_goals = list(dict.fromkeys(sub_goals))  # duplicates would only repeat work
        if not sub_goals:
            reason = "plan unparseable" if pred is None else "plan empty"
            trajectory.event("plan_fallback", reason=reason)
            return [question]
        if len(sub_goals) > self.max_sub_goals:
            trajectory.event("plan_truncated", planned=len(sub_goals), kept=self.max_sub_goals)
            sub_goals = sub_goals[: self.max_sub_goals]
        return sub_goals

    def _solve(
        self, index: int, text: str, done: list[SubGoalResult], trajectory: Trajectory, budget: list[int]
    ) -> SubGoalResult:
        answers = {r.index: r.answer for r in done}
        filled, unresolved = fill_placeholders(text, answers, before=index)
        if unresolved:
            trajectory.event("unresolved_placeholder", sub_goal=index, placeholders=unresolved)
        result = SubGoalResult(index=index, text=text, filled=filled)
        query = filled
        rounds = 1 + (self.max_rewrites if self.use_rewrite else 0)
        best: tuple[float, str] = (-1.0, "")
        for attempt in range(rounds):
            if budget[0] <= 0:
                step = trajectory.event("budget_exhausted", sub_goal=index, attempt=attempt, max_steps=self.max_steps)
                step.error = f"step budget of {self.max_steps} spent inside sub-goal {index}"
                break
            budget[0] -= 1
            result.attempts += 1
            k = self.k_schedule[min(attempt, len(self.k_schedule) - 1)]
            passages = self._fresh_first(self.retrieve(trajectory, query, k), result.seen_ids)
            shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
            pred = self.call_role("analysis", trajectory, sub_goal=filled, passages=shown)
            trajectory.steps[-1].meta.update(sub_goal=index, attempt=attempt, k=k)
            sufficient, answer, confidence, missing = _read_analysis(pred)
            if not is_null_answer(answer) and confidence > best[0]:
                best = (confidence, answer)
            if sufficient and not is_null_answer(answer):
                result.answer, result.sufficient, result.confidence = answer, True, confidence
                return result
            if attempt + 1 < rounds:
                query = self._rewrite(index, attempt, filled, shown, missing, trajectory)
        if best[1]:
            result.answer, result.confidence = best[1], best[0]
            trajectory.event("unresolved_sub_goal", sub_goal=index, best_guess=best[1])
        else:
            trajectory.event("unresolved_sub_goal", sub_goal=index, best_guess=None)
        return result

    def _fresh_first(self, passages: list[Passage], seen: set[str]) -> list[Passage]:
        """Unseen passages first (a larger k after a rewrite should show new evidence), then the seen ones."""
        fresh = [p for p in passages if p.id not in seen]
        ordered = fresh + [p for p in passages if p.id in seen]
        seen.update(p.id for p in passages)
        return ordered

    def _rewrite(
        self, index: int, attempt: int, sub_goal: str, shown: str, missing: str, trajectory: Trajectory
    ) -> str:
        pred = self.call_role(
            "rewrite",
            trajectory,
            sub_goal=sub_goal,
            passages=_short(shown, self.max_context_chars // 2),
            missing_information=missing or "the answer",
        )
        trajectory.steps[-1].meta.update(sub_goal=index, attempt=attempt)
        query = str(pred.query).strip() if pred is not None and pred.query else ""
        if not query:
            # keep going with a mechanical reformulation rather than repeating the same query
            query = f"{sub_goal} {missing}".strip() if missing and not is_null_answer(missing) else sub_goal
            trajectory.event("rewrite_fallback", sub_goal=index, attempt=attempt, query=query)
        return query

    def _final_answer(self, question: str, results: list[SubGoalResult], trajectory: Trajectory) -> str:
        last = results[-1].answer if results else ""
        if not self.final_synthesis or not results:
            return last
        evidence = "\n".join(f"{r.filled} -> {r.answer or 'unknown'}" for r in results)
        pred = self.call_role("synthesis", trajectory, question=question, evidence=evidence)
        answer = str(pred.answer).strip() if pred is not None and pred.answer else ""
        return last if is_null_answer(answer) else answer


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


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."


def _check_options(
    top_k: int,
    k_schedule: tuple[int, ...],
    max_rewrites: int,
    max_steps: int,
    max_sub_goals: int,
    max_passage_chars: int,
    max_context_chars: int,
) -> None:
    if top_k < 1:
        raise ConfigError(f"top_k must be >= 1, got {top_k}")
    if not k_schedule or any(not isinstance(k, int) or k < 1 for k in k_schedule):
        raise ConfigError(f"k_schedule must be a non-empty sequence of ints >= 1, got {k_schedule!r}")
    if max_rewrites < 0:
        raise ConfigError(f"max_rewrites must be >= 0, got {max_rewrites}")
    for name, value in (("max_steps", max_steps), ("max_sub_goals", max_sub_goals)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if max_passage_chars < 20 or max_context_chars < max_passage_chars:
        raise ConfigError(
            f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
        )
