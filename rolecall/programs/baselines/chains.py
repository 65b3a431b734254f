"""The text the iterative baselines' roles read and write: IRCoT's reasoning chain and its answer cue, and the
Self-Ask history of follow-up questions. Shared by the programs (IRCoT, Self-Ask) and their demos
(:mod:`rolecall.programs.baselines.iterative_demos`), which import them from here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "ANSWER_CUE",
    "NO_HISTORY",
    "NO_REASONING",
    "format_history",
    "has_answer_cue",
    "answer_after_cue",
    "first_sentence",
]

ANSWER_CUE = "So the answer is"
"""IRCoT's stop phrase: a reasoning sentence holding it ends the chain."""

NO_HISTORY = "(none)"
"""The Self-Ask history before the first follow-up question."""

NO_REASONING = "(none)"
"""IRCoT's reasoning before the first sentence."""

_CUE = re.compile(r"answer\s+is\b\s*:?\s*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def format_history(pairs: Sequence[tuple[str, str]]) -> str:
    """The Self-Ask history: ``"Follow up: q\\nIntermediate answer: a"`` per pair, or ``"(none)"``.

    Example:
        >>> print(format_history([("Who directed X?", "Ada")]))
        Follow up: Who directed X?
        Intermediate answer: Ada
    """
    if not pairs:
        return NO_HISTORY
    return "\n".join(f"Follow up: {q}\nIntermediate answer: {a}" for q, a in pairs)


def has_answer_cue(sentence: str) -> bool:
    """Whether an IRCoT sentence ends the chain (it says "... the answer is ...").

    Example:
        >>> has_answer_cue("So the answer is Varn."), has_answer_cue("Ada was born in Varn.")
        (True, False)
    """
    return _CUE.search(sentence) is not None


def answer_after_cue(text: str) -> str:
    """The answer stated after the last "answer is" in ``text`` (trailing period and quotes removed), or ``""``.

    Example:
        >>> answer_after_cue("Ada was born in Varn. So the answer is: Varn.")
        'Varn'
    """
    matches = list(_CUE.finditer(text))
    if not matches:
        return ""
    answer = text[matches[-1].end() :].strip().splitlines()[0] if text[matches[-1].end() :].strip() else ""
    return answer.strip().rstrip(".").strip().strip("\"'").strip()


def first_sentence(text: str) -> str:
    """The first sentence of a generation (IRCoT keeps only that), plus the second when it states the answer, as in
    "Ada was born in Varn. So the answer is Varn."; naive version: ``text.split(". ")[0]``.

    Example:
        >>> first_sentence("Ada directed X. She was born in 1900.")
        'Ada directed X.'
    """
    sentences = _SENTENCE_END.split(" ".join(text.split()))
    if len(sentences) > 1 and not has_answer_cue(sentences[0]) and has_answer_cue(sentences[1]):
        return f"{sentences[0]} {sentences[1]}"
    return sentences[0]
