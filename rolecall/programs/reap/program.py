"""REAP: a Sub-task Planner and a Fact Extractor in a recursive loop over a retriever (arXiv 2511.09966).

Zhu et al., "REAP: Enhancing RAG with Recursive Evaluation and Adaptive Planning for Multi-Hop Question Answering",
AAAI 2026. Control flow (Sec. "Overall Architecture"):

    P_0 = {(id_i, q_i, deps_i)} = Decomposer(Q)
    for t = 1..T (T = 5 iterations):
        ready <- the pending sub-tasks whose deps are resolved (independent ones, e.g. forked branches, run together)
        for each ready q_t:
            D_t <- retrieve(q_t, top-5)
            f_t = (s_t, e_t, r_t, l_t) = FactExtractor(q_t, D_t, F_{t-1})
        for each f_t:                                            # Sub-task Planner, routed by l_t
            l_t = DirectAnswer        -> Plan Updater: substitute the answer, fork on several answers (rule-based)
            l_t = PartialClue/Failed  -> Re-Planner: sufficient -> resolved; edit the sub-query; or prune the branch
                                         and inject new sub-tasks
        stop when no sub-task is pending
    answer = Synthesizer(Q, F)

"REAP w/o Re-Planner" (``use_replanner=False``) sends PartialClue / Failed facts to the rule-based updater as well: it
keeps the best partial fact's answer and moves on (or gives the sub-task up when there is none).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages, parallel_map
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.reap.demos import default_reap_demos
from rolecall.programs.reap.parse import normalize_action, normalize_level, parse_plan, read_list, read_sections
from rolecall.programs.reap.plan import PlanNode, TaskPlan, has_answer
from rolecall.retrievers.base import Passage, Retriever
from rolecall.signatures.reap import (
    DecomposeTaskPlan,
    ExtractStructuredFact,
    FactTuple,
    RepairPlan,
    SubTask,
    SynthesizeFromFacts,
)
from rolecall.signatures.types import is_null_answer

__all__ = ["REAP", "RepairDecision"]

logger = logging.getLogger(__name__)

R = TypeVar("R")

_MAX_TOKENS = {"decomposer": 160, "extractor": 128, "replanner": 96, "synthesizer": 32}


@dataclass
class RepairDecision:
    """The Re-Planner's output for one sub-task: an action, the usable answer, and new sub-question lines."""

    action: Literal["sufficient", "edit", "replace"]
    answer: str
    sub_questions: list[str]


