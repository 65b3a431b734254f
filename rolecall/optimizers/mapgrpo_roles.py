"""The role-specific half of MAPGRPO for OPERA: where each role's training inputs come from, how a candidate is
scored, and what the expert c_best is.

- ``plan``: inputs are training questions; a candidate plan is executed downstream by the program's current
  analysis/rewrite agents (f_exec); the gold expert is the dataset's decomposition with ``#k`` as placeholders.
- ``analysis``: inputs are the (sub-goal, passages) pairs the program produced on training questions with the plan
  agent already trained (Eq. 5-6); gold φ*/a* come from the structured gold path: which gold step the sub-goal is,
  and whether a supporting passage of that step was among the passages shown
  (:func:`~rolecall.optimizers.rewards.opera.analysis_gold`).
- ``rewrite``: inputs are the (sub-goal, passages, missing information) triples of the program's rewrite calls,
  topped up with analysis calls whose gold judgement is "no" (with the missing information the analysis agent
  wrote); the reward is the NDCG of the new query's retrieval at the depth the program retrieves it with.

Plan executions (f_exec) are cached per (question, plan, versions of the downstream adapters): while the plan stage
trains, the downstream agents are frozen, so a plan sampled twice, or the expert plan, runs once; and inside the
distinct plans each distinct filled-in sub-goal is solved once, for the whole plan stage (``share_sub_goals``).

In one MAPGRPO step (the map in :mod:`rolecall.optimizers.mapgrpo`): :meth:`OperaRoleTasks.collect` gives the stage's
input pool (phase 0), :meth:`OperaRoleTasks.gold_expert` and :meth:`OperaRoleTasks.execute_plans` serve ``execute``
(phase 3) and :meth:`OperaRoleTasks.score` serves ``score`` (phase 4).
"""

from __future__ import annotations

import inspect
import logging
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rolecall.optimizers.mapgrpo_config import MAPGRPOConfig
from rolecall.optimizers.rewards.opera import (
    analysis_gold,
    analysis_reward,
    gold_step_index,
    plan_reward,
    rewrite_reward,
    synthesis_reward,
)
from rolecall.programs.core.memo import OnceMemo
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.plan import fill_placeholders, find_placeholders, hash_refs_to_placeholders
from rolecall.utils.text import holds_answer, normalize_answer

__all__ = [
    "GoldRecord",
    "RoleInput",
    "OperaRoleTasks",
    "as_gold_record",
    "evidence_holds_chain",
    "gold_plan",
    "plan_of",
]

logger = logging.getLogger(__name__)


@dataclass
class GoldRecord:
    """What rewards need to know about one training question."""

    question: str
    answers: list[str]
    supporting_ids: list[str] = field(default_factory=list)
    decomposition: list[dict[str, Any]] | None = None


def as_gold_record(example: Any) -> GoldRecord:
    """A :class:`GoldRecord` from a rolecall ``Example`` or a ``dspy.Example`` carrying the same fields."""

    def value(name: str, default: Any = None) -> Any:
        if isinstance(example, dict):
            return example.get(name, default)
        if hasattr(example, "toDict"):  # dspy.Example
            return example.get(name, default)
        return getattr(example, name, default)

    answers = value("answers") or ([value("answer")] if value("answer") else [])
    decomposition = value("decomposition")
    if decomposition:
        decomposition = [s if isinstance(s, dict) else vars(s) for s in decomposition]
    return GoldRecord(
        question=str(value("question")),
        answers=[str(a) for a in answers],
        supporting_ids=list(value("supporting_ids") or []),
        decomposition=decomposition or None,
    )


@dataclass
class RoleInput:
    """One training input of a role: its signature inputs plus what its reward needs."""

    inputs: dict[str, Any]
    record: GoldRecord
    gold: dict[str, Any] = field(default_factory=dict)


def _gold_step(sub_goal: str, record: GoldRecord, position: int | None = None) -> dict[str, Any] | None:
    """The gold step ``sub_goal`` is (:func:`gold_step_index`), with its question filled by the gold answers."""
    steps = record.decomposition or []
    index = gold_step_index(sub_goal, steps, position=position)
    if index is None:
        return None
    answers = {i: str(s.get("answer", "")) for i, s in enumerate(steps, 1)}
    text, _ = fill_placeholders(str(steps[index - 1].get("question", "")), answers, before=index)
    return {**steps[index - 1], "filled_question": text, "index": index}


