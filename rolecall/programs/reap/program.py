"""REAP: a Sub-task Planner and a Fact Extractor in a recursive loop over a retriever (arXiv 2511.09966).

Zhu et al., "REAP: Enhancing RAG with Recursive Evaluation and Adaptive Planning for Multi-Hop Question Answering",
AAAI 2026. Control flow (Sec. "Overall Architecture"):

    P_0 = {(id_i, q_i, deps_i)} = Decomposer(Q)
    for t = 1..T (T = 5 iterations):
        q_t <- the next ready sub-task (pending, deps resolved)    # max_tasks_per_iteration > 1: that many at once
        D_t <- retrieve(q_t, top-5)
        f_t = (s_t, e_t, r_t, l_t) = FactExtractor(q_t, D_t, F_{t-1})
        Sub-task Planner, routed by l_t:
            l_t = DirectAnswer        -> Plan Updater: substitute the answer, fork on several answers (rule-based)
            l_t = PartialClue/Failed  -> Re-Planner(Q, P_t, q_t, f_t, F_{t-1}): sufficient -> resolved; edit the
                                         sub-query; or prune the branch and inject new sub-tasks
        stop when no sub-task is pending
    answer = Synthesizer(Q, F)

The Re-Planner sees the whole plan P_t (every sub-task with its status and answer), as the paper's Sub-task Planner
"maintains the global task plan". Decomposer and Re-Planner share one LoRA adapter, ``planner`` (the paper trains one
model on their merged data; see :meth:`REAP.default_adapter_groups`).

"REAP w/o Re-Planner" (``use_replanner=False``) sends PartialClue / Failed facts to the rule-based updater as well: it
keeps the best partial fact's answer and moves on (or gives the sub-task up when there is none).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import dspy

from rolecall.programs.core.calls import read_list
from rolecall.programs.core.parallel import run_branches
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.plan import truncate_plan
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.reap.demos import default_reap_demos
from rolecall.programs.reap.options import REAPOptions
from rolecall.programs.reap.parse import normalize_action, normalize_level, parse_plan
from rolecall.programs.reap.plan import PlanNode, TaskPlan, has_answer
from rolecall.signatures.reap import (
    DecomposeTaskPlan,
    ExtractStructuredFact,
    FactTuple,
    RepairPlan,
    SubTask,
    SynthesizeFromFacts,
)
from rolecall.signatures.types import is_null_answer

__all__ = ["REAP", "REAPOptions", "RepairDecision"]

logger = logging.getLogger(__name__)


@dataclass
class RepairDecision:
    """The Re-Planner's output for one sub-task: an action, the usable answer, and new sub-question lines."""

    action: Literal["sufficient", "edit", "replace"]
    answer: str
    sub_questions: list[str]