class REAP(Program):
    """Recursive Evaluation and Adaptive Planning: Decomposer, Fact Extractor, Re-Planner and Synthesizer roles around
    a rule-based Plan Updater.

    Zhu et al., arXiv 2511.09966. Roles: ``decomposer`` (question -> plan lines ``"N. q (deps: ...)"``), ``extractor``
    (sub-question, known facts, passages -> statement, answer, level, evidence, reasoning), ``replanner`` (question,
    sub-question, fact, known facts, later steps -> action, answer, sub_questions) and ``synthesizer`` (question,
    facts -> answer). The Plan Updater is deterministic (``rolecall.programs.reap.plan``) and records
    ``plan_update`` / ``fork`` events; every role step carries ``sub_task``, ``task_id``, ``branch`` and ``iteration``
    in its ``meta`` for per-role, per-sub-task credit assignment.

    Args:
        retriever: the retriever tool.
        lm: LM for every role (a ``LocalLM`` gets one LoRA adapter per role, see :class:`Program`).
        demos: ``"auto"`` (built-in demos from a small synthetic world), None (zero-shot, or keep what a loaded state
            sets), or a dict role -> list of ``dspy.Example``.
        top_k: passages retrieved per sub-query (the paper's top-5).
        max_iterations: Planner-Extractor iterations (the paper's 5); when pending sub-tasks remain after them the run
            records ``budget_exhausted`` and synthesizes from the facts it has.
        max_sub_tasks: longer plans (and longer injected sequences) are cut, recorded as ``plan_truncated``.
        max_branches: most parallel branches one fork creates.
        max_repairs: Re-Planner repairs per sub-task; past it the sub-task goes to the rule-based fallback.
        max_tasks_per_iteration: most ready sub-tasks one iteration runs (the rest wait for the next).
        max_known_facts: earlier facts F_{t-1} shown to the Fact Extractor and Re-Planner.
        max_passage_chars: characters of one passage shown to an LM.
        max_context_chars: characters of all passages shown in one prompt.
        use_replanner: False -> the "REAP w/o Re-Planner" ablation (PartialClue / Failed go to the rule-based updater).
        parallel: run the ready sub-tasks of one iteration concurrently (their LM calls batch in a ``LocalLM``).
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls (default ``dspy.settings.adapter``).
        lm_kwargs: LM call arguments by role, ``"*"`` for all. Default: stop on ChatAdapter's completion marker and
            token budgets decomposer 160, extractor 128, replanner 96, synthesizer 32.

    Example:
        >>> program = REAP(retriever, lm=LocalLM())                                     # doctest: +SKIP
        >>> pred = program(question="Where was the director of The Grey Lantern born?")  # doctest: +SKIP
        >>> pred.answer, [s["answer"] for s in pred.sub_tasks]                          # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Literal["auto"] | dict[str, list[dspy.Example]] | None = "auto",
        top_k: int = 5,
        max_iterations: int = 5,
        max_sub_tasks: int = 5,
        max_branches: int = 3,
        max_repairs: int = 2,
        max_tasks_per_iteration: int = 4,
        max_known_facts: int = 4,
        max_passage_chars: int = 300,
        max_context_chars: int = 1000,
        use_replanner: bool = True,
        parallel: bool = True,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        options = {
            "top_k": top_k,
            "max_iterations": max_iterations,
            "max_sub_tasks": max_sub_tasks,
            "max_branches": max_branches,
            "max_repairs": max_repairs,
            "max_tasks_per_iteration": max_tasks_per_iteration,
            "max_known_facts": max_known_facts,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
            "use_replanner": use_replanner,
            "parallel": parallel,
        }
        _check_options(options)
        for name, value in options.items():  # top_k, max_iterations, ..., use_replanner, parallel
            setattr(self, name, value)
        self._config |= options
        # roles: plain attributes so named_predictors() and DSPy's optimizers see them
        self.decomposer = dspy.Predict(DecomposeTaskPlan)
        self.extractor = dspy.Predict(ExtractStructuredFact)
        if use_replanner:
            self.replanner = dspy.Predict(RepairPlan)
        self.synthesizer = dspy.Predict(SynthesizeFromFacts)
        self._set_initial_demos(demos)
        self._bind_lm()

    def _set_initial_demos(self, demos: Any) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            demos = default_reap_demos()
        if not isinstance(demos, dict):
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")
        unknown = sorted(set(demos) - {"decomposer", "extractor", "replanner", "synthesizer"})
        if unknown:
            raise ConfigError(
                f"demos for unknown REAP roles {unknown}; roles are decomposer, extractor, replanner, synthesizer"
            )
        self.set_demos({role: d for role, d in demos.items() if role in self.roles})

    # ------------------------------------------------------------------ forward
    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question``; returns ``Prediction(answer, trajectory, plan, sub_tasks, facts, iterations)`` and
        never raises."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        tasks = self._decompose(question, trajectory)
        plan = TaskPlan(tasks, max_branches=self.max_branches)
        iterations = 0
        while not plan.finished:
            ready = plan.ready()
            if not ready:  # cannot happen with an acyclic plan; never loop on it
                trajectory.event("plan_stuck", pending=[n.uid for n in plan.pending()]).error = "no ready sub-task"
                break
            if iterations >= self.max_iterations:
                step = trajectory.event(
                    "budget_exhausted", max_iterations=self.max_iterations, pending=[n.uid for n in plan.pending()]
                )
                step.error = f"{len(plan.pending())} sub-tasks still pending after {self.max_iterations} iterations"
                break
            iterations += 1
            self._iteration(question, plan, ready[: self.max_tasks_per_iteration], iterations, trajectory)
        answer = self._synthesize(question, plan, iterations, trajectory)
        facts = [{**n.meta(), "question": n.question, **f.model_dump()} for n in plan.nodes.values() for f in n.facts]
        return dspy.Prediction(
            answer=answer,
            trajectory=trajectory,
            plan=[t.line() for t in tasks],
            sub_tasks=plan.summary(),
            facts=facts,
            iterations=iterations,
        )

    # ------------------------------------------------------------------ Decomposer
    def _decompose(self, question: str, trajectory: Trajectory) -> list[SubTask]:
        pred = self.call_role("decomposer", trajectory, question=question)
        step = trajectory.steps[-1]
        step.meta.update(iteration=0)
        if pred is not None:
            lines = [str(x) for x in (pred.plan or [])]
        else:
            lines = read_list(_salvage(step, ["plan"]).get("plan", ""))
            if lines:
                trajectory.event("salvaged", role="decomposer", fields=["plan"])
        tasks, notes = parse_plan(lines)
        if notes:
            trajectory.event("plan_repaired", notes=notes)
        if not tasks:
            trajectory.event("plan_fallback", reason="plan unparseable" if pred is None else "plan empty")
            return [SubTask(id=1, question=question)]
        if len(tasks) > self.max_sub_tasks:
            trajectory.event("plan_truncated", planned=len(tasks), kept=self.max_sub_tasks)
            tasks = tasks[: self.max_sub_tasks]
        return tasks

    # ------------------------------------------------------------------ one Planner-Extractor iteration
    def _iteration(
        self, question: str, plan: TaskPlan, wave: list[PlanNode], iteration: int, trajectory: Trajectory
    ) -> None:
        facts = self._map(lambda node: self._extract(node, plan, iteration, question), wave, trajectory)
        for node, fact in zip(wave, facts, strict=True):
            node.facts.append(fact)
        # Sub-task Planner: DirectAnswer -> Plan Updater; PartialClue / Failed -> Re-Planner (within its repair budget)
        to_repair = [
            n
            for n, f in zip(wave, facts, strict=True)
            if f.level != "DirectAnswer" and self.use_replanner and n.repairs < self.max_repairs
        ]
        decisions = self._map(lambda node: self._replan(question, node, plan, iteration), to_repair, trajectory)
        by_uid = dict(zip([n.uid for n in to_repair], decisions, strict=True))
        for node, fact in zip(wave, facts, strict=True):
            meta = {"iteration": iteration}
            if fact.level == "DirectAnswer":
                plan.resolve(node, fact.answer, trajectory, **meta)
            elif node.uid in by_uid:
                self._apply_repair(node, by_uid[node.uid], plan, trajectory, iteration)
            else:
                reason = "no_replanner" if not self.use_replanner else "repair_limit"
                self._fallback(node, plan, trajectory, iteration, reason)

    def _map(
        self, fn: Callable[[PlanNode], tuple[R, Trajectory]], nodes: Sequence[PlanNode], trajectory: Trajectory
    ) -> list[R]:
        """Run ``fn`` on each node (concurrently when ``parallel``); merge each node's steps in node order."""
        results = parallel_map(fn, list(nodes), max_workers=None if self.parallel else 1)
        for _, local in results:
            for step in local.steps:
                trajectory.add(step)
        return [r for r, _ in results]

    # ------------------------------------------------------------------ Fact Extractor
    def _extract(self, node: PlanNode, plan: TaskPlan, iteration: int, question: str) -> tuple[FactTuple, Trajectory]:
        local = Trajectory(question=question)
        meta = {**node.meta(), "iteration": iteration, "attempt": len(node.facts)}
        query = node.question
        if node.unresolved:
            local.event("unresolved_placeholder", **meta, placeholders=node.unresolved)
        passages = _fresh_first(self.retrieve(local, query, self.top_k), node.seen_ids)
        local.steps[-1].meta.update(meta)
        shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
        known = _fact_lines(plan.lineage_facts(node, self.max_known_facts))
        pred = self.call_role("extractor", local, sub_question=query, known_facts=known, passages=shown)
        step = local.steps[-1]
        step.meta.update(meta)
        fact = _read_fact(pred, step, local, meta)
        if fact.level == "DirectAnswer" and not fact.answers:
            fact.level = "PartialClue" if fact.brief() else "Failed"
            local.event("level_corrected", **meta, level=fact.level, reason="DirectAnswer without an answer")
        return fact, local

    # ------------------------------------------------------------------ Re-Planner
    def _replan(
        self, question: str, node: PlanNode, plan: TaskPlan, iteration: int
    ) -> tuple[RepairDecision | None, Trajectory]:
        local = Trajectory(question=question)
        meta = {**node.meta(), "iteration": iteration, "level": node.facts[-1].level}
        later = plan.descendants([node.uid])
        latest = node.facts[-1]
        known = [f for f in plan.lineage_facts(node, self.max_known_facts + 1) if f is not latest]
        pred = self.call_role(
            "replanner",
            local,
            question=question,
            sub_question=node.question,
            fact=_fact_text(latest),
            known_facts=_fact_lines(known[-self.max_known_facts :] if self.max_known_facts else []),
            later_steps=plan.lines(later),
        )
        step = local.steps[-1]
        step.meta.update(meta)
        if pred is not None:
            action = normalize_action(pred.action)
            subs = [str(x) for x in pred.sub_questions or []]
            return (RepairDecision(action, str(pred.answer or ""), subs) if action else None), local
        raw = _salvage(step, ["action", "answer", "sub_questions"])
        action = normalize_action(raw.get("action"))
        if action is None:
            return None, local
        local.event("salvaged", role="replanner", fields=sorted(raw), **meta)
        return RepairDecision(action, raw.get("answer", ""), read_list(raw.get("sub_questions", ""))), local

    def _apply_repair(
        self, node: PlanNode, decision: RepairDecision | None, plan: TaskPlan, trajectory: Trajectory, iteration: int
    ) -> None:
        meta = {**node.meta(), "iteration": iteration}
        if decision is None:
            return self._fallback(node, plan, trajectory, iteration, "replanner_unusable")
        if decision.action == "sufficient":
            best = node.best_fact
            answer = decision.answer if not is_null_answer(decision.answer) else (best.answer if best else "")
            if is_null_answer(answer):
                return self._fallback(node, plan, trajectory, iteration, "sufficient_without_answer")
            trajectory.event("replan", **meta, action="sufficient", answer=answer)
            plan.resolve(node, answer, trajectory, iteration=iteration)
        elif decision.action == "edit":
            tasks, _ = parse_plan(decision.sub_questions[:1])
            new = tasks[0].question if tasks else ""
            if not new or new.strip().lower() == node.question.strip().lower():
                return self._fallback(node, plan, trajectory, iteration, "edit_without_change")
            plan.edit(node, new)
            trajectory.event("replan", **meta, action="edit", query=node.question)
        else:
            tasks, notes = parse_plan(decision.sub_questions)
            tasks = tasks[: self.max_sub_tasks]
            if not tasks and not node.branch:  # pruning the trunk without a replacement would drop the question
                return self._fallback(node, plan, trajectory, iteration, "replace_without_sub_tasks")
            pruned, injected = plan.replace(node, tasks)
            trajectory.event("replan", **meta, action="replace", pruned=pruned, injected=injected, notes=notes)

    def _fallback(self, node: PlanNode, plan: TaskPlan, trajectory: Trajectory, iteration: int, reason: str) -> None:
        """Rule-based handling of a PartialClue / Failed fact: keep the best partial answer and move on (an answer
        the extractor itself marked Failed is not kept)."""
        best = node.best_fact
        step = trajectory.event("fallback", **node.meta(), iteration=iteration, reason=reason)
        if has_answer(best) and best.level != "Failed":
            step.meta.update(answer=best.answer, level=best.level)
            plan.resolve(node, best.answer, trajectory, iteration=iteration)
        else:
            step.meta.update(answer=None)
            plan.give_up(node, trajectory, iteration=iteration)

    # ------------------------------------------------------------------ Synthesizer
    def _synthesize(self, question: str, plan: TaskPlan, iterations: int, trajectory: Trajectory) -> str:
        resolved = plan.resolved()
        lines = [f"{n.question} -> {n.answer}" for n in resolved]
        if not lines:  # nothing resolved: pass on whatever clues were found
            lines = [f"clue: {f.brief()}" for n in plan.nodes.values() for f in n.facts if f.brief()]
        pred = self.call_role("synthesizer", trajectory, question=question, facts="\n".join(lines) or "none")
        trajectory.steps[-1].meta.update(iteration=iterations + 1)
        answer = str(pred.answer).strip() if pred is not None and pred.answer else ""
        if is_null_answer(answer):
            answer = resolved[-1].answer.split(";")[0].strip() if resolved else ""
            trajectory.event("answer_fallback", answer=answer or None)
        return answer


