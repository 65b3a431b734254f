"""The Searcher of the MultiAgent-OPD teams: its ReAct turns on the shared search loop, and the prompt formats the
team shares.

A Searcher (arXiv 2610.23234, Sec. 3.1) "writes a query, reads the passages that the retriever returns and then either
searches again or writes a report". Each turn is one role call ``(subtask, notes) -> (action, content)``; a search is
then run by :class:`~rolecall.programs.core.search.SearchLoop`. A wave advances all its Searchers one turn at a time
(one environment step), each turn recorded on the branch trajectory that
:func:`~rolecall.programs.core.parallel.run_branches` gives it, so the Searchers of one wave run on threads at once and
their steps still join the team trajectory in a fixed order with their meta (``searcher``, ``turn``, ``wave``,
``env_step``) already set.

Numbering: ``searcher`` and ``wave`` count from 1 (a Searcher's number is the number of its report in the Leader's
list), ``turn`` from 0 within a Searcher, ``env_step`` from 1 within the question.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import dspy

from rolecall.programs.core.program import Program
from rolecall.programs.core.search import Observation, SearchAction, SearchLoop
from rolecall.programs.core.text import format_passages, shorten
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.team.options import TeamOptions
from rolecall.retrievers.base import Passage
from rolecall.signatures.types import is_null_answer
from rolecall.utils.text import normalize_answer

__all__ = [
    "NO_NOTES",
    "NO_REPORTS",
    "UNFINISHED",
    "SearcherRun",
    "Searcher",
    "format_notes",
    "format_reports",
    "fallback_report",
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
    lines = [f"[{r.index}] {r.subtask} -> {shorten(r.report or '', max_report_chars)}" for r in runs]
    return "\n".join(lines) if lines else empty


def fallback_report(run: SearcherRun, *, max_report_chars: int = 200) -> str:
    """The report written for a Searcher that never reported: its last search's top passage, marked unfinished."""
    passages = run.history[-1][1] if run.history else []
    if not passages:
        return f"{UNFINISHED} nothing found"
    top = passages[0]
    text = f"{top.title}: {top.text}" if top.title else top.text
    return shorten(f"{UNFINISHED} {text}", max_report_chars)


class Searcher:
    """One Searcher at work: its :class:`SearcherRun` and the :class:`SearchLoop` that takes its ReAct turns.

    Each turn's role call is recorded with meta ``searcher``, ``turn``, ``wave``, ``env_step``, the executed
    ``action`` (``"search"`` or ``"report"``), the ``query`` or ``report`` and ``valid`` (the model's own output gave a
    usable action: a parsed action with non-empty content). An unusable output is replaced, and a ``fallback`` event
    says by what: the subtask as the query when the Searcher has not searched yet, otherwise a report from its last
    passages. A search's retrieval step carries the same ``searcher``/``turn``/``wave``/``env_step`` and ``fallback``
    (True when the program's query stood in for the model's).

    Args:
        program: the team (its ``searcher`` role and retriever).
        run: the Searcher's subtask and state, updated turn by turn.
        options: the team's options (``top_k`` and the prompt sizes).
        max_turns: the most turns the wave will grant. The wave enforces this limit and the step budget for all its
            Searchers at once (one limit event per wave), so the loop's own budget is one turn more and never runs out.
    """

    def __init__(self, program: Program, run: SearcherRun, options: TeamOptions, *, max_turns: int) -> None:
        self.program, self.run, self.options = program, run, options
        self.loop = SearchLoop(
            program,
            Trajectory(question=run.subtask),
            act=self._act,
            k=options.top_k,
            max_turns=max_turns + 1,
            observe=self._observe,
            meta={"searcher": run.index, "wave": run.wave},
        )

    def turn(self, trajectory: Trajectory, *, env_step: int) -> None:
        """Take one turn (environment step ``env_step``), recorded in ``trajectory``."""
        self.loop.trajectory = trajectory
        self.loop.meta["env_step"] = env_step
        self.loop.step()

    def _act(self, loop: SearchLoop) -> SearchAction:
        run, options = self.run, self.options
        meta = {"searcher": run.index, "turn": loop.turn, "wave": run.wave, "env_step": loop.meta["env_step"]}
        notes = format_notes(
            run.history, max_passage_chars=options.max_passage_chars, max_notes_chars=options.max_notes_chars
        )
        pred = self.program.call_role("searcher", loop.trajectory, subtask=run.subtask, notes=notes)
        call = loop.trajectory.steps[-1]  # the branch trajectory is this Searcher's alone
        action, content = _read_turn(pred)
        valid = action is not None and bool(content)
        executed = action if valid else ("report" if run.history else "search")
        if not valid:
            reason = "unparseable output" if pred is None else ("empty content" if action else "unknown action")
            event = loop.trajectory.event("fallback", role="searcher", reason=reason, replaced_by=executed, **meta)
            if pred is not None:
                event.error = f"searcher output unusable: {reason}"
        run.turns += 1
        if executed == "search":
            query = content if valid else run.subtask
            call.meta.update(meta, action="search", query=query, valid=valid)
            loop.meta["fallback"] = not valid  # goes onto this turn's retrieval step
            return SearchAction("search", query, meta={"valid": valid})
        run.report = content if valid else fallback_report(run, max_report_chars=options.max_report_chars)
        run.forced = not valid
        call.meta.update(meta, action="report", report=run.report, valid=valid)
        return SearchAction("answer", run.report, meta={"valid": valid})

    def _observe(self, loop: SearchLoop, observation: Observation) -> None:
        self.run.history.append((observation.query, observation.passages))


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