def gold_plan(record: GoldRecord, *, compare: bool = False) -> list[str] | None:
    """The gold decomposition as a plan: ``#k`` written as the program's placeholders (None without one).

    A comparison's decomposition ends in independent look-ups that no later step uses ("In which year was A formed?",
    "... B formed?"): a final synthesis combines them, but a program that answers with its last sub-goal (OPERA's
    paper rule, ``final_synthesis=False``) would answer with a year. ``compare=True`` then appends the comparison
    itself as the last step, referring to those look-ups: the question, "given [year from step 1] and [year from
    step 2]".

    Example:
        >>> r = GoldRecord("Which band was formed earlier, A or B?", ["A"], decomposition=[
        ...     {"question": "In which year was A formed?", "answer": "1961"},
        ...     {"question": "In which year was B formed?", "answer": "2010"}])
        >>> gold_plan(r, compare=True)[-1]
        'Which band was formed earlier, A or B, given [year from step 1] and [year from step 2]?'
    """
    if not record.decomposition:
        return None
    answers = {i: str(s.get("answer", "")) for i, s in enumerate(record.decomposition, 1)}
    plan = [hash_refs_to_placeholders(str(s["question"]), answers) for s in record.decomposition]
    used = {p.step for text in plan for p in find_placeholders(text)}
    leaves = [i for i in range(1, len(plan) + 1) if i not in used]
    if compare and len(leaves) > 1:
        refs = " and ".join(f"#{i}" for i in leaves)
        plan.append(hash_refs_to_placeholders(f"{record.question.strip().rstrip('?')}, given {refs}?", answers))
    return plan


