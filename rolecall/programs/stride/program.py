"""STRIDE: a Meta-Planner, a Supervisor over the state Ω, and Extractor / Reasoner executors (SIGIR 2026).

Algorithm 1 of the paper (``seeds/stride.txt``), with T_max = ``max_iterations`` and k = ``top_k``:

    P_q = (S_q, C_q) = MetaPlanner(q)                                  # Eq. 2
    S, P, F = ∅, C_q, ∅                                                # Ω, see stride_state.py
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

Rules the paper states as principles and this program enforces: a query already in F(c_i) is logged as a
``repeated query`` failure and replaced by a fresh one (:func:`~rolecall.programs.stride.state.fresh_query`), or the
directive is dropped when none is left; ``answer`` with no facts and nothing solved becomes a search; a Reasoner answer
of "unknown" counts as a failure (reason ``no answer``) rather than a solved sub-question, so it never fills a later
placeholder. The Reasoner answers the filled sub-question c_i (a rewritten z_i is a search string, not a question).
The Fallback Reasoner's passages are "documents retrieved via the facts of the last solved sub-question": one search
with those facts as the query (the question itself when nothing was solved).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.core.plan import fill_placeholders
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages, parallel_map
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.stride.demos import default_stride_demos, fit_demo
from rolecall.programs.stride.state import (
    BranchOutcome,
    Directive,
    StrideState,
    format_facts,
    fresh_query,
    normalize_query,
)
from rolecall.retrievers.base import Passage, Retriever
from rolecall.signatures.stride import (
    DirectPlan,
    ExtractFacts,
    FallbackAnswer,
    MetaPlan,
    ReasonAnswer,
    Supervise,
    parse_facts,
    read_action,
)
from rolecall.signatures.types import is_null_answer

__all__ = ["STRIDE", "ROLES"]

logger = logging.getLogger(__name__)

ROLES: tuple[str, ...] = ("meta_planner", "supervisor", "extractor", "reasoner", "fallback")
"""Every role STRIDE can have (the ablation flags remove some)."""

_MAX_TOKENS = {"meta_planner": 192, "supervisor": 64, "extractor": 96, "reasoner": 32, "fallback": 40}
_MAX_QUERY_CHARS = 200


class STRIDE(Program):
    """Strategic Iterative Decision-making: Meta-Planner, Supervisor, Extractor, Reasoner and Fallback Reasoner.

    STRIDE (SIGIR 2026, ``seeds/stride.txt``). Roles: ``meta_planner`` (q -> General Strategy over entity types and a
    Concrete Plan whose ``[entity from step N]`` placeholders are its dependencies), ``supervisor`` (q, plan, Ω, a
    ready sub-question -> action ∈ {retrieve, rewrite, answer} and query), ``extractor`` (query, passages -> atomic
    facts), ``reasoner`` (sub-question, facts -> answer) and ``fallback`` (q, plan, facts, passages -> answer).
    Ready sub-questions of one iteration run concurrently (:func:`~rolecall.programs.core.program.parallel_map`), so their LM
    calls batch in a ``LocalLM``.

    Per-step meta for STRIDE-FT: the ``meta_planner`` step holds ``strategy``, ``sub_questions`` and
    ``dependencies``; every ``supervisor`` step holds ``sub_question``, ``iteration``, ``action``, ``proposed_action``,
    ``query``, ``proposed_query``, ``attempt`` (searches made before), ``rewrite`` (a search after a failed one),
    ``repeated_query``, ``executed`` and ``resolved`` (read back by
    :func:`~rolecall.programs.stride.state.causal_rewrite_steps`);
    ``extractor`` steps hold ``facts``; retrieval and ``reasoner`` steps hold ``sub_question``, ``iteration``,
    ``attempt``. Each failure is an event ``failure`` (with ``error``) and an entry of ``prediction.state["failures"]``.

    Temperature: the paper samples every call at 1.0 (Qwen3-8B). The default here leaves the LM's own setting (greedy
    for ``LocalLM``): at 135M parameters sampling at 1.0 breaks the ChatAdapter format. Pass
    ``lm_kwargs={"*": {"temperature": 1.0, ...}}`` to follow the paper.

    Args:
        retriever: the retriever tool.
        lm: LM for every role (a ``LocalLM`` gets one LoRA adapter per role, see :class:`Program`).
        demos: ``"auto"`` (built-in demos), None (zero-shot, or keep what a loaded state sets), or a dict role ->
            list of ``dspy.Example`` (fields a role's signature lacks are dropped; unknown roles raise).
        top_k: passages retrieved per search (paper: 3 on 2Wiki/MuSiQue, 5 on HotpotQA).
        max_iterations: T_max, Supervisor rounds per question (paper: 5); when spent, ``budget_exhausted``.
        max_sub_questions: Concrete Plans longer than this are cut (event ``plan_truncated``).
        max_passage_chars: characters of one passage shown to an LM.
        max_context_chars: characters of all passages (or all facts) shown in one prompt.
        use_meta_planner: False -> a direct plan (one planner call without the General Strategy; "w/o Meta-Planner").
        use_supervisor: False -> fixed sequential order, each sub-question searched once with its own filled text, no
            rewrite or answer decisions; a failure abandons it and its dependents ("w/o Supervisor").
        use_extractor: False -> the raw passages go to the Reasoner ("w/o Extractor").
        use_fallback: False -> an unresolved run answers with the last solved sub-answer, or "" ("w/o Fallback").
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls (default ``dspy.settings.adapter``).
        lm_kwargs: LM call arguments by role, ``"*"`` for all. Default: stop on ChatAdapter's completion marker and
            token budgets meta_planner 192, supervisor 64, extractor 96, reasoner 32, fallback 40.

    Example:
        >>> program = STRIDE(retriever, lm=LocalLM(), top_k=3)                       # doctest: +SKIP
        >>> pred = program(question="Who is the father-in-law of Kranra Vrasov?")    # doctest: +SKIP
        >>> pred.answer, pred.state["failures"], pred.iterations                     # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Literal["auto"] | dict[str, list[dspy.Example]] | None = "auto",
        top_k: int = 5,
        max_iterations: int = 5,
        max_sub_questions: int = 5,
        max_passage_chars: int = 300,
        max_context_chars: int = 900,
        use_meta_planner: bool = True,
        use_supervisor: bool = True,
        use_extractor: bool = True,
        use_fallback: bool = True,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        for name, value in (
            ("top_k", top_k),
            ("max_iterations", max_iterations),
            ("max_sub_questions", max_sub_questions),
        ):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.max_iterations, self.max_sub_questions = top_k, max_iterations, max_sub_questions
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self.use_meta_planner, self.use_supervisor = use_meta_planner, use_supervisor
        self.use_extractor, self.use_fallback = use_extractor, use_fallback
        self._config |= {
            "top_k": top_k,
            "max_iterations": max_iterations,
            "max_sub_questions": max_sub_questions,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
            "use_meta_planner": use_meta_planner,
            "use_supervisor": use_supervisor,
            "use_extractor": use_extractor,
            "use_fallback": use_fallback,
        }
        # roles: plain attributes so named_predictors() and DSPy's optimizers see them
        self.meta_planner = dspy.Predict(MetaPlan if use_meta_planner else DirectPlan)
        if use_supervisor:
            self.supervisor = dspy.Predict(Supervise)
        if use_extractor:
            self.extractor = dspy.Predict(ExtractFacts)
        self.reasoner = dspy.Predict(ReasonAnswer)
        if use_fallback:
            self.fallback = dspy.Predict(FallbackAnswer)
        self._set_initial_demos(demos)
        self._bind_lm()

    def _set_initial_demos(self, demos: Any) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            demos = default_stride_demos()
        if not isinstance(demos, dict):
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")
        unknown = sorted(set(demos) - set(ROLES))
        if unknown:
            raise ConfigError(f"demos for unknown roles {unknown}; STRIDE's roles are {list(ROLES)}")
        roles = self.roles
        self.set_demos(
            {role: [fit_demo(d, roles[role].signature) for d in ds] for role, ds in demos.items() if role in roles}
        )

    # ------------------------------------------------------------------ forward
    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question``; returns ``Prediction(answer, trajectory, plan, state, iterations, sub_questions)``
        and never raises."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory, self._plan(question, trajectory))
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def execute_plan(
        self, question: str, sub_questions: Sequence[str], strategy: Sequence[str] = ()
    ) -> dspy.Prediction:
        """Run the control and execution layers on a given Concrete Plan; never raises.

        STRIDE-FT's Meta-Planner DPO executes each of N sampled plans with this method and scores the outcome.
        """
        trajectory = Trajectory(question=question)
        try:
            plan = [str(s).strip() for s in sub_questions if str(s).strip()][: self.max_sub_questions] or [question]
            state, dropped = StrideState.from_plan(plan, [str(s) for s in strategy])
            if dropped:
                trajectory.event("bad_dependency", references=dropped)
            return self._run(question, trajectory, state)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory, state: StrideState) -> dspy.Prediction:
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
            branches = parallel_map(lambda sq_id, t=iteration: self._execute(question, state, sq_id, t), ready)
            for branch in branches:  # merged in plan order, so Ω and the trajectory do not depend on thread timing
                self._merge(state, branch, iteration, trajectory, abandoned)
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

    # ------------------------------------------------------------------ strategy layer
    def _plan(self, question: str, trajectory: Trajectory) -> StrideState:
        pred = self.call_role("meta_planner", trajectory, question=question)
        step = trajectory.steps[-1]
        raw = pred.get("sub_questions") if pred is not None else None
        sub_questions = list(dict.fromkeys(str(s).strip() for s in (raw or []) if str(s).strip()))
        strategy = pred.get("strategy") if pred is not None and self.use_meta_planner else None
        strategy = [str(s).strip() for s in (strategy or []) if str(s).strip()]
        if not sub_questions:
            trajectory.event("plan_fallback", reason="plan unparseable" if pred is None else "plan empty")
            sub_questions = [question]
        if len(sub_questions) > self.max_sub_questions:
            trajectory.event("plan_truncated", planned=len(sub_questions), kept=self.max_sub_questions)
            sub_questions = sub_questions[: self.max_sub_questions]
        state, dropped = StrideState.from_plan(sub_questions, strategy)
        if dropped:
            trajectory.event("bad_dependency", references=dropped)
        step.meta.update(
            strategy=strategy,
            sub_questions=sub_questions,
            dependencies={sq.id: list(sq.depends_on) for sq in state.plan},
        )
        return state

    # ------------------------------------------------------------------ control layer
    def _schedule(self, state: StrideState, abandoned: set[int]) -> list[int]:
        if self.use_supervisor:
            return state.ready()
        # fixed sequential order: the first pending sub-question not given up whose prerequisites are solved
        runnable = [i for i in state.ready() if i not in abandoned]
        return runnable[:1]

    def _direct(
        self, question: str, state: StrideState, sq_id: int, iteration: int, branch: Trajectory, out: BranchOutcome
    ) -> Directive | None:
        """The Supervisor's directive for ``sq_id`` after the rules, or None when it must not run this iteration."""
        filled, failed = state.filled(sq_id), state.failed_queries(sq_id)
        attempt = state.attempts.get(sq_id, 0)
        if not self.use_supervisor:
            return Directive(sq_id, "retrieve", filled, filled, attempt)
        pred = self.call_role(
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
        query = self._clean_query(proposed, state, sq_id, failed, branch, iteration)
        repeated = action != "answer" and normalize_query(query) in {normalize_query(q) for q in failed}
        if repeated:  # z_i ∈ F(c_i): record it, then replace it with a fresh query or drop the directive
            out.repeated_query = query
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

    def _clean_query(
        self, query: str, state: StrideState, sq_id: int, failed: list[str], branch: Trajectory, iteration: int
    ) -> str:
        """The Supervisor's query with solved placeholders filled; when it is empty or refers to an unsolved step, the
        first of the sub-question and its reformulations that has not failed yet."""
        query, unresolved = fill_placeholders(query[:_MAX_QUERY_CHARS], state.solved, before=sq_id)
        if not query.strip() or unresolved or is_null_answer(query):
            reason = "unresolved placeholder" if unresolved else "empty query"
            branch.event("query_fallback", sub_question=sq_id, iteration=iteration, reason=reason, query=query)
            filled = state.filled(sq_id)
            return fresh_query(filled, failed) or filled
        return query.strip()

    # ------------------------------------------------------------------ execution layer
    def _execute(self, question: str, state: StrideState, sq_id: int, iteration: int) -> BranchOutcome:
        """Supervise and execute one ready sub-question on its own trajectory (Ω is only read here)."""
        branch, out = Trajectory(question=question), BranchOutcome(sq_id=sq_id)
        out.steps = branch.steps
        directive = out.directive = self._direct(question, state, sq_id, iteration, branch, out)
        if directive is None:
            return out
        filled = state.filled(sq_id)
        meta = {"sub_question": sq_id, "iteration": iteration, "attempt": directive.attempt, "action": directive.action}
        if directive.action == "answer":  # reason over ⋃ E_j of the solved sub-questions
            evidence = format_facts(state.all_facts() + state.known_answers(), max_chars=self.max_context_chars)
        else:
            out.executed = True
            passages = self.retrieve(branch, directive.query, self.top_k)
            branch.steps[-1].meta.update(meta, rewrite=directive.is_rewrite)
            if not passages:
                out.failure = "empty retrieval"
                return out
            evidence = self._evidence(directive.query, passages, branch, meta, out)
            if evidence is None:
                return out
        pred = self.call_role("reasoner", branch, sub_question=filled, facts=evidence)
        answer = str(pred.get("answer") or "").strip() if pred is not None else ""
        branch.steps[-1].meta.update(meta, answer=answer)
        if is_null_answer(answer):
            out.failure = "no answer" if pred is not None else "reasoner error"
        else:
            out.answer = answer
        return out

    def _evidence(
        self, query: str, passages: list[Passage], branch: Trajectory, meta: dict[str, Any], out: BranchOutcome
    ) -> str | None:
        """E_i as the Reasoner's ``facts`` (the raw passages without an Extractor); None when there are none."""
        shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
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

    def _merge(
        self, state: StrideState, b: BranchOutcome, iteration: int, trajectory: Trajectory, abandoned: set[int]
    ) -> None:
        """Update Ω with one branch's outcome and append its steps to the question's trajectory."""
        for step in b.steps:
            trajectory.add(step)
        if b.repeated_query is not None:
            state.log_failure(b.sq_id, b.repeated_query, "repeated query", iteration)
        if b.directive is None:
            return
        if b.executed:
            state.attempts[b.sq_id] = state.attempts.get(b.sq_id, 0) + 1
        resolved = not is_null_answer(b.answer)
        if resolved:
            state.resolve(b.sq_id, b.answer, b.facts)
        else:
            failure = state.log_failure(b.sq_id, b.directive.query, b.failure or "no answer", iteration)
            event = trajectory.event("failure", **{k: v for k, v in vars(failure).items()})
            event.error = f"sub-question {b.sq_id}: {failure.reason} for query {failure.query!r}"
            if not self.use_supervisor:
                abandoned.add(b.sq_id)
        if b.supervisor_step is not None:
            b.supervisor_step.meta.update(executed=b.executed, resolved=resolved)

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
        query = " ".join(state.facts.get(last, []) if last is not None else [])[:_MAX_QUERY_CHARS] or question
        trajectory.event("fallback", pending=state.pending, query=query)
        logger.debug("STRIDE unresolved after %d failures; fallback query %r", len(state.failures), query)
        passages = self.retrieve(trajectory, query, self.top_k)
        shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
        facts = format_facts(state.all_facts(), max_chars=self.max_context_chars)
        pred = self.call_role(
            "fallback", trajectory, question=question, plan=state.render(), facts=facts, passages=shown
        )
        answer = str(pred.get("answer") or "").strip() if pred is not None else ""
        if is_null_answer(answer):
            trajectory.event("fallback_failed", answer=last_answer)
            return last_answer
        return answer
