"""The role signatures of D2Plan (Luo, Wu and Feng, "D2Plan: Dual-Agent Dynamic Global Planning for Complex
Retrieval-Augmented Reasoning", arXiv 2601.08282), and its ``#A_j`` answer placeholders.

D2Plan has two agents (Sec. 2.1). The Reasoner is, in the paper, one multi-turn generation with tags: it assesses the
question's complexity, writes a ``<plan>`` of ordered sub-questions (``#A_j`` stands for the answer of sub-question
``j``), searches up to K times per sub-question, refines the next sub-question after solving one, writes a ``<replan>``
after a failure and ends with ``<answer>``. Here that generation is split into five typed calls a 135M model can emit,
one per tag-delimited part of the paper's trajectory; the ``reasoner_`` prefix of their role names marks them as one
policy (SPlanRL trains the Reasoner as a whole):

- ``ReasonerPlan``: ``q -> (complexity, plan)``; a single-hop question is not decomposed.
- ``ReasonerStep``: ``(sub-question, notes so far) -> search with a query, or answer``.
- ``ReasonerRefine``: ``(next sub-question, solved sub-questions) -> the sub-question made self-contained``.
- ``ReasonerRevise``: ``(q, solved, failed sub-question, what the searches found) -> new remaining plan``.
- ``ReasonerAnswer``: ``(q, solved sub-questions) -> answer``.

The Purifier (``Purify``) sits between the retriever and the Reasoner: ``(sub-question, passages) -> (relevant?,
key information)``, or a short summary of the passages when they are irrelevant.

The helpers at the end read and fill ``#A_j`` (also the ``#j`` and ``[type from step j]`` forms small models write),
and drop the repeats a small model's looping plan contains without breaking the numbering.

The paper's prompts (its Appendix J) are not in the text we have, so the instructions are written from the role
descriptions, and kept short: every instruction token is paid on every call of a 135M-parameter model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

import dspy

from rolecall.signatures.types import fill_placeholders, find_placeholders, is_null_answer

__all__ = [
    "Complexity",
    "Action",
    "Relevance",
    "ReasonerPlan",
    "ReasonerStep",
    "ReasonerRefine",
    "ReasonerRevise",
    "ReasonerAnswer",
    "Purify",
    "answer_refs",
    "has_answer_refs",
    "fill_answer_refs",
    "to_answer_refs",
    "renumber_answer_refs",
    "drop_repeats",
]

Complexity = Literal["single-hop", "multi-hop"]
"""The Reasoner's complexity assessment: single-hop questions are not decomposed (Sec. 2.1)."""

Action = Literal["search", "answer"]
"""What the Reasoner does next on a sub-question: search again or answer it."""

Relevance = Literal["yes", "no"]
"""The Purifier's relevance judgement J_k: do the passages hold the key information for the sub-question?"""

_ANSWER_REF = re.compile(r"#\s*A[_ ]?(\d+)\b", re.IGNORECASE)
_GOLD_REF = re.compile(r"#(\d+)\b")
_STEP_REF = re.compile(r"\[\s*[^\[\]]*?\s+from\s+step\s+(\d+)\s*\]", re.IGNORECASE)


class ReasonerPlan(dspy.Signature):
    """Does the question need one fact (single-hop) or a chain of facts (multi-hop)?
    Single-hop: the plan is the question itself. Multi-hop: list sub-questions in order, one fact each;
    write #A_1, #A_2, ... for the answer of sub-question 1, 2, ..."""

    question: str = dspy.InputField()
    complexity: Complexity = dspy.OutputField()
    plan: list[str] = dspy.OutputField(desc="ordered sub-questions")


class ReasonerStep(dspy.Signature):
    """Solve the sub-question. If the notes give its answer, answer it.
    Otherwise search with a short query that names the entity to look up."""

    sub_question: str = dspy.InputField()
    notes: str = dspy.InputField(desc="what earlier searches found")
    action: Action = dspy.OutputField(desc="search or answer")
    query: str = dspy.OutputField(desc="a short search query, or none")
    answer: str = dspy.OutputField(desc="a few words, or unknown")


class ReasonerRefine(dspy.Signature):
    """Rewrite the sub-question so it stands alone: replace each #A_j by the answer of sub-question j."""

    sub_question: str = dspy.InputField()
    solved: str = dspy.InputField(desc="earlier sub-questions with their answers")
    refined: str = dspy.OutputField(desc="the sub-question without #A_j")


class ReasonerRevise(dspy.Signature):
    """Searching did not answer the failed sub-question. Write a new plan for the rest of the question,
    starting in its place: smaller or reworded sub-questions. Write #A_j for the answer of sub-question j."""

    question: str = dspy.InputField()
    solved: str = dspy.InputField(desc="sub-questions already answered")
    failed: str = dspy.InputField(desc="the sub-question that failed")
    failure: str = dspy.InputField(desc="what the searches found")
    plan: list[str] = dspy.OutputField(desc="new sub-questions replacing the failed one and those after it")


class ReasonerAnswer(dspy.Signature):
    """Answer the question from its solved sub-questions. Give only the short answer."""

    question: str = dspy.InputField()
    solved: str = dspy.InputField(desc="sub-questions with their answers")
    answer: str = dspy.OutputField(desc="a few words")


class Purify(dspy.Signature):
    """Do the passages hold the answer to the sub-question?
    If yes, copy the sentence that answers it. If no, say in a few words what the passages are about."""

    sub_question: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    relevant: Relevance = dspy.OutputField(desc="yes or no")
    information: str = dspy.OutputField(desc="the key sentence, or a short summary")


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