class OperaRoleTasks:
    """Input collection, scoring and experts for OPERA's three roles (see the module docstring)."""

    def __init__(self, program: Any, config: MAPGRPOConfig) -> None:
        self.program = program
        self.config = config
        self._executions: dict[tuple[Any, ...], str | None] = {}
        self._lock = threading.Lock()
        self._memo: tuple[tuple[Any, ...], OnceMemo] | None = None
        self.execution_stats = {"executed": 0, "cached": 0}
        """Plan executions run and served from the cache (``plan/executed``, ``plan/cached`` in the metrics) and,
        with ``share_sub_goals``, the sub-goals solved and reused inside them (``plan/sub_goals_solved``,
        ``plan/sub_goals_shared``; all counts since the start of training)."""

    # ------------------------------------------------------------------ inputs
    def collect(self, role: str, records: Sequence[GoldRecord], rng: random.Random) -> list[RoleInput]:
        """Training inputs of ``role``: every training question for ``plan`` (free: a plan's input is the question),
        otherwise the program's own calls on ``collect_questions`` questions drawn from the whole training set."""
        if role == "plan":
            return [RoleInput({"question": r.question}, r) for r in rng.sample(list(records), len(records))]
        chosen = rng.sample(list(records), min(len(records), self.config.collect_questions))
        # parallel_map keeps dspy.context overrides (the LM, the adapter, callbacks) in the worker threads
        preds = parallel_map(lambda r: self.program(question=r.question), chosen, max_workers=self.config.num_threads)
        items: list[RoleInput] = []
        for record, pred in zip(chosen, preds, strict=True):
            items.extend(self._from_trajectory(role, record, pred.trajectory))
        if role == "rewrite" and len(items) < self.config.inputs_per_step * 2:
            items.extend(self._rewrite_from_analysis(chosen, preds))
        rng.shuffle(items)
        return items

    def _from_trajectory(self, role: str, record: GoldRecord, trajectory: Any) -> list[RoleInput]:
        items = []
        shown_ids: list[str] = []
        for step in trajectory.steps:
            if step.kind == "retrieval":
                # what the analysis agent was shown (OPERA records it), else everything retrieved
                shown_ids = list(step.meta.get("shown_ids", step.outputs.get("passage_ids", [])))
            elif step.kind == "role" and step.role == role and step.inputs:
                inputs = dict(step.inputs)
                items.append(RoleInput(inputs, record, self._gold(role, inputs, shown_ids, record, step.meta)))
        return items

    def _rewrite_from_analysis(self, records: Sequence[GoldRecord], preds: Sequence[Any]) -> list[RoleInput]:
        """Analysis calls whose gold judgement is "no" are exactly where a rewrite is needed; the rewrite sees the
        missing information the analysis agent wrote, as the program would pass it on."""
        items = []
        for record, pred in zip(records, preds, strict=True):
            analyses = [s for s in pred.trajectory.steps if s.kind == "role" and s.role == "analysis" and s.inputs]
            for item, step in zip(self._from_trajectory("analysis", record, pred.trajectory), analyses, strict=True):
                if not item.gold["sufficient"]:
                    missing = str((step.outputs or {}).get("missing_information") or "").strip()
                    inputs = {**item.inputs, "missing_information": missing or "the answer"}
                    items.append(RoleInput(inputs, record, self._gold("rewrite", inputs, [], record, step.meta)))
        return items

    def _gold(
        self, role: str, inputs: dict[str, Any], shown_ids: list[str], record: GoldRecord, meta: dict[str, Any]
    ) -> dict[str, Any]:
        position = meta.get("sub_goal")
        if role == "analysis":
            passages = str(inputs.get("passages", ""))
            sufficient, answers = analysis_gold(
                str(inputs.get("sub_goal", "")), shown_ids, record.decomposition, record.supporting_ids,
                position=position,
            )  # fmt: skip
            # a retrieved passage the prompt did not show (context cut) cannot make the sub-goal answerable
            if sufficient and answers and not any(a.lower() in passages.lower() for a in answers):
                sufficient, answers = False, []
            return {"sufficient": sufficient, "answers": answers}
        if role == "rewrite":
            step = _gold_step(str(inputs.get("sub_goal", "")), record, position)
            gold_ids = list(step.get("supporting_ids", [])) if step else list(record.supporting_ids)
            return {"gold_ids": gold_ids, "step": step, "k": self._rewrite_depth(int(meta.get("attempt", 0)))}
        return {}

    def _rewrite_depth(self, attempt: int) -> int:
        """Passages the program retrieves with the query a rewrite at ``attempt`` writes (its next attempt's k)."""
        schedule = tuple(getattr(self.program, "k_schedule", None) or ()) or (self.config.rewrite_weights.k,)
        return int(schedule[min(attempt + 1, len(schedule) - 1)])

    # ------------------------------------------------------------------ rewards
    def score(self, role: str, item: RoleInput, outputs: Sequence[dict[str, Any] | None]) -> list[tuple[float, dict]]:
        """Rewards of several candidate outputs (``None`` = unparseable) for one input."""
        cfg = self.config
        if role == "plan":
            plans = [plan_of(o) for o in outputs]
            answers = self.execute_plans([(item.record.question, p) for p in plans])
            return [
                plan_reward(
                    p,
                    question=item.record.question,
                    gold_answers=item.record.answers,
                    executed_answer=a,
                    gold_decomposition=item.record.decomposition,
                    weights=cfg.plan_weights,
                    logic=cfg.plan_logic,
                )
                for p, a in zip(plans, answers, strict=True)
            ]
        if role == "analysis":
            return [
                analysis_reward(
                    o,
                    gold_sufficient=item.gold["sufficient"],
                    gold_answers=item.gold["answers"],
                    weights=cfg.analysis_weights,
                )
                for o in outputs
            ]
        if role == "rewrite":
            retriever = self.program.retriever
            return [
                rewrite_reward(
                    None if o is None else str(o.get("query") or ""),
                    gold_ids=item.gold["gold_ids"],
                    retrieve=lambda q, k: retriever(q, k),
                    weights=cfg.rewrite_weights,
                    k=item.gold.get("k"),
                )
                for o in outputs
            ]
        if role == "synthesis":
            return [
                synthesis_reward(
                    None if o is None else str(o.get("answer") or ""),
                    gold_answers=item.record.answers,
                    weights=cfg.synthesis_weights,
                )  # fmt: skip
                for o in outputs
            ]
        raise ValueError(f"MAPGRPO knows the OPERA roles plan/analysis/rewrite/synthesis, not {role!r}")

    def execute_plans(self, pairs: Sequence[tuple[str, list[str] | None]]) -> list[str | None]:
        """f_exec: the answers of executing each (question, plan) with the program's current downstream agents.

        Each distinct pair not in the cache runs once, all of them concurrently (their LM calls share batches);
        the cache key holds the downstream adapters' versions, so a trained analysis agent re-executes.
        """
        if not self.config.execute_plans:
            return [None] * len(pairs)
        keys = [self._execution_key(q, p) if p else None for q, p in pairs]
        with self._lock:
            todo = {k: pair for k, pair in zip(keys, pairs, strict=True) if k is not None and k not in self._executions}
        if todo:
            memo = self._sub_goal_memo(next(iter(todo))[2]) if self.config.share_sub_goals else None
            kwargs = {"memo": memo} if memo is not None else {}
            before = (memo.misses, memo.hits) if memo is not None else (0, 0)
            answers = parallel_map(lambda pair: str(self.program.execute_plan(pair[0], pair[1], **kwargs).answer),
                                   list(todo.values()))  # fmt: skip
            with self._lock:
                self._executions.update(zip(todo, answers, strict=True))
                if memo is not None:
                    stats = self.execution_stats
                    stats["sub_goals_solved"] = stats.get("sub_goals_solved", 0) + memo.misses - before[0]
                    stats["sub_goals_shared"] = stats.get("sub_goals_shared", 0) + memo.hits - before[1]
        with self._lock:
            self.execution_stats["executed"] += len(todo)
            self.execution_stats["cached"] += sum(k is not None for k in keys) - len(todo)
            return [self._executions.get(k) if k is not None else None for k in keys]

    def _sub_goal_memo(self, versions: tuple[Any, ...]) -> OnceMemo | None:
        """The table of solved sub-goals for these downstream adapter versions (a new one when they change); None
        when the program cannot take one."""
        if "memo" not in inspect.signature(self.program.execute_plan).parameters:
            return None
        with self._lock:
            if self._memo is None or self._memo[0] != versions:
                self._memo = (versions, OnceMemo())
            return self._memo[1]

    def _execution_key(self, question: str, plan: list[str]) -> tuple[Any, ...]:
        """(question, plan, versions of the adapters executing it): every role's but the plan agent's own."""
        backend = getattr(getattr(self.program, "lm", None), "backend", None)
        versions = getattr(backend, "adapter_versions", {})
        adapter_name = getattr(self.program, "adapter_name", None)
        downstream = (
            {adapter_name(r) for r in self.program.roles if r != "plan"} - {adapter_name("plan")}
            if adapter_name is not None and hasattr(self.program, "roles")
            else set(versions)
        )
        return question, tuple(plan), tuple(sorted((a, versions.get(a, 0)) for a in downstream))

    # ------------------------------------------------------------------ experts
    def gold_expert(self, role: str, item: RoleInput) -> dict[str, Any] | None:
        """c_best built from the dataset's gold annotations, or None where the dataset has none."""
        record = item.record
        if role == "plan":
            # the program answers with its last sub-goal unless it synthesizes: then a comparison needs its own step
            plan = gold_plan(record, compare=not getattr(self.program, "final_synthesis", True))
            return {"sub_goals": plan} if plan else None
        if role == "analysis":
            if item.gold["sufficient"]:
                if not item.gold["answers"]:  # answerable, but the dataset does not say what the answer is
                    return None
                answer = item.gold["answers"][0]
                return {"sufficient": "yes", "answer": answer, "confidence": "high", "missing_information": "none"}
            return {"sufficient": "no", "answer": "unknown", "confidence": "low", "missing_information": "the answer"}
        if role == "rewrite":
            step = item.gold.get("step")
            return {"query": step["filled_question"]} if step else None
        if role == "synthesis":
            if not record.answers:
                return None
            if self.config.synthesis_expert == "grounded" and not evidence_holds_chain(
                str(item.inputs.get("evidence", "")), record
            ):
                return None  # the gold answer does not follow from this evidence: no c_best, the samples decide
            return {"answer": record.answers[0]}
        return None


def evidence_holds_chain(evidence: str, record: GoldRecord) -> bool:
    """Whether a synthesis input's evidence holds every gold sub-answer of the question (:func:`holds_answer`: whole
    words, SQuAD-normalized), yes/no answers aside; without a decomposition, whether it holds the gold answer (a
    yes/no answer always counts).

    Example:
        >>> r = GoldRecord("Who directed X?", ["Ann Lee"], decomposition=[{"question": "?", "answer": "Ann Lee"}])
        >>> evidence_holds_chain("Who directed X? -> Ann Lee", r), evidence_holds_chain("Who directed X? -> Bob", r)
        (True, False)
    """
    needed = [str(s.get("answer", "")) for s in record.decomposition or []] or record.answers[:1]
    return all(holds_answer(evidence, a) for a in needed if normalize_answer(a) not in ("", "yes", "no"))


def plan_of(outputs: dict[str, Any] | None) -> list[str] | None:
    """The non-empty sub-goals of a parsed plan output, None when it did not parse or is empty."""
    if outputs is None:
        return None
    raw = outputs.get("sub_goals")
    if not isinstance(raw, list):
        return None
    plan = [str(s).strip() for s in raw if str(s).strip()]
    return plan or None
