"""REAP's line grammar: the Decomposer's plan lines, fact levels and re-plan actions as a small model writes them.

The references inside a sub-question (``#k``, ``[type from step k]``) are read and rewritten by
:mod:`rolecall.programs.core.plan`; fields of a completion the adapter rejected are salvaged by
:meth:`~rolecall.programs.core.program.Program.call_role` (:mod:`rolecall.programs.core.calls`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rolecall.programs.core.plan import find_references, renumber_references
from rolecall.signatures.reap import REPLAN_ACTIONS, FactLevel, ReplanAction, SubTask
from rolecall.signatures.types import is_null_answer

__all__ = ["parse_plan", "normalize_level", "normalize_action"]

_NUMBERED = re.compile(r"^\s*(?:[-*\u2022]\s*)?(?:(?:step|task|sub-?question|q)\s*)?#?(\d+)\s*[.):\]-]\s*(.*)$", re.I)
_DEPS = re.compile(r"\(?\s*\b(?:deps?|depends\s+on|dependencies)\b\s*[:=]?\s*([^)]*)\)?\s*$", re.I)


def parse_plan(lines: Sequence[str] | str) -> tuple[list[SubTask], list[str]]:
    """Parse Decomposer lines into sub-tasks with ids ``1..n``, robust to what a small model writes.

    Accepted per line: an optional number (``"2."``, ``"2)"``, ``"Step 2:"``), the sub-question, and an optional
    ``(deps: 1, 2)`` / ``(deps: none)`` clause. A sub-task's deps are the listed ids plus the ids its references
    (``#k``, ``[type from step k]``) name. Ids are renumbered by position (references rewritten to match) when the
    written ids are missing, repeated or not ``1..n``; a dependency on the sub-task itself or a later one is dropped,
    so the plan is always acyclic. Empty and repeated questions are skipped (references to a repeat point to the first).

    Args:
        lines: the Decomposer's ``plan`` list (an item may hold several lines), or one block of text.

    Returns:
        ``(sub_tasks, notes)``; ``notes`` describe every repair made (empty when the plan was clean).

    Example:
        >>> tasks, notes = parse_plan(["1. Who directed Film X? (deps: none)", "2. Where was #1 born? (deps: 1)"])
        >>> [(t.id, t.question, t.deps) for t in tasks], notes
        ([(1, 'Who directed Film X?', []), (2, 'Where was #1 born?', [1])], [])
    """
    raw_lines = [lines] if isinstance(lines, str) else [str(x) for x in lines]
    entries = [parsed for item in raw_lines for line in item.splitlines() if (parsed := _parse_line(line))]
    notes: list[str] = []
    written = [e[0] for e in entries]
    positional = any(i is None for i in written) or len(set(written)) != len(written)
    if positional and any(i is not None for i in written):
        notes.append("ids renumbered by position")
    mapping: dict[int, int] = {}  # written id -> new id
    tasks: list[SubTask] = []
    seen_questions: dict[str, int] = {}
    for position, (written_id, question, deps) in enumerate(entries, start=1):
        key = written_id if not positional and written_id is not None else position
        if question.lower() in seen_questions:
            mapping[key] = seen_questions[question.lower()]
            notes.append(f"repeated sub-question {question!r} dropped")
            continue
        new_id = len(tasks) + 1
        mapping[key] = new_id
        seen_questions[question.lower()] = new_id
        tasks.append(SubTask(id=new_id, question=question, deps=deps))  # deps still in written ids
    out: list[SubTask] = []
    for task in tasks:
        question = renumber_references(task.question, mapping)
        wanted = [mapping.get(d, -1) for d in task.deps] + [r.step for r in find_references(question)]
        deps = sorted({d for d in wanted if 1 <= d < task.id})
        dropped = sorted({d for d in wanted if not 1 <= d < task.id})
        if dropped:
            notes.append(f"sub-task {task.id}: dependencies {dropped} dropped (not an earlier sub-task)")
        out.append(SubTask(id=task.id, question=question, deps=deps))
    return out, notes


def _parse_line(line: str) -> tuple[int | None, str, list[int]] | None:
    text = line.strip().strip('",').strip()
    if not text:
        return None
    written_id: int | None = None
    match = _NUMBERED.match(text)
    if match:
        written_id, text = int(match.group(1)), match.group(2).strip()
    deps: list[int] = []
    dep_match = _DEPS.search(text)
    if dep_match:
        deps = [int(d) for d in re.findall(r"\d+", dep_match.group(1))]
        text = text[: dep_match.start()].strip()
    text = text.strip().strip('"').strip()
    if not text or is_null_answer(text):
        return None
    return written_id, text, deps


def normalize_level(value: str | None) -> FactLevel:
    """Map a loosely written level (``"direct answer"``, ``"partial"``, ``"fail"``) onto :data:`FactLevel`.

    Example:
        >>> normalize_level("Direct answer."), normalize_level("partial_clue"), normalize_level("??")
        ('DirectAnswer', 'PartialClue', 'Failed')
    """
    text = re.sub(r"[^a-z]", "", str(value or "").lower())
    if text.startswith("direct"):
        return "DirectAnswer"
    if text.startswith("partial") or text.startswith("clue"):
        return "PartialClue"
    return "Failed"


def normalize_action(value: str | None) -> ReplanAction | None:
    """Map a loosely written Re-Planner action onto :data:`ReplanAction` (None when it names none of them).

    Example:
        >>> normalize_action("Sufficient."), normalize_action("retry")
        ('sufficient', None)
    """
    text = re.sub(r"[^a-z]", "", str(value or "").lower())
    for action in REPLAN_ACTIONS:
        if text.startswith(action):
            return action  # type: ignore[return-value]
    return None
