"""REAP's task plan and its rule-based Plan Updater (Zhu et al., AAAI 2026, arXiv 2511.09966, "Sub-task Planner").

The plan P_t is a set of sub-task nodes ``(id_i, q_i, deps_i)`` with a status. The Plan Updater handles the ideal case
(l_t = DirectAnswer, or a partial fact the Re-Planner judged sufficient) with deterministic rules:

    (a) fact substitution: every pending sub-task that depends on t gets t's answer in place of its ``#t`` reference;
    (b) plan branching:    when t yields several answers a_1..a_n, the pending sub-tasks that depend on t alone (and
                           everything downstream of them) are copied into n parallel branches, branch i bound to a_i.

The Re-Planner's scoped repairs are plan edits too: :meth:`TaskPlan.edit` (a local issue: a new wording of one
sub-query) and :meth:`TaskPlan.replace` (a systemic defect: prune the sub-task's branch, inject new sub-tasks).

**Decision** (the paper leaves it open): a dependent sub-task that needs several earlier answers (a comparison or an
intersection, e.g. "Who is in both #1 and #2?") is not forked; it receives all answers of t joined by commas.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from rolecall.programs.core.plan import fill_references, renumber_references
from rolecall.programs.core.trajectory import Trajectory
from rolecall.signatures.reap import FactTuple, SubTask, split_answers
from rolecall.signatures.types import is_null_answer

__all__ = ["NodeStatus", "PlanNode", "TaskPlan", "LEVEL_RANK", "has_answer", "plan_view_line"]

logger = logging.getLogger(__name__)

NodeStatus = Literal["pending", "done", "failed", "pruned"]
"""pending: not resolved yet; done: has an answer; failed: given up without one; pruned: removed by the Re-Planner."""

LEVEL_RANK = {"DirectAnswer": 2, "PartialClue": 1, "Failed": 0}


@dataclass
class PlanNode:
    """One sub-task of the plan inside one branch.

    Attributes:
        uid: unique name: the sub-task id on the trunk (``"2"``), ``"<id>@<branch>"`` inside a forked branch.
        task: the sub-task ``(id, question, deps)``; ``question`` keeps its ``#k`` references.
        branch: ``""`` on the trunk, else the forks that made it, e.g. ``"1.2"`` (answer 2 of sub-task 1) or
            ``"1.2/3.1"``.
        sources: dep id -> uid of the node whose answer fills ``#dep`` in this branch.
        values: dep id -> the text substituted for ``#dep`` (set by the Plan Updater).
        status: see :data:`NodeStatus`.
        query: the Re-Planner's edited wording; when set it replaces the filled question.
        answer: the answer other sub-tasks substitute (several answers joined by ``"; "``).
        facts: every fact extracted for this node, in order.
        repairs: Re-Planner repairs applied to it.
        seen_ids: passage ids already shown for it (a retry shows unseen passages first).
    """

    uid: str
    task: SubTask
    branch: str = ""
    sources: dict[int, str] = field(default_factory=dict)
    values: dict[int, str] = field(default_factory=dict)
    status: NodeStatus = "pending"
    query: str | None = None
    answer: str = ""
    facts: list[FactTuple] = field(default_factory=list)
    repairs: int = 0
    seen_ids: set[str] = field(default_factory=set)

    @property
    def question(self) -> str:
        """The sub-query as asked now: the edited wording, else the question with its references filled."""
        if self.query:
            return self.query
        filled, _ = fill_references(self.task.question, self.values)
        return filled

    @property
    def unresolved(self) -> list[str]:
        """References in the question that have no substituted value yet."""
        return fill_references(self.task.question, self.values)[1] if not self.query else []

    @property
    def best_fact(self) -> FactTuple | None:
        """The most useful fact so far: highest level, then one with an answer, then the latest."""
        if not self.facts:
            return None
        ranked = sorted(
            enumerate(self.facts), key=lambda x: (LEVEL_RANK[x[1].level], bool(x[1].answers), x[0]), reverse=True
        )
        return ranked[0][1]

    def meta(self) -> dict[str, Any]:
        """Fields for trajectory steps about this node (credit assignment per sub-task and branch)."""
        return {"sub_task": self.uid, "task_id": self.task.id, "branch": self.branch}


class TaskPlan:
    """The plan P_t: sub-task nodes in creation order, with the rule-based updates of REAP's Sub-task Planner.

    Args:
        tasks: the Decomposer's parsed plan P_0 (ids ``1..n``, deps on earlier ids only).
        max_branches: most branches one fork creates (extra answers are dropped and recorded).

    Example:
        >>> plan = TaskPlan([SubTask(id=1, question="Who directed X?"), SubTask(id=2, question="Where was #1 born?",
        ...                  deps=[1])])
        >>> [n.uid for n in plan.ready()]
        ['1']
        >>> _ = plan.resolve(plan.nodes["1"], "Ada Quell")
        >>> [n.question for n in plan.ready()]
        ['Where was Ada Quell born?']
    """

    def __init__(self, tasks: list[SubTask], *, max_branches: int = 3) -> None:
        self.max_branches = max_branches
        self.nodes: dict[str, PlanNode] = {}
        for task in tasks:
            self.nodes[str(task.id)] = PlanNode(str(task.id), task, sources={d: str(d) for d in task.deps})
        self.next_id = max((t.id for t in tasks), default=0) + 1

    # ------------------------------------------------------------------ views
    def pending(self) -> list[PlanNode]:
        """Nodes not resolved yet, in creation order."""
        return [n for n in self.nodes.values() if n.status == "pending"]

    def ready(self) -> list[PlanNode]:
        """Pending nodes whose sources are all resolved (done or given up), in creation order."""
        return [n for n in self.pending() if all(self._settled(uid) for uid in n.sources.values())]

    def resolved(self) -> list[PlanNode]:
        """Nodes with an answer, in creation order."""
        return [n for n in self.nodes.values() if n.status == "done"]

    @property
    def finished(self) -> bool:
        """True when no sub-task is pending."""
        return not self.pending()

    def _settled(self, uid: str) -> bool:
        node = self.nodes.get(uid)
        return node is None or node.status != "pending"

    def dependents(self, uid: str) -> list[PlanNode]:
        """Pending nodes that use ``uid``'s answer directly."""
        return [n for n in self.pending() if uid in n.sources.values()]

    def descendants(self, uids: list[str]) -> list[PlanNode]:
        """Pending nodes downstream of any of ``uids`` (transitively), in creation order."""
        found: set[str] = set()
        frontier = list(uids)
        while frontier:
            uid = frontier.pop()
            for n in self.dependents(uid):
                if n.uid not in found:
                    found.add(n.uid)
                    frontier.append(n.uid)
        return [n for n in self.nodes.values() if n.uid in found]

    def lineage_facts(self, node: PlanNode, limit: int) -> list[FactTuple]:
        """Facts F_{t-1} visible to ``node``: from nodes on its branch's path (the trunk, then each fork), at most
        the last ``limit``, the node's own earlier attempts included."""
        visible = [
            f
            for n in self.nodes.values()
            if n.facts and _on_path(n.branch, node.branch)
            for f in ([n.best_fact] if n is not node else n.facts)
            if f is not None and f.brief()
        ]
        return visible[-limit:] if limit > 0 else []

    def view(self, current: PlanNode | None = None) -> str:
        """The whole plan as the Re-Planner sees it: every node in creation order, its question as it reads now and
        its status (see :func:`plan_view_line`; ``current`` is marked ``current``).

        Example:
            >>> plan = TaskPlan([SubTask(id=1, question="Who directed X?"), SubTask(id=2, question="Where was #1 born?",
            ...                  deps=[1])])
            >>> _ = plan.resolve(plan.nodes["1"], "Ada Quell")
            >>> print(plan.view(plan.nodes["2"]))
            1. Who directed X? [done: Ada Quell]
            2. Where was Ada Quell born? [current]
        """
        return "\n".join(
            plan_view_line(n.uid, n.question, "current" if n is current else n.status, n.answer)
            for n in self.nodes.values()
        )

    def summary(self) -> list[dict[str, Any]]:
        """Every node as a plain dict (for the prediction and evaluation records)."""
        return [
            {
                **n.meta(),
                "question": n.question,
                "deps": list(n.task.deps),
                "status": n.status,
                "answer": n.answer,
                "level": n.facts[-1].level if n.facts else None,
                "repairs": n.repairs,
            }
            for n in self.nodes.values()
        ]

    # ------------------------------------------------------------------ Plan Updater (rule-based)
    def resolve(self, node: PlanNode, answer: str, trajectory: Trajectory | None = None, **meta: Any) -> list[str]:
        """Mark ``node`` done with ``answer`` ("A; B" for several), substitute it and fork where it has several.

        Returns:
            The uids of the nodes the answer was substituted into (fork copies included).
        """
        answers = split_answers(answer)
        if not answers:  # nothing to substitute: the sub-task is unanswered
            return self.give_up(node, trajectory, **meta)
        node.status, node.answer = "done", "; ".join(answers)
        forked = self._fork(node, answers, trajectory, **meta) if len(answers) > 1 else []
        joined = ", ".join(answers)
        touched = self._substitute(node.uid, joined)
        touched = list(dict.fromkeys([*forked, *touched]))
        if trajectory is not None:
            trajectory.event("plan_update", **node.meta(), answer=node.answer, substituted_into=touched, **meta)
        return touched

    def give_up(self, node: PlanNode, trajectory: Trajectory | None = None, **meta: Any) -> list[str]:
        """Mark ``node`` failed: its dependents get its sub-question, in brackets, for the missing answer."""
        node.status, node.answer = "failed", ""
        touched = self._substitute(node.uid, f"[{node.question.rstrip('?')}]")
        if trajectory is not None:
            step = trajectory.event("plan_update", **node.meta(), answer=None, substituted_into=touched, **meta)
            step.error = f"sub-task {node.uid} left unanswered"
        return touched

    def _substitute(self, uid: str, value: str) -> list[str]:
        touched = []
        for n in self.dependents(uid):
            for dep, source in n.sources.items():
                if source == uid and dep not in n.values:
                    n.values[dep] = value
                    touched.append(n.uid)
        return list(dict.fromkeys(touched))

    def _fork(self, node: PlanNode, answers: list[str], trajectory: Trajectory | None, **meta: Any) -> list[str]:
        """Copy the single-dependency dependents of ``node`` and their descendants into one branch per answer."""
        heads = [n for n in self.dependents(node.uid) if len(n.sources) == 1]
        if not heads:
            return []
        kept = answers[: self.max_branches]
        closure = heads + [n for n in self.descendants([h.uid for h in heads]) if n not in heads]
        closure = [n for n in self.nodes.values() if n in closure]  # creation order
        copies: list[str] = []
        bound: list[str] = []  # the head copies, which got a value
        branches: list[str] = []
        for i, value in enumerate(kept, start=1):
            label = f"{node.branch}/{node.task.id}.{i}" if node.branch else f"{node.task.id}.{i}"
            branches.append(label)
            renamed = {n.uid: f"{n.task.id}@{label}" for n in closure}
            for n in closure:
                copy = PlanNode(
                    renamed[n.uid],
                    n.task,
                    branch=label,
                    sources={d: renamed.get(s, s) for d, s in n.sources.items()},
                    values=dict(n.values),
                    query=n.query,
                )
                if n in heads:
                    copy.values[next(iter(n.sources))] = value
                    bound.append(copy.uid)
                self.nodes[copy.uid] = copy
                copies.append(copy.uid)
        for n in closure:
            del self.nodes[n.uid]
        if trajectory is not None:
            trajectory.event("fork", **node.meta(), answers=kept, branches=branches, copied=copies, **meta)
            if len(answers) > len(kept):
                step = trajectory.event("fork_truncated", **node.meta(), dropped=answers[len(kept) :], **meta)
                step.error = f"{len(answers)} answers, at most {self.max_branches} branches"
        return bound

    # ------------------------------------------------------------------ Re-Planner repairs
    def edit(self, node: PlanNode, new_question: str) -> None:
        """Local repair: ask ``node`` again with ``new_question`` (references to earlier sub-tasks filled)."""
        filled, _ = fill_references(new_question, {d: v for d, v in node.values.items()})
        node.query = filled.strip()
        node.repairs += 1

    def replace(self, node: PlanNode, tasks: list[SubTask]) -> tuple[list[str], list[str]]:
        """Systemic repair: prune ``node`` and everything downstream of it, inject ``tasks`` into its branch.

        ``tasks`` are numbered from 1 among themselves (as :func:`~rolecall.programs.reap.parse.parse_plan` returns
        them); they get fresh ids after the plan's largest.

        Returns:
            ``(pruned_uids, injected_uids)``.
        """
        pruned = [node, *self.descendants([node.uid])]
        for n in pruned:
            n.status = "pruned"
        mapping = {t.id: self.next_id + i for i, t in enumerate(tasks)}
        injected = []
        for t in tasks:
            new_id = mapping[t.id]
            uid = f"{new_id}@{node.branch}" if node.branch else str(new_id)
            question = renumber_references(t.question, mapping)
            deps = [mapping[d] for d in t.deps if d in mapping]
            sub = SubTask(id=new_id, question=question, deps=deps)
            sources = {d: (f"{d}@{node.branch}" if node.branch else str(d)) for d in deps}
            self.nodes[uid] = PlanNode(uid, sub, branch=node.branch, sources=sources, repairs=node.repairs + 1)
            injected.append(uid)
        self.next_id += len(tasks)
        return [n.uid for n in pruned], injected


def _on_path(branch: str, of: str) -> bool:
    """Whether a node on ``branch`` is on the path from the trunk to ``of`` (the trunk is on every path)."""
    if not branch:
        return True
    parts, target = branch.split("/"), of.split("/") if of else []
    return target[: len(parts)] == parts


def has_answer(fact: FactTuple | None) -> bool:
    """Whether ``fact`` carries a non-null answer."""
    return fact is not None and not is_null_answer(fact.answer) and bool(fact.answers)


def plan_view_line(label: str, question: str, status: str, answer: str = "") -> str:
    """One line of the plan the Re-Planner sees: ``"2. Where was Ada Quell born? [done: Varn]"``; the status is
    ``done: <answer>``, ``current`` (the sub-task being repaired), ``pending``, ``failed`` or ``pruned``.

    Example:
        >>> plan_view_line("2@1.1", "When was #2 released?", "pending")
        '2@1.1. When was #2 released? [pending]'
    """
    state = f"done: {answer}" if status == "done" else status
    return f"{label}. {question} [{state}]"