def _read_fact(pred: dspy.Prediction | None, step: Step, local: Trajectory, meta: dict[str, Any]) -> FactTuple:
    """The fact of an extractor call; fields salvaged from the raw completion when the adapter rejected it."""
    names = ["statement", "answer", "level", "evidence", "reasoning"]
    if pred is not None:
        values = {k: str(pred.get(k) or "") for k in names}
    else:
        values = _salvage(step, names)
        if not (values.get("answer") or values.get("statement")):
            return FactTuple(level="Failed")
        local.event("salvaged", role="extractor", fields=sorted(values), **meta)
    values["level"] = normalize_level(values.get("level"))
    return FactTuple(**{k: values.get(k, "") for k in names})


def _salvage(step: Step, names: list[str]) -> dict[str, str]:
    """Fields readable in the raw completions of a failed role call (the first ChatAdapter attempt first)."""
    texts = [c for a in step.meta.get("attempts", []) for c in a.get("completions", [])]
    texts.append(step.completion or "")
    out: dict[str, str] = {}
    for text in texts:
        for k, v in read_sections(text, names).items():
            out.setdefault(k, v)
    return out


def _fact_text(fact: FactTuple) -> str:
    return f"level: {fact.level}; statement: {fact.statement or 'unknown'}; answer: {fact.answer or 'unknown'}"


def _fact_lines(facts: list[FactTuple]) -> str:
    return "\n".join(f"- {f.brief()}" for f in facts) or "none"


def _fresh_first(passages: list[Passage], seen: set[str]) -> list[Passage]:
    """Unseen passages first (a repaired sub-query should show new evidence), then the seen ones."""
    fresh = [p for p in passages if p.id not in seen]
    ordered = fresh + [p for p in passages if p.id in seen]
    seen.update(p.id for p in passages)
    return ordered


def _check_options(options: dict[str, Any]) -> None:
    for name in ("top_k", "max_iterations", "max_sub_tasks", "max_branches", "max_tasks_per_iteration"):
        value = options[name]
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    for name in ("max_repairs", "max_known_facts"):
        value = options[name]
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
    if options["max_passage_chars"] < 20 or options["max_context_chars"] < options["max_passage_chars"]:
        raise ConfigError(
            "need 20 <= max_passage_chars <= max_context_chars, got "
            f"{options['max_passage_chars']} and {options['max_context_chars']}"
        )