class REAP(PassageProgram):
    """Recursive Evaluation and Adaptive Planning: Decomposer, Fact Extractor, Re-Planner and Synthesizer roles around
    a rule-based Plan Updater.

    Zhu et al., arXiv 2511.09966. Roles: ``decomposer`` (question -> plan lines ``"N. q (deps: ...)"``), ``extractor``
    (sub-question, known facts, passages -> statement, answer, level, evidence, reasoning), ``replanner`` (question,
    sub-question, fact, known facts, the whole plan -> action, answer, sub_questions) and ``synthesizer`` (question,
    facts -> answer). The Plan Updater is deterministic (``rolecall.programs.reap.plan``) and records
    ``plan_update`` / ``fork`` events; every role step carries ``sub_task``, ``task_id``, ``branch`` and ``iteration``
    in its ``meta`` for per-role, per-sub-task credit assignment.

    Takes :class:`Program`'s arguments and the options of :class:`~rolecall.programs.reap.options.REAPOptions`
    (``top_k``, ``max_iterations``, ``max_tasks_per_iteration``, ``use_replanner``, ...). Default token budgets:
    decomposer 160, extractor 128, replanner 96, synthesizer 32.

    Example:
        >>> program = REAP(retriever, lm=LocalLM())                                     # doctest: +SKIP
        >>> pred = program(question="Where was the director of The Grey Lantern born?")  # doctest: +SKIP
        >>> pred.answer, [s["answer"] for s in pred.sub_tasks]                          # doctest: +SKIP
    """

    Options: ClassVar[type[REAPOptions]] = REAPOptions
    ROLES: ClassVar[tuple[str, ...]] = ("decomposer", "extractor", "replanner", "synthesizer")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"decomposer": 160, "extractor": 128, "replanner": 96, "synthesizer": 32}

    def _build_roles(self) -> None:
        self.decomposer = dspy.Predict(DecomposeTaskPlan)
        self.extractor = dspy.Predict(ExtractStructuredFact)
        if self.use_replanner:
            self.replanner = dspy.Predict(RepairPlan)
        self.synthesizer = dspy.Predict(SynthesizeFromFacts)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """The built-in demos of every role (:func:`~rolecall.programs.reap.demos.reap_demos`)."""
        return default_reap_demos()

    def default_adapter_groups(self) -> dict[str, list[str]]:
        """Decomposer and Re-Planner share the ``planner`` adapter: the paper fine-tunes one model on their merged
        data ("Multi-task Fine-tuning"); the Fact Extractor and the Synthesizer have their own."""
        return {"planner": ["decomposer", "replanner"]}

    # ------------------------------------------------------------------ the loop
    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        """Returns ``Prediction(answer, trajectory, plan, sub_tasks, facts, iterations)``."""
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
        pred = self.call_role("decomposer", trajectory, salvage=True, question=question)
        step = trajectory.steps[-1]
        step.meta.update(iteration=0)
        lines = _items(pred.get("plan") if pred is not None else None)
        if step.error is not None and lines:
            trajectory.event("salvaged", role="decomposer", fields=["plan"])
        tasks, notes = parse_plan(lines)
        if notes:
            trajectory.event("plan_repaired", notes=notes)
        if not tasks:
            trajectory.event("plan_fallback", reason="plan unparseable" if step.error else "plan empty")
            return [SubTask(id=1, question=question)]
        return truncate_plan(tasks, self.max_sub_tasks, trajectory)

    # ------------------------------------------------------------------ one Planner-Extractor iteration
    def _iteration(
        self, question: str, plan: TaskPlan, batch: list[PlanNode], iteration: int, trajectory: Trajectory
    ) -> None:
        """Extract a fact for each sub-task of ``batch`` (one, by default), then route each by its level."""
        facts = run_branches(
            lambda node, local: self._extract(node, plan, iteration, local), batch, trajectory, parallel=self.parallel
        )
        for node, fact in zip(batch, facts, strict=True):
            node.facts.append(fact)
        # Sub-task Planner: DirectAnswer -> Plan Updater; PartialClue / Failed -> Re-Planner (within its repair budget)
        to_repair = [
            n
            for n, f in zip(batch, facts, strict=True)
            if f.level != "DirectAnswer" and self.use_replanner and n.repairs < self.max_repairs
        ]
        decisions = run_branches(
            lambda node, local: self._replan(question, node, plan, iteration, local),
            to_repair,
            trajectory,
            parallel=self.parallel,
        )
        by_uid = dict(zip([n.uid for n in to_repair], decisions, strict=True))
        for node, fact in zip(batch, facts, strict=True):
            if fact.level == "DirectAnswer":
                plan.resolve(node, fact.answer, trajectory, iteration=iteration)
            elif node.uid in by_uid:
                self._apply_repair(node, by_uid[node.uid], plan, trajectory, iteration)
            else:
                reason = "no_replanner" if not self.use_replanner else "repair_limit"
                self._fallback(node, plan, trajectory, iteration, reason)

    # ------------------------------------------------------------------ Fact Extractor
    def _extract(self, node: PlanNode, plan: TaskPlan, iteration: int, local: Trajectory) -> FactTuple:
        meta = {**node.meta(), "iteration": iteration, "attempt": len(node.facts)}
        query = node.question
        if node.unresolved:
            local.event("unresolved_placeholder", **meta, placeholders=node.unresolved)
        retrieved = self.retrieve(local, query, self.top_k)
        retrieval = local.steps[-1]
        _, shown, shown_ids = self.show_unseen_first(retrieved, node.seen_ids)
        retrieval.meta.update(meta, shown_ids=shown_ids)
        known = _fact_lines(plan.lineage_facts(node, self.max_known_facts))
        pred = self.call_role("extractor", local, salvage=True, sub_question=query, known_facts=known, passages=shown)
        step = local.steps[-1]
        step.meta.update(meta)
        fact = _read_fact(pred, step, local, meta)
        if fact.level == "DirectAnswer" and not fact.answers:
            fact.level = "PartialClue" if fact.brief() else "Failed"
            local.event("level_corrected", **meta, level=fact.level, reason="DirectAnswer without an answer")
        return fact

    # ------------------------------------------------------------------ Re-Planner
    def _replan(
        self, question: str, node: PlanNode, plan: TaskPlan, iteration: int, local: Trajectory
    ) -> RepairDecision | None:
        """One Re-Planner call on ``node``'s latest fact; it sees the whole plan (:meth:`TaskPlan.view`)."""
        meta = {**node.meta(), "iteration": iteration, "level": node.facts[-1].level}
        latest = node.facts[-1]
        known = [f for f in plan.lineage_facts(node, self.max_known_facts + 1) if f is not latest]
        pred = self.call_role(
            "replanner",
            local,
            salvage=True,
            question=question,
            sub_question=node.question,
            fact=_fact_text(latest),
            known_facts=_fact_lines(known[-self.max_known_facts :] if self.max_known_facts else []),
            plan=plan.view(node),
        )
        step = local.steps[-1]
        step.meta.update(meta)
        action = normalize_action(pred.get("action") if pred is not None else None)
        if action is None:
            return None
        if step.error is not None:
            local.event("salvaged", role="replanner", fields=sorted(step.meta.get("salvaged", {})), **meta)
        return RepairDecision(action, str(pred.get("answer") or ""), _items(pred.get("sub_questions")))

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
    """The fact of an extractor call; ``pred`` holds the fields salvaged from the raw completion when the adapter
    rejected it (``step.error`` set)."""
    names = list(ExtractStructuredFact.output_fields)
    if pred is None:
        return FactTuple(level="Failed")
    values = {k: str(pred.get(k) or "") for k in names}
    if step.error is not None:
        if not (values["answer"] or values["statement"]):
            return FactTuple(level="Failed")
        local.event("salvaged", role="extractor", fields=sorted(step.meta.get("salvaged", {})), **meta)
    values["level"] = normalize_level(values["level"])
    return FactTuple(**values)


def _items(value: Any) -> list[str]:
    """A list output: parsed (a list) or salvaged (its raw text, read with :func:`read_list`)."""
    if isinstance(value, str):
        return read_list(value)
    return [str(x) for x in value or []]


def _fact_text(fact: FactTuple) -> str:
    return f"level: {fact.level}; statement: {fact.statement or 'unknown'}; answer: {fact.answer or 'unknown'}"


def _fact_lines(facts: list[FactTuple]) -> str:
    return "\n".join(f"- {f.brief()}" for f in facts) or "none"
