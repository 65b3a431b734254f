"""MuSiQue loader (Trivedi et al., TACL 2022, https://github.com/StonyBrookNLP/musique).

The official MuSiQue JSONL records are ``{id, paragraphs: [{idx, title, paragraph_text, is_supporting}], question,
question_decomposition: [{id, question, answer, paragraph_support_idx}], answer, answer_aliases, answerable}``.
MuSiQue is the only one of the three datasets with a gold decomposition; its steps already refer to earlier answers
with ``#k`` placeholders (``"what did #1 won a tony for"``), which :class:`~rolecall.data.types.SubStep` keeps as they
are. Some steps are written as Wikidata-style triples (``"#2 >> headquarters location"``); they are kept too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rolecall.data.io import Paragraph, Where, check_limit, field, gold_answer, iter_records, string_list
from rolecall.data.types import Example, SubStep

__all__ = ["load_musique", "iter_paragraphs"]

logger = logging.getLogger(__name__)

# Ids look like "3hop1__567737_141375_458768"; the prefix names the hop count and the graph shape.
_TYPE_PREFIX = re.compile(r"^(\d+hop\d*)__")


def _parse_paragraphs(record: dict[str, Any], where: Where) -> dict[int, tuple[Paragraph, bool]]:
    """``idx -> (paragraph, is_supporting)`` in file order."""
    out: dict[int, tuple[Paragraph, bool]] = {}
    for i, item in enumerate(field(record, "paragraphs", list, where)):
        if not isinstance(item, dict):
            raise where.error(f"paragraphs[{i}] should be an object, got {type(item).__name__}")
        idx = field(item, "idx", int, where, default=i)
        if idx in out:
            raise where.error(f"paragraphs[{i}] repeats idx {idx}")
        paragraph = Paragraph.from_text(field(item, "title", str, where), field(item, "paragraph_text", str, where))
        out[idx] = (paragraph, field(item, "is_supporting", bool, where, default=False))
    return out


def _parse_decomposition(
    record: dict[str, Any], paragraphs: dict[int, tuple[Paragraph, bool]], where: Where
) -> list[SubStep] | None:
    steps = field(record, "question_decomposition", list, where, default=None)
    if steps is None:
        return None
    decomposition = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise where.error(f"question_decomposition[{i}] should be an object, got {type(step).__name__}")
        support = field(step, "paragraph_support_idx", int, where, default=None)
        if support is not None and support not in paragraphs:
            raise where.error(f"question_decomposition[{i}].paragraph_support_idx={support} is not a paragraph idx")
        decomposition.append(
            SubStep(
                question=field(step, "question", str, where),
                answer=field(step, "answer", str, where, default=""),
                supporting_ids=[paragraphs[support][0].id] if support is not None else [],
            )
        )
    return decomposition


def _parse_example(record: dict[str, Any], where: Where) -> Example:
    qid = str(field(record, "id", (str, int), where))
    paragraphs = _parse_paragraphs(record, where)
    decomposition = _parse_decomposition(record, paragraphs, where)
    # Gold paragraphs in hop order (as the decomposition uses them), then any other is_supporting ones in file order.
    in_steps = [i for step in decomposition or [] for i in step.supporting_ids]
    flagged = [p.id for p, supporting in paragraphs.values() if supporting]
    supporting_ids = list(dict.fromkeys([i for i in in_steps if i in flagged] + flagged))
    answerable = field(record, "answerable", bool, where, default=True)
    # MuSiQue-Full's unanswerable contrast questions may come without an answer; an answerable one needs its gold
    answer = gold_answer(record, "answer", where) if answerable else field(record, "answer", str, where, default=None)
    answers = [answer] if answer else []
    for alias in string_list(record.get("answer_aliases") or [], "answer_aliases", where):
        if alias not in answers:
            answers.append(alias)
    hops = len(decomposition) if decomposition else max(len(supporting_ids), 1)
    prefix = _TYPE_PREFIX.match(qid)
    steps = record.get("question_decomposition") or []
    return Example(
        id=qid,
        question=field(record, "question", str, where),
        answers=answers,
        supporting_ids=supporting_ids,
        decomposition=decomposition,
        hops=hops,
        type=prefix.group(1) if prefix else f"{hops}hop",
        dataset="musique",
        metadata={
            "answerable": answerable,
            "step_ids": [step.get("id") for step in steps],
        },
    )


def load_musique(path: str | Path, *, limit: int | None = None, answerable_only: bool = True) -> list[Example]:
    """Load MuSiQue examples from the official JSONL (MuSiQue-Ans, or MuSiQue-Full with ``answerable_only``).

    ``answers`` is ``[answer] + answer_aliases``; ``supporting_ids`` are the ``is_supporting`` paragraphs; each step of
    ``decomposition`` carries the id of its ``paragraph_support_idx`` paragraph; ``hops`` is the number of steps and
    ``type`` the id prefix (``2hop``, ``3hop1``, ``3hop2``, ``4hop1``, ...), else ``f"{hops}hop"``. ``metadata`` holds
    ``answerable`` and the MuSiQue ``step_ids`` of the decomposition.

    Args:
        path: the dataset file.
        limit: keep only the first ``limit`` examples (counted after the ``answerable_only`` filter).
        answerable_only: skip records with ``answerable: false`` (MuSiQue-Full's contrast questions).

    Returns:
        The examples, in file order.

    Raises:
        DataFormatError: a record is malformed; the message names the file and the line or ``record N``.
    """
    check_limit(limit)
    examples: list[Example] = []
    skipped = 0
    for where, record in iter_records(path):
        if limit is not None and len(examples) >= limit:
            break
        if answerable_only and not field(record, "answerable", bool, where, default=True):
            skipped += 1
            continue
        examples.append(_parse_example(record, where))
    logger.info("loaded %d MuSiQue examples from %s (%d unanswerable skipped)", len(examples), path, skipped)
    return examples


def iter_paragraphs(path: str | Path) -> Iterator[Paragraph]:
    """Every paragraph of every record (answerable or not), in file order, duplicates included."""
    for where, record in iter_records(path):
        for paragraph, _ in _parse_paragraphs(record, where).values():
            yield paragraph
