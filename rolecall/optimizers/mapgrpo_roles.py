"""The role-specific half of MAPGRPO for OPERA: where each role's training inputs come from, how a candidate is
scored, and what the expert c_best is.

- ``plan``: inputs are training questions; a candidate plan is executed downstream by the program's current
  analysis/rewrite agents (f_exec); the gold expert is the dataset's decomposition with ``#k`` as placeholders.
- ``analysis``: inputs are the (sub-goal, passages) pairs the program produced on training questions with the plan
  agent already trained (Eq. 5-6); gold φ*/a* come from the gold decomposition's supporting documents.
- ``rewrite``: inputs are the (sub-goal, passages, missing information) triples of the program's rewrite calls,
  topped up with analysis inputs whose gold judgement is "no"; the reward is the NDCG of the new query's retrieval.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rolecall.evaluation.metrics import f1_score
from rolecall.optimizers.mapgrpo_config import MAPGRPOConfig
from rolecall.optimizers.rewards.opera import analysis_gold, analysis_reward, plan_reward, rewrite_reward
from rolecall.programs.core.plan import fill_placeholders, hash_refs_to_placeholders

__all__ = ["GoldRecord", "RoleInput", "OperaRoleTasks", "as_gold_record"]

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


def _filled_gold_steps(record: GoldRecord) -> list[tuple[str, dict[str, Any]]]:
    """Each gold step's question with ``#k`` replaced by the gold answers, with the step."""
    steps = record.decomposition or []
    answers = {i: str(s.get("answer", "")) for i, s in enumerate(steps, 1)}
    out = []
    for step in steps:
        text, _ = fill_placeholders(str(step.get("question", "")), answers)
        out.append((text, step))
    return out


def _best_gold_step(sub_goal: str, record: GoldRecord) -> dict[str, Any] | None:
    scored = [(f1_score(sub_goal, text), text, step) for text, step in _filled_gold_steps(record)]
    if not scored:
        return None
    score, text, step = max(scored, key=lambda x: x[0])
    return {**step, "filled_question": text} if score >= 0.2 else None


class OperaRoleTasks:
    """Input collection, scoring and experts for OPERA's three roles (see the module docstring)."""

    def __init__(self, program: Any, config: MAPGRPOConfig) -> None:
        self.program = program
        self.config = config

    # ------------------------------------------------------------------ inputs
    def collect(self, role: str, records: Sequence[GoldRecord], rng: random.Random) -> list[RoleInput]:
        """Training inputs of ``role``: questions for ``plan``, otherwise the program's own calls on them."""
        chosen = rng.sample(list(records), min(len(records), self.config.collect_questions))
        if role == "plan":
            return [RoleInput({"question": r.question}, r) for r in chosen]
        with ThreadPoolExecutor(self.config.num_threads) as pool:
            preds = list(pool.map(lambda r: self.program(question=r.question), chosen))
        items: list[RoleInput] = []
        for record, pred in zip(chosen, preds, strict=True):
            items.extend(self._from_trajectory(role, record, pred.trajectory))
        if role == "rewrite" and len(items) < self.config.inputs_per_step * 2:
            items.extend(self._rewrite_from_analysis(chosen, preds))
        rng.shuffle(items)
        return items

    def _from_trajectory(self, role: str, record: GoldRecord, trajectory: Any) -> list[RoleInput]:
        items = []
        last_ids: list[str] = []
        for step in trajectory.steps:
            if step.kind == "retrieval":
                last_ids = list(step.outputs.get("passage_ids", []))
            elif step.kind == "role" and step.role == role and step.inputs:
                inputs = dict(step.inputs)
                items.append(RoleInput(inputs, record, self._gold(role, inputs, last_ids, record)))
        return items

    def _rewrite_from_analysis(self, records: Sequence[GoldRecord], preds: Sequence[Any]) -> list[RoleInput]:
        """Analysis inputs whose gold judgement is "no" are exactly where a rewrite is needed."""
        items = []
        for record, pred in zip(records, preds, strict=True):
            for item in self._from_trajectory("analysis", record, pred.trajectory):
                if not item.gold["sufficient"]:
                    inputs = {**item.inputs, "missing_information": "the answer to the sub-question"}
                    items.append(RoleInput(inputs, record, self._gold("rewrite", inputs, [], record)))
        return items

    def _gold(self, role: str, inputs: dict[str, Any], shown_ids: list[str], record: GoldRecord) -> dict[str, Any]:
        if role == "analysis":
            passages = str(inputs.get("passages", ""))
            sufficient, answers = analysis_gold(
                str(inputs.get("sub_goal", "")), shown_ids, record.decomposition, record.supporting_ids
            )
            # a retrieved passage the prompt did not show (context cut) cannot make the sub-goal answerable
            if sufficient and answers and not any(a.lower() in passages.lower() for a in answers):
                sufficient, answers = False, []
            return {"sufficient": sufficient, "answers": answers}
        if role == "rewrite":
            step = _best_gold_step(str(inputs.get("sub_goal", "")), record)
            gold_ids = list(step.get("supporting_ids", [])) if step else list(record.supporting_ids)
            return {"gold_ids": gold_ids, "step": step}
        return {}

    # ------------------------------------------------------------------ rewards
    def score(self, role: str, item: RoleInput, outputs: Sequence[dict[str, Any] | None]) -> list[tuple[float, dict]]:
        """Rewards of several candidate outputs (``None`` = unparseable) for one input."""
        cfg = self.config
        if role == "plan":
            plans = [_plan_of(o) for o in outputs]
            answers = self._execute_plans(item.record.question, plans)
            return [
                plan_reward(
                    p,
                    question=item.record.question,
                    gold_answers=item.record.answers,
                    executed_answer=a,
                    gold_decomposition=item.record.decomposition,
                    weights=cfg.plan_weights,
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
                )
                for o in outputs
            ]
        raise ValueError(f"MAPGRPO knows the OPERA roles plan/analysis/rewrite, not {role!r}")

    def _execute_plans(self, question: str, plans: Sequence[list[str] | None]) -> list[str | None]:
        if not self.config.execute_plans:
            return [None] * len(plans)

        def run(plan: list[str] | None) -> str | None:
            if not plan:
                return None
            return str(self.program.execute_plan(question, plan).answer)

        with ThreadPoolExecutor(max(1, len(plans))) as pool:
            return list(pool.map(run, plans))

    # ------------------------------------------------------------------ experts
    def gold_expert(self, role: str, item: RoleInput) -> dict[str, Any] | None:
        """c_best built from the dataset's gold annotations, or None where the dataset has none."""
        record = item.record
        if role == "plan":
            if not record.decomposition:
                return None
            answers = {i: str(s.get("answer", "")) for i, s in enumerate(record.decomposition, 1)}
            return {"sub_goals": [hash_refs_to_placeholders(str(s["question"]), answers) for s in record.decomposition]}
        if role == "analysis":
            if item.gold["sufficient"] and item.gold["answers"]:
                answer = item.gold["answers"][0]
                return {"sufficient": "yes", "answer": answer, "confidence": "high", "missing_information": "none"}
            return {"sufficient": "no", "answer": "unknown", "confidence": "low", "missing_information": "the answer"}
        if role == "rewrite":
            step = item.gold.get("step")
            return {"query": step["filled_question"]} if step else None
        return None


def _plan_of(outputs: dict[str, Any] | None) -> list[str] | None:
    if outputs is None:
        return None
    raw = outputs.get("sub_goals")
    if not isinstance(raw, list):
        return None
    plan = [str(s).strip() for s in raw if str(s).strip()]
    return plan or None
