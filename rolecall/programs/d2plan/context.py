"""What D2Plan's Reasoner reads: the global context C and one sub-question's search notes; the record of a sub-question.

Every Reasoner call after planning sees the question, the current plan and the solved sub-questions with their answers
and evidence: the paper's global context C (Algorithm 5: "the evidence is added to the global context C" and the
next sub-question is refined "based on C"). :func:`format_context` writes C as one line per plan position, so the plan
and its solved part cost one field, not two:

    1. Who directed Film X? -> Ada Quell (Film X was directed by Ada Quell.)
    2. Where was #A_1 born?

The demos (:mod:`rolecall.programs.d2plan.demos`) build their inputs with the same functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from rolecall.programs.core.text import shorten

__all__ = [
    "NO_NOTES",
    "NO_ANSWER",
    "Status",
    "SubQuestion",
    "ContextEntry",
    "format_context",
    "format_notes",
    "entity_query",
]

NO_NOTES = "(none yet)"
"""The notes a sub-question starts with, before its first search."""

NO_ANSWER = "unknown"
"""How the context shows a sub-question that ran without an answer."""

Status = Literal["solved", "failed", "skipped"]

ContextEntry = tuple[int, str, str | None, str]
"""One line of the global context: ``(position, sub-question, answer, evidence)``; the answer is None for a
sub-question that has not run yet and ``""`` for one that ran without an answer."""


@dataclass
class SubQuestion:
    """One executed sub-question: its planned text, the text it ran as, and what came of it."""

    index: int
    planned: str
    text: str
    answer: str = ""
    status: Status = "failed"
    searches: int = 0
    relevant: list[bool | None] = field(default_factory=list)
    """The Purifier's judgement of each search (None: no Purifier, or its output did not parse)."""
    notes: list[str] = field(default_factory=list)
    """What each search gave the Reasoner: the Purifier's key information or summary, or the raw passages."""
    failure: str = ""

    def evidence(self, max_chars: int) -> str:
        """The notes the answer rests on, at most ``max_chars`` characters: the searches judged relevant, else the
        latest unjudged one (raw passages, or a Purifier output that did not parse); empty when every search was
        judged irrelevant or there was none (answered without retrieval).

        Example:
            >>> sub = SubQuestion(1, "q", "q", relevant=[False, True], notes=["about a band", "Ada was born in Varn."])
            >>> sub.evidence(100)
            'Ada was born in Varn.'
        """
        kept = [n for r, n in zip(self.relevant, self.notes, strict=True) if r]
        if not kept:
            kept = [n for r, n in zip(self.relevant, self.notes, strict=True) if r is None][-1:]
        return shorten("; ".join(kept), max_chars) if kept else ""


def format_context(entries: Iterable[ContextEntry]) -> str:
    """The global context C: one line per plan position (see :data:`ContextEntry`), or ``"(no plan)"``.

    Example:
        >>> print(format_context([(1, "Who directed X?", "Ada Quell", "X is by Ada Quell."), (2, "Where was #A_1 born?",
        ...     None, "")]))
        1. Who directed X? -> Ada Quell (X is by Ada Quell.)
        2. Where was #A_1 born?
    """
    lines = []
    for j, text, answer, evidence in entries:
        line = f"{j}. {text}"
        if answer is not None:
            line += f" -> {answer or NO_ANSWER}" + (f" ({evidence})" if answer and evidence else "")
        lines.append(line)
    return "\n".join(lines) or "(no plan)"


def format_notes(sub: SubQuestion, *, purified: bool, max_chars: int) -> str:
    """What the Reasoner sees of a sub-question's own searches: the Purifier's labelled notes, or (without the
    Purifier) the raw passages of the latest searches that fit in ``max_chars``; :data:`NO_NOTES` before the first.

    Example:
        >>> print(format_notes(SubQuestion(1, "q", "q", relevant=[False, True], notes=["a band", "Ada Quell."]),
        ...     purified=True, max_chars=900))
        [1] not relevant: a band
        [2] relevant: Ada Quell.
    """
    if not sub.notes:
        return NO_NOTES
    if purified:
        labels = {True: "relevant: ", False: "not relevant: ", None: ""}
        return "\n".join(
            f"[{k}] {labels[r]}{n}" for k, (r, n) in enumerate(zip(sub.relevant, sub.notes, strict=True), 1)
        )
    kept: list[str] = []
    for k in range(len(sub.notes), 0, -1):
        block = f"Search {k}:\n{sub.notes[k - 1]}"
        if kept and sum(len(b) for b in kept) + len(block) > max_chars:
            break
        kept.insert(0, block)
    return "\n".join(kept)


def entity_query(text: str) -> str:
    """The capitalised words of ``text`` after its first word: a mechanical entity query when the Reasoner gave none.

    Example:
        >>> entity_query("In which city was Staekys Granuvell born?")
        'Staekys Granuvell'
    """
    words = [w.strip("?.,;:!'\"") for w in text.split()[1:]]
    return " ".join(w for w in words if w[:1].isupper() or w[:1].isdigit())
