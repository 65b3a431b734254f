"""STRIDE: a Meta-Planner, a Supervisor over the state Ω, and Extractor / Reasoner executors (SIGIR 2026).

Algorithm 1 of the paper (``seeds/stride.txt``), with T_max = ``max_iterations`` and k = ``top_k``:

    S_q = MetaPlanner(q); C_q = Planner(q, S_q); P_q = (S_q, C_q)      # Eq. 2, C_q instantiates S_q
    S, P, F = ∅, C_q, ∅                                                # Ω, see state.py
    for t = 1..T_max while P ≠ ∅:
        for each c_i ∈ P_ready = {c_i ∈ P | deps(c_i) ⊆ S}, concurrently:
            (α_i, z_i) = Supervisor(q, C_q, Ω, c_i)                    # Eq. 3, one call per ready c_i
            if α_i ∈ {retrieve, rewrite}:
                E_i = Extractor(z_i, top_k(z_i))                       # Eq. 4
                if E_i = ∅: F(c_i) <- F(c_i) ∪ {z_i}; continue
                a_i = Reasoner(c_i, E_i)                               # Eq. 5
            else: a_i = Reasoner(c_i, ⋃_{c_j ∈ S} E_j)
            S <- S ∪ {(c_i, a_i)}; P <- P \\ {c_i}
    a_final = a_last if P = ∅ else FallbackReasoner(q, P_q, facts, passages)

The Meta-Planner's two levels are two calls: the General Strategy S_q first, then the Concrete Plan C_q with S_q as an
input (the paper derives C_q "by instantiating S_q"). Both roles share one LoRA adapter, ``meta_planner``, by default
(the paper's single M_plan). The Fallback Reasoner sees the whole P_q: S_q and every sub-question with its answer or
``pending``.

Rules the paper states as principles and this program enforces (:mod:`rolecall.programs.stride.control`): a query
already in F(c_i) is logged as a ``repeated query`` failure and replaced by a fresh one
(:func:`~rolecall.programs.stride.state.fresh_query`), or the directive is dropped when none is left; ``answer`` with no
facts and nothing solved becomes a search; a Reasoner answer of "unknown" counts as a failure (reason ``no answer``)
rather than a solved sub-question, so it never fills a later placeholder. The Reasoner answers the filled sub-question
c_i (a rewritten z_i is a search string, not a question). The Fallback Reasoner's passages are "documents retrieved via
the facts of the last solved sub-question": one search with those facts as the query (the question itself when nothing
was solved).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import dspy

from rolecall.programs.core.calls import read_list
from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.parallel import run_branches
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.plan import truncate_plan
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.stride.control import MAX_QUERY_CHARS, record_failure, supervise
from rolecall.programs.stride.demos import default_stride_demos
from rolecall.programs.stride.parse import fit_demo, parse_facts
from rolecall.programs.stride.state import BranchOutcome, Directive, StrideState, format_facts
from rolecall.signatures.stride import (
    ConcretePlan,
    DirectPlan,
    ExtractFacts,
    FallbackAnswer,
    MetaPlan,
    ReasonAnswer,
    Supervise,
)
from rolecall.signatures.types import is_null_answer

__all__ = ["STRIDE", "STRIDEOptions", "ROLES"]

logger = logging.getLogger(__name__)

ROLES: tuple[str, ...] = ("meta_planner", "planner", "supervisor", "extractor", "reasoner", "fallback")
"""Every role STRIDE can have (the ablation flags remove some)."""


@dataclass(kw_only=True)
class STRIDEOptions(PassageOptions):
    """STRIDE's options: the budgets of Algorithm 1 and the paper's four ablation switches."""

    top_k: int = option(5, low=1)
    """k, passages retrieved per search (paper: 3 on 2Wiki and MuSiQue, 5 on HotpotQA)."""
    max_iterations: int = option(5, low=1)
    """T_max, Supervisor rounds per question (paper: 5); when spent, a ``budget_exhausted`` event and the Fallback."""
    max_sub_questions: int = option(5, low=1)
    """Concrete Plans longer than this are cut (event ``plan_truncated``)."""
    use_meta_planner: bool = True
    """False: "w/o Meta-Planner", no General Strategy; the planner writes a direct plan from the question alone."""
    use_supervisor: bool = True
    """False: "w/o Supervisor", sub-questions run in fixed order, each searched once with its own filled text, no
    rewrite or answer decisions; a failure abandons it and its dependents."""
    use_extractor: bool = True
    """False: "w/o Extractor", the raw passages go to the Reasoner."""
    use_fallback: bool = True
    """False: "w/o Fallback", an unresolved run answers with the last solved sub-answer, or ""."""


class STRIDE(PassageProgram):
    """Strategic Iterative Decision-making: Meta-Planner, Supervisor, Extractor, Reasoner and Fallback Reasoner.

    STRIDE (SIGIR 2026, ``seeds/stride.txt``). Roles: ``meta_planner`` (q -> General Strategy S_q over entity types),
    ``planner`` (q, S_q -> Concrete Plan C_q whose ``[entity from step N]`` placeholders are its dependencies; q alone
    without the Meta-Planner), ``supervisor`` (q, plan, Ω, a ready sub-question -> action ∈ {retrieve, rewrite,
    answer} and query), ``extractor`` (query, passages -> atomic facts), ``reasoner`` (sub-question, facts -> answer)
    and ``fallback`` (q, P_q, facts, passages -> answer). Ready sub-questions of one iteration run concurrently
    (:func:`~rolecall.programs.core.parallel.run_branches`), so their LM calls batch in a ``LocalLM``. Options: see
    :class:`STRIDEOptions`; default adapter groups: ``meta_planner`` = the Meta-Planner's two calls.

    Per-step meta for STRIDE-FT: the ``meta_planner`` step holds ``strategy``; the ``planner`` step holds
    ``strategy``, ``sub_questions`` and ``dependencies``; every ``supervisor`` step holds ``sub_question``,
    ``iteration``, ``action``, ``proposed_action``, ``query``, ``proposed_query``, ``attempt`` (searches made before),
    ``rewrite`` (a search after a failed one), ``repeated_query``, ``executed`` and ``resolved`` (read back by
    :func:`~rolecall.programs.stride.state.causal_rewrite_steps`); ``extractor`` steps hold ``facts``; retrieval and
    ``reasoner`` steps hold ``sub_question``, ``iteration``, ``attempt``. Each failure is an event ``failure`` (with
    ``error``) and an entry of ``prediction.state["failures"]``.

    Temperature: the paper samples every call at 1.0 (Qwen3-8B). The default here leaves the LM's own setting (greedy
    for ``LocalLM``): at 135M parameters sampling at 1.0 breaks the ChatAdapter format. Pass
    ``lm_kwargs={"*": {"temperature": 1.0, ...}}`` to follow the paper.

    Example:
        >>> program = STRIDE(retriever, lm=LocalLM(), top_k=3)                       # doctest: +SKIP
        >>> pred = program(question="Who is the father-in-law of Kranra Vrasov?")    # doctest: +SKIP
        >>> pred.answer, pred.state["failures"], pred.iterations                     # doctest: +SKIP
    """

    Options: ClassVar[type[STRIDEOptions]] = STRIDEOptions
    ROLES: ClassVar[tuple[str, ...]] = ROLES
    MAX_TOKENS: ClassVar[dict[str, int]] = {
        "meta_planner": 96,
        "planner": 128,
        "supervisor": 64,
        "extractor": 96,
        "reasoner": 32,
        "fallback": 40,
    }

    def _build_roles(self) -> None:
        if self.use_meta_planner:
            self.meta_planner = dspy.Predict(MetaPlan)
        self.planner = dspy.Predict(ConcretePlan if self.use_meta_planner else DirectPlan)
        if self.use_supervisor:
            self.supervisor = dspy.Predict(Supervise)
        if self.use_extractor:
            self.extractor = dspy.Predict(ExtractFacts)
        self.reasoner = dspy.Predict(ReasonAnswer)
        if self.use_fallback:
            self.fallback = dspy.Predict(FallbackAnswer)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """The built-in demos of :func:`~rolecall.programs.stride.demos.stride_demos`, each fitted to its role's
        signature (the direct-plan ablation's planner demos drop ``strategy``)."""
        roles = self.roles
        return {
            role: [fit_demo(d, roles[role].signature) for d in demos]
            for role, demos in default_stride_demos().items()
            if role in roles
        }

    def default_adapter_groups(self) -> dict[str, list[str]]:
        """One ``meta_planner`` adapter for the General Strategy and the Concrete Plan (the paper's one M_plan)."""
        return {"meta_planner": ["meta_planner", "planner"]}

    # ------------------------------------------------------------------ entry points
    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        """``Prediction(answer, trajectory, plan, state, iterations, sub_questions)``."""
        return self._solve(question, trajectory, self._plan(question, trajectory))

    def execute_plan(
        self, question: str, sub_questions: Sequence[str], strategy: Sequence[str] = ()
    ) -> dspy.Prediction:
        """Run the control and execution layers on a given plan P_q = (``strategy``, ``sub_questions``); never raises.

        STRIDE-FT's Meta-Planner DPO executes each of N sampled plans with this method and scores the outcome.
        """
        trajectory = Trajectory(question=question)
        return self.guarded(trajectory, self._execute_plan, question, trajectory, sub_questions, strategy)

    def _execute_plan(
        self, question: str, trajectory: Trajectory, sub_questions: Sequence[str], strategy: Sequence[str]
    ) -> dspy.Prediction:
        plan = [str(s).strip() for s in sub_questions if str(s).strip()][: self.max_sub_questions] or [question]
        return self._solve(question, trajectory, self._read_plan(plan, _clean(strategy), trajectory))

    # ------------------------------------------------------------------ strategy layer
    def _plan(self, question: str, trajectory: Trajectory) -> StrideState:
        """P_q = (S_q, C_q): the General Strategy, then the Concrete Plan instantiating it."""
        strategy: list[str] = []
        inputs: dict[str, Any] = {"question": question}
        if self.use_meta_planner:
            pred = self.call_role("meta_planner", trajectory, salvage=True, question=question)
            steps = pred.get("steps") if pred is not None else None
            strategy = _clean(read_list(steps) if isinstance(steps, str) else steps)  # a salvaged list is text
            trajectory.steps[-1].meta["strategy"] = strategy
            inputs["strategy"] = strategy
        pred = self.call_role("planner", trajectory, **inputs)
        step = trajectory.steps[-1]
        sub_questions = list(dict.fromkeys(_clean(pred.get("sub_questions") if pred is not None else None)))
        if not sub_questions:
            trajectory.event("plan_fallback", reason="plan unparseable" if pred is None else "plan empty")
            sub_questions = [question]
        sub_questions = truncate_plan(sub_questions, self.max_sub_questions, trajectory)
        state = self._read_plan(sub_questions, strategy, trajectory)
        step.meta.update(
            strategy=strategy,
            sub_questions=sub_questions,
            dependencies={sq.id: list(sq.depends_on) for sq in state.plan},
        )
        return state

    @staticmethod
    def _read_plan(sub_questions: list[str], strategy: list[str], trajectory: Trajectory) -> StrideState:
        state, dropped = StrideState.from_plan(sub_questions, strategy)
        if dropped:
            trajectory.event("bad_dependency", references=dropped)
        return state

    # ------------------------------------------------------------------ control loop
    def _solve(self, question: str, trajectory: Trajectory, state: StrideState) -> dspy.Prediction:
        iteration = 0
        abandoned: set[int] = set()  # fixed-order ablation: sub-questions given up after a failure
        while state.pending and iteration < self.max_iterations:
            ready = self._schedule(state, abandoned)
            if not ready:
                step = trajectory.event("blocked", pending=state.pending, abandoned=sorted(abandoned))
                step.error = f"sub-questions {state.pending} cannot run: a prerequisite failed"
                break
            iteration += 1
            trajectory.event("iteration", iteration=iteration, ready=ready)
            branch = functools.partial(self._branch, question, state, iteration)
            for outcome in run_branches(branch, ready, trajectory):  # plan order: Ω does not depend on thread timing
                self._merge(state, outcome, abandoned)
        else:
            if state.pending:
                step = trajectory.event("budget_exhausted", iteration=iteration, pending=state.pending)
                step.error = f"{self.max_iterations} iterations spent with sub-questions {state.pending} pending"
        answer = self._final_answer(question, state, trajectory)
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            plan={"strategy": list(state.strategy), "sub_questions": [sq.text for sq in state.plan]},
            state=state.to_dict(),
            iterations=iteration,
            sub_questions=[
                {"id": sq.id, "sub_question": state.filled(sq.id), "answer": state.solved.get(sq.id, "")}
                for sq in state.plan
            ],
        )

    def _schedule(self, state: StrideState, abandoned: set[int]) -> list[int]:
        if self.use_supervisor:
            return state.ready()
        # fixed sequential order: the first pending sub-question not given up whose prerequisites are solved
        return [i for i in state.ready() if i not in abandoned][:1]

    def _branch(
        self, question: str, state: StrideState, iteration: int, sq_id: int, branch: Trajectory
    ) -> BranchOutcome:
        """Supervise and execute one ready sub-question, recording into ``branch`` (Ω is only read here)."""
        out = BranchOutcome(sq_id=sq_id)
        if self.use_supervisor:
            out.directive = supervise(self, question, state, sq_id, iteration, branch, out)
        else:  # fixed order: each sub-question searched with its own filled text
            filled = state.filled(sq_id)
            out.directive = Directive(sq_id, "retrieve", filled, filled, state.attempts.get(sq_id, 0))
        if out.directive is not None:
            self._execute(state, out, out.directive, iteration, branch)
            if not out.resolved:
                record_failure(out, iteration, branch)
        if out.supervisor_step is not None:
            out.supervisor_step.meta.update(executed=out.executed, resolved=out.resolved)
        return out

    def _merge(self, state: StrideState, out: BranchOutcome, abandoned: set[int]) -> None:
        """Update Ω with one branch's outcome (its steps are in the trajectory already)."""
        state.failures.extend(out.failures)
        if out.directive is None:
            return
        if out.executed:
            state.attempts[out.sq_id] = state.attempts.get(out.sq_id, 0) + 1
        if out.resolved:
            state.resolve(out.sq_id, out.answer, out.facts)
        elif not self.use_supervisor:
            abandoned.add(out.sq_id)

    # ------------------------------------------------------------------ execution layer
    def _execute(
        self, state: StrideState, out: BranchOutcome, directive: Directive, iteration: int, branch: Trajectory
    ) -> None:
        """Run ``directive``: a search, the Extractor and the Reasoner, or the Reasoner over ⋃ E_j."""
        meta = {
            "sub_question": out.sq_id,
            "iteration": iteration,
            "attempt": directive.attempt,
            "action": directive.action,
        }
        if directive.action == "answer":  # reason over ⋃ E_j of the solved sub-questions
            evidence = format_facts(state.all_facts() + state.known_answers(), max_chars=self.max_context_chars)
        else:
            out.executed = True
            passages = self.retrieve(branch, directive.query, self.top_k)
            branch.steps[-1].meta.update(meta, rewrite=directive.is_rewrite)
            if not passages:
                out.failure = "empty retrieval"
                return
            seen = state.seen.setdefault(out.sq_id, set())  # a retry shows the passages it has not shown first
            _, shown, shown_ids = self.show_unseen_first(passages, seen)
            branch.steps[-1].meta["shown_ids"] = shown_ids
            evidence = self._evidence(directive.query, shown, branch, meta, out)
            if evidence is None:
                return
        pred = self.call_role("reasoner", branch, sub_question=state.filled(out.sq_id), facts=evidence)
        answer = str(pred.get("answer") or "").strip() if pred is not None else ""
        branch.steps[-1].meta.update(meta, answer=answer)
        if is_null_answer(answer):
            out.failure = "no answer" if pred is not None else "reasoner error"
        else:
            out.answer = answer

    def _evidence(
        self, query: str, shown: str, branch: Trajectory, meta: dict[str, Any], out: BranchOutcome
    ) -> str | None:
        """E_i as the Reasoner's ``facts`` (the raw passages without an Extractor); None when there are none."""
        if not self.use_extractor:
            out.facts = shown.splitlines()
            return shown
        pred = self.call_role("extractor", branch, query=query, passages=shown)
        facts = parse_facts(str(pred.get("facts") or "")) if pred is not None else []
        branch.steps[-1].meta.update(meta, facts=facts)
        if not facts:
            out.failure = "no facts" if pred is not None else "extractor error"
            return None
        out.facts = facts
        return format_facts(facts, max_chars=self.max_context_chars)

    # ------------------------------------------------------------------ final answer
    def _final_answer(self, question: str, state: StrideState, trajectory: Trajectory) -> str:
        if not state.pending:
            return state.solved[state.plan[-1].id]
        last = state.last_solved()
        last_answer = state.solved[last] if last is not None else ""
        if not self.use_fallback:
            trajectory.event("unresolved", pending=state.pending, answer=last_answer)
            return last_answer
        # documents retrieved via the facts of the last solved sub-question (the question when there are none)
        query = " ".join(state.facts.get(last, []) if last is not None else [])[:MAX_QUERY_CHARS] or question
        trajectory.event("fallback", pending=state.pending, query=query)
        logger.debug("STRIDE unresolved after %d failures; fallback query %r", len(state.failures), query)
        passages = self.retrieve(trajectory, query, self.top_k)
        shown = self.show_passages(passages)
        facts = format_facts(state.all_facts(), max_chars=self.max_context_chars)
        pred = self.call_role(
            "fallback", trajectory, question=question, plan=state.render_plan(), facts=facts, passages=shown
        )
        answer = str(pred.get("answer") or "").strip() if pred is not None else ""
        if is_null_answer(answer):
            trajectory.event("fallback_failed", answer=last_answer)
            return last_answer
        return answer


def _clean(items: Sequence[Any] | None) -> list[str]:
    """The non-empty items of a list output, stripped."""
    return [str(s).strip() for s in (items or []) if str(s).strip()]
