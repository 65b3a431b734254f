"""The Searcher of the MultiAgent-OPD teams: one ReAct turn at a time, plus the prompt formats the team shares.

A Searcher (arXiv 2610.23234, Sec. 3.1) "writes a query, reads the passages that the retriever returns and then either
searches again or writes a report". Each turn is one role call ``(subtask, notes) -> (action, content)``; a search is
then run with the retriever. Turns are recorded on a private :class:`Trajectory` and handed back as steps, so the
Searchers of one wave can run on threads at once and their steps still join the team trajectory in a fixed order with
their meta (``searcher``, ``turn``, ``wave``, ``env_step``) already set.

Numbering: ``searcher`` and ``wave`` count from 1 (a Searcher's number is the number of its report in the Leader's
list), ``turn`` from 0 within a Searcher, ``env_step`` from 1 within the question.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import dspy

from rolecall.programs.core.program import Program, format_passages
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.base import Passage
from rolecall.signatures.types import is_null_answer

__all__ = [
    "NO_NOTES",
    "NO_REPORTS",
    "SearcherRun",
    "format_notes",
    "format_reports",
    "fallback_report",
    "searcher_turn",
    "majority_vote",
]

NO_NOTES = "none yet"
"""The notes of a Searcher that has not searched yet."""

NO_REPORTS = "none yet"
"""The reports a Leader sees before its first wave."""

UNFINISHED = "(unfinished)"
"""Opens a report the program wrote for a Searcher that never reported (its last passage stands in for the report)."""


@dataclass
class SearcherRun:
    """One Searcher's subtask, its searches so far and its report.

    Attributes:
        index: the Searcher's number in the question (1-based; also its report's number for the Leader).
        subtask: what it was asked to find (the question itself in the cascaded workflow).
        wave: the Leader round that created it (1 in the cascaded workflow).
        history: ``(query, passages)`` of each search, in order.
        report: the report, None while the Searcher is still working.
        forced: True when the report was written by the program (limit reached or unusable output).
        turns: role calls made.
    """

    index: int
    subtask: str
    wave: int = 1
    history: list[tuple[str, list[Passage]]] = field(default_factory=list)
    report: str | None = None
    forced: bool = False
    turns: int = 0

    @property
    def searches(self) -> int:
        """Searches run (the model's own and fallbacks)."""
        return len(self.history)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for the prediction's ``reports`` field)."""
        return {
            "index": self.index,
            "wave": self.wave,
            "subtask": self.subtask,
            "report": self.report or "",
            "searches": self.searches,
            "forced": self.forced,
        }


def format_notes(
    history: Sequence[tuple[str, Sequence[Any]]], *, max_passage_chars: int = 250, max_notes_chars: int = 900
) -> str:
    """A Searcher's notes: each search as ``"Search i: query"`` and its numbered passages.

    When the notes pass ``max_notes_chars``, the oldest searches shrink to their query line first, so the newest
    passages stay readable (the paper's Searcher keeps its whole history; a 135M model's context cannot).

    Example:
        >>> print(format_notes([("Varn", [Passage("d1", "Varn", "Varn is a city in Ostria.")])]))
        Search 1: Varn
        [1] Varn | Varn is a city in Ostria.
    """
    if not history:
        return NO_NOTES
    blocks = [
        f"Search {i}: {query}\n"
        + format_passages(
            passages, max_chars=max_passage_chars, max_total_chars=max(max_notes_chars, max_passage_chars)
        )
        for i, (query, passages) in enumerate(history, start=1)
    ]
    total = sum(len(b) + 1 for b in blocks)
    for i in range(len(blocks) - 1):  # never shrink the newest search
        if total <= max_notes_chars:
            break
        short = f"Search {i + 1}: {history[i][0]}"
        total -= len(blocks[i]) - len(short)
        blocks[i] = short
    return "\n".join(blocks)


def format_reports(runs: Sequence[SearcherRun], *, max_report_chars: int = 200, empty: str = NO_REPORTS) -> str:
    """Numbered reports as the Leader and the Answerer see them: ``"[i] subtask -> report"``.

    Example:
        >>> print(format_reports([SearcherRun(1, "Who founded Morrow Books?", report="Ada Quell (from Morrow Books)")]))
        [1] Who founded Morrow Books? -> Ada Quell (from Morrow Books)
    """
    lines = [f"[{r.index}] {r.subtask} -> {_cut(r.report or '', max_report_chars)}" for r in runs]
    return "\n".join(lines) if lines else empty


def fallback_report(run: SearcherRun, *, max_report_chars: int = 200) -> str:
    """The report written for a Searcher that never reported: its last search's top passage, marked unfinished."""
    passages = run.history[-1][1] if run.history else []
    if not passages:
        return f"{UNFINISHED} nothing found"
    top = passages[0]
    text = f"{top.title}: {top.text}" if top.title else top.text
    return _cut(f"{UNFINISHED} {' '.join(text.split())}", max_report_chars)


def searcher_turn(
    program: Program,
    run: SearcherRun,
    *,
    turn: int,
    env_step: int,
    top_k: int,
    max_passage_chars: int,
    max_notes_chars: int,
    max_report_chars: int,
) -> list[Step]:
    """Run one ReAct turn of ``run`` (a role call, then the search it asks for) and return the recorded steps.

    The role call is recorded with meta ``searcher``, ``turn``, ``wave``, ``env_step``, the executed ``action``
    (``"search"`` or ``"report"``), the ``query`` or ``report`` and ``valid`` (the model's own output gave a usable
    action: a parsed action with non-empty content). An unusable output is replaced, and a ``fallback`` event says by
    what: the subtask as the query when the Searcher has not searched yet, otherwise a report from its last passages.
    """
    private = Trajectory(question=run.subtask)
    meta = {"searcher": run.index, "turn": turn, "wave": run.wave, "env_step": env_step}
    notes = format_notes(run.history, max_passage_chars=max_passage_chars, max_notes_chars=max_notes_chars)
    pred = program.call_role("searcher", private, subtask=run.subtask, notes=notes)
    call = private.steps[-1]
    action, content = _read_turn(pred)
    valid = action is not None and bool(content)
    if valid:
        executed = action
    else:
        executed = "report" if run.history else "search"
        reason = "unparseable output" if pred is None else ("empty content" if action else "unknown action")
        event = private.event("fallback", role="searcher", reason=reason, replaced_by=executed, **meta)
        if pred is not None:
            event.error = f"searcher output unusable: {reason}"
    run.turns += 1
    if executed == "search":
        query = content if valid else run.subtask
        call.meta.update(meta, action="search", query=query, valid=valid)
        passages = program.retrieve(private, query, top_k)
        private.steps[-1].meta.update(meta, fallback=not valid)
        run.history.append((query, passages))
    else:
        run.report = content if valid else fallback_report(run, max_report_chars=max_report_chars)
        run.forced = not valid
        call.meta.update(meta, action="report", report=run.report, valid=valid)
    # the role call first, then its fallback note and retrieval
    return [call, *[s for s in private.steps if s is not call]]


def majority_vote(candidates: Sequence[str | None]) -> tuple[str, dict[str, int]]:
    """The most frequent answer among ``candidates`` (compared after SQuAD normalization) and the vote counts.

    Null answers (``""``, ``unknown``, ...) and failed candidates (None) only win when nothing else was said. Ties go
    to the answer that appears first; the returned text is that answer's first spelling.

    Example:
        >>> majority_vote(["Paris", "Lyon", "paris.", None])
        ('Paris', {'paris': 2, 'lyon': 1})
    """
    said = [c.strip() for c in candidates if c is not None and c.strip()]
    real = [c for c in said if not is_null_answer(c)]
    pool = real or said
    if not pool:
        return "", {}
    from rolecall.evaluation.metrics import normalize_answer  # here: rolecall.evaluation imports rolecall.programs

    keys = [normalize_answer(c) or c.lower() for c in pool]
    votes = Counter(keys)
    best = max(votes.values())
    winner = next(k for k in keys if votes[k] == best)  # first in order among the tied
    return pool[keys.index(winner)], dict(votes)


def _read_turn(pred: dspy.Prediction | None) -> tuple[str | None, str]:
    """``(action, content)`` of a Searcher output; the action is None when missing or not one of the two."""
    if pred is None:
        return None, ""
    action = str(pred.get("action") or "").strip().lower()
    content = " ".join(str(pred.get("content") or "").split())
    return (action if action in ("search", "report") else None), content


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."
