"""Typed values shared by the role signatures of every system: sufficiency, confidence, sub-goals and placeholders.

Role outputs stay flat (a ``Literal``, a ``str`` or a ``list[str]``) so a 135M-parameter model can emit them in DSPy's
ChatAdapter format; the pydantic models here are what programs build from those outputs.

Placeholders follow OPERA (arXiv 2508.16438, Sec. 3.3): a sub-goal ``p_i`` may hold ``[t from step j]`` with ``j < i``,
``t`` naming the expected type (entity, location, year, ...). MuSiQue-style ``#j`` references are read as well.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
    "Sufficiency",
    "Confidence",
    "CONFIDENCE_SCORES",
    "NULL_ANSWERS",
    "Placeholder",
    "SubGoal",
    "find_placeholders",
    "fill_placeholders",
    "hash_refs_to_placeholders",
    "is_null_answer",
]

Sufficiency = Literal["yes", "no"]
"""φ of the Analysis-Answer Agent: do the passages suffice to answer the sub-goal?"""

Confidence = Literal["high", "medium", "low"]
"""c_i of the Analysis-Answer Agent, as a three-level label (a 135M model writes words more reliably than floats)."""

CONFIDENCE_SCORES: dict[str, float] = {"high": 0.9, "medium": 0.6, "low": 0.3}
"""The float each confidence label stands for, when a score in [0, 1] is needed."""

NULL_ANSWERS = frozenset({"", "unknown", "none", "n/a", "na", "null", "not found", "not given", "not mentioned"})
"""Answers that mean "no answer" (the paper's ⊥)."""

_BRACKET = re.compile(r"\[\s*([^\[\]]*?)\s+from\s+step\s+(\d+)\s*\]", re.IGNORECASE)
_HASH = re.compile(r"#(\d+)\b")


class Placeholder(BaseModel):
    """One ``[type from step j]`` (or ``#j``) reference inside a sub-goal."""

    text: str = Field(description="the placeholder exactly as written")
    type: str = Field(description="expected information type, e.g. entity, location, year")
    step: int = Field(ge=1, description="1-based index of the sub-goal whose answer fills it")


class SubGoal(BaseModel):
    """One planned sub-goal ``p_i`` and the placeholders it holds."""

    index: int = Field(ge=1, description="1-based position in the plan")
    text: str
    placeholders: list[Placeholder] = Field(default_factory=list)

    @classmethod
    def parse(cls, text: str, index: int) -> SubGoal:
        """Build a sub-goal from its text, collecting its placeholders."""
        return cls(index=index, text=text, placeholders=find_placeholders(text))

    @property
    def dependencies(self) -> list[int]:
        """The earlier steps this sub-goal refers to, in order of first mention."""
        return list(dict.fromkeys(p.step for p in self.placeholders))


def find_placeholders(text: str) -> list[Placeholder]:
    """Every ``[type from step j]`` and ``#j`` reference in ``text``, in order.

    Example:
        >>> [p.step for p in find_placeholders("Who directed [film from step 1] with #2?")]
        [1, 2]
    """
    found = [
        (m.start(), Placeholder(text=m.group(0), type=m.group(1).strip() or "entity", step=int(m.group(2))))
        for m in _BRACKET.finditer(text)
        if int(m.group(2)) >= 1
    ]
    found += [
        (m.start(), Placeholder(text=m.group(0), type="entity", step=int(m.group(1))))
        for m in _HASH.finditer(text)
        if int(m.group(1)) >= 1
    ]
    return [p for _, p in sorted(found, key=lambda x: x[0])]


def fill_placeholders(text: str, answers: Mapping[int, str], *, before: int | None = None) -> tuple[str, list[str]]:
    """Replace each placeholder whose step has an answer; return the filled text and the placeholders left unfilled.

    Args:
        text: the sub-goal text.
        answers: answer of each resolved step, by 1-based step index (null answers count as unresolved).
        before: when given, only steps ``j < before`` may fill (a reference to a later step stays unfilled).

    Returns:
        ``(filled_text, unresolved)`` where ``unresolved`` lists the placeholder strings that stayed as written.

    Example:
        >>> fill_placeholders("Who founded [company from step 1]?", {1: "Totom Pictures"})
        ('Who founded Totom Pictures?', [])
    """
    unresolved: list[str] = []

    def replace(step: int, raw: str) -> str:
        answer = answers.get(step)
        if answer is None or is_null_answer(answer) or (before is not None and step >= before):
            unresolved.append(raw)
            return raw
        return answer.strip()

    filled = _BRACKET.sub(lambda m: replace(int(m.group(2)), m.group(0)), text)
    filled = _HASH.sub(lambda m: replace(int(m.group(1)), m.group(0)), filled)
    return filled, unresolved


def hash_refs_to_placeholders(text: str, answers: Mapping[int, str] | None = None) -> str:
    """Rewrite MuSiQue-style ``#k`` references as ``[type from step k]``; the type is ``year`` or ``entity``.

    Args:
        text: a gold sub-question.
        answers: gold answers by 1-based step, used to guess the type (four digits -> ``year``).

    Example:
        >>> hash_refs_to_placeholders("What is the official language of #1?")
        'What is the official language of [entity from step 1]?'
    """
    answers = answers or {}

    def kind(step: int) -> str:
        return "year" if re.fullmatch(r"\d{3,4}", (answers.get(step) or "").strip()) else "entity"

    return _HASH.sub(lambda m: f"[{kind(int(m.group(1)))} from step {m.group(1)}]", text)


def is_null_answer(answer: str | None) -> bool:
    """Whether ``answer`` means "no answer" (empty, ``unknown``, ``none``, ...)."""
    return answer is None or answer.strip().strip(".").lower() in NULL_ANSWERS
