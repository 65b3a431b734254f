"""D2Plan's ``#A_j`` answer placeholders (TEMPORARY home, moved out of the signatures; to be replaced by
:mod:`rolecall.programs.core.plan`)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rolecall.programs.core.plan import fill_placeholders, find_placeholders
from rolecall.signatures.types import is_null_answer

_ANSWER_REF = re.compile(r"#\s*A[_ ]?(\d+)\b", re.IGNORECASE)
_GOLD_REF = re.compile(r"#(\d+)\b")
_STEP_REF = re.compile(r"\[\s*[^\[\]]*?\s+from\s+step\s+(\d+)\s*\]", re.IGNORECASE)


def answer_refs(text: str) -> list[int]:
    """The sub-question numbers ``text`` refers to, in order of first mention.

    ``#A_j`` is D2Plan's placeholder; ``#A j``, ``#Aj``, ``#j`` and ``[type from step j]`` (what small models write
    instead) are read as the same reference.

    Example:
        >>> answer_refs("Is #A_2 older than #a1 or [person from step 3]?")
        [2, 1, 3]
    """
    found = [(m.start(), int(m.group(1))) for m in _ANSWER_REF.finditer(text) if int(m.group(1)) >= 1]
    rest = _ANSWER_REF.sub(lambda m: " " * len(m.group(0)), text)  # keep offsets, hide the #A_j forms
    found += [(_offset(rest, p.text), p.step) for p in find_placeholders(rest)]
    return list(dict.fromkeys(step for _, step in sorted(found)))


def has_answer_refs(text: str) -> bool:
    """Whether ``text`` still holds a placeholder (``#A_j`` or one of the forms :func:`answer_refs` reads)."""
    return bool(answer_refs(text))


def fill_answer_refs(text: str, answers: Mapping[int, str], *, before: int | None = None) -> tuple[str, list[str]]:
    """Replace each placeholder whose sub-question has an answer: the rule-based refinement (``#A_j -> a_j``).

    Args:
        text: a planned sub-question.
        answers: answer of each solved sub-question, by 1-based position in the plan (null answers count as unsolved).
        before: when given, only sub-questions ``j < before`` may fill (a reference forward stays as written).

    Returns:
        ``(filled_text, unresolved)``, ``unresolved`` listing the placeholders left as written.

    Example:
        >>> fill_answer_refs("In which city was #A_1 born?", {1: "Staekys Granuvell"})
        ('In which city was Staekys Granuvell born?', [])
    """
    unresolved: list[str] = []

    def replace(match: re.Match[str]) -> str:
        step, answer = int(match.group(1)), answers.get(int(match.group(1)))
        if answer is None or is_null_answer(answer) or (before is not None and step >= before):
            unresolved.append(match.group(0))
            return match.group(0)
        return answer.strip()

    filled = _ANSWER_REF.sub(replace, text)
    filled, rest = fill_placeholders(filled, answers, before=before)
    # fill_placeholders re-reports a #A_j left above only if it reads it, and it reads #j and [.. from step j] only
    return filled, unresolved + rest


def to_answer_refs(text: str) -> str:
    """Rewrite MuSiQue-style gold references ``#j`` as D2Plan's ``#A_j`` (for demos built from gold decompositions).

    Example:
        >>> to_answer_refs("What is the population of the city of #2?")
        'What is the population of the city of #A_2?'
    """
    return _GOLD_REF.sub(lambda m: f"#A_{m.group(1)}", text)


def _offset(text: str, needle: str) -> int:
    index = text.find(needle)
    return index if index >= 0 else len(text)


def renumber_answer_refs(text: str, positions: Mapping[int, int]) -> str:
    """Point each placeholder at a new sub-question number (``#A_j -> #A_{positions[j]}``, others unchanged), writing
    every form :func:`answer_refs` reads as ``#A_j``. Used when repeated sub-questions are dropped from a plan.

    Example:
        >>> renumber_answer_refs("Where was #A_3 born, near #1?", {3: 2})
        'Where was #A_2 born, near #A_1?'
    """

    def replace(match: re.Match[str]) -> str:
        step = int(match.group(1))
        return f"#A_{positions.get(step, step)}"

    return _GOLD_REF.sub(replace, _STEP_REF.sub(replace, _ANSWER_REF.sub(replace, text)))


def drop_repeats(items: list[str], *, offset: int = 0) -> list[str]:
    """``items`` without repeats of an earlier item, or truncated repeats (a small model's plan often loops until
    its token budget cuts the last item), with ``#A_j`` renumbered to the kept positions.

    Args:
        items: sub-questions at plan positions ``offset + 1, offset + 2, ...``.
        offset: plan positions before the first item (a revised plan starts at the failed position).

    Example:
        >>> drop_repeats(["Who is X?", "Who is X?", "Where was #A_2 born?", "Where was #A_2 b"])
        ['Who is X?', 'Where was #A_1 born?']
    """
    kept: list[str] = []
    positions: dict[int, int] = {}
    for k, text in enumerate(items, start=offset + 1):
        key = text.casefold()
        repeats = [
            j for j, t in enumerate(kept, 1) if t.casefold() == key or (len(key) >= 12 and t.casefold().startswith(key))
        ]
        same = repeats[0] if repeats else None
        if same is None:
            kept.append(text)
        positions[k] = offset + (same or len(kept))
    if len(kept) == len(items):
        return kept
    return [renumber_answer_refs(t, positions) for t in kept]
