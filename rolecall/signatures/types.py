"""Typed values shared by the role signatures of every system: sufficiency, confidence and the null answer.

Role outputs stay flat (a ``Literal``, a ``str`` or a ``list[str]``) so a 135M-parameter model can emit them in DSPy's
ChatAdapter format; the pydantic models here are what programs build from those outputs.

Plans and their placeholders (``[t from step j]``, ``#j``, ``#A_j``) are read by the plan graph,
:mod:`rolecall.programs.core.plan`.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "Sufficiency",
    "Confidence",
    "CONFIDENCE_SCORES",
    "NULL_ANSWERS",
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


def is_null_answer(answer: str | None) -> bool:
    """Whether ``answer`` means "no answer" (empty, ``unknown``, ``none``, ...)."""
    return answer is None or answer.strip().strip(".").lower() in NULL_ANSWERS
