"""HotpotQA loader (Yang et al., EMNLP 2018, https://hotpotqa.github.io), in both of its published layouts.

* **Hugging Face** ``hotpot_qa`` rows (usually JSONL): ``id``, ``context: {title: [...], sentences: [[...]]}``,
  ``supporting_facts: {title: [...], sent_id: [...]}``.
* **Original** release (a JSON list): ``_id``, ``context: [[title, [sentences]]]``,
  ``supporting_facts: [[title, sent_id]]``. 2WikiMultihopQA uses this layout too (see :mod:`rolecall.data.twowiki`).

The layout is detected per record from the type of ``context``, and the container (JSON list or JSONL) from the file.
Gold supporting paragraphs are the context paragraphs whose titles appear in ``supporting_facts``; their ids are
:func:`~rolecall.data.types.doc_id` of (title, text) with the text rule of :meth:`Paragraph.from_sentences`, so they
match a corpus built by :func:`rolecall.data.corpus.build_corpus`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rolecall.data.io import Paragraph, Where, field, gold_answer, iter_records, load_examples, string_list
from rolecall.data.types import Example

__all__ = ["load_hotpotqa", "iter_paragraphs", "parse_context", "parse_supporting_facts", "supporting_ids_from_facts"]

logger = logging.getLogger(__name__)


def parse_context(record: dict[str, Any], where: Where) -> list[Paragraph]:
    """The record's context paragraphs, from either layout.

    Raises:
        DataFormatError: ``context`` is missing or is neither layout.
    """
    context = field(record, "context", (dict, list), where)
    if isinstance(context, dict):  # Hugging Face: parallel lists
        titles = string_list(field(context, "title", list, where), "context.title", where)
        sentences = field(context, "sentences", list, where)
        if len(titles) != len(sentences):
            raise where.error(
                f"context.title has {len(titles)} entries but context.sentences has {len(sentences)}; "
                "they must be parallel lists"
            )
        return [
            Paragraph.from_sentences(t, string_list(s, f"context.sentences[{i}]", where))
            for i, (t, s) in enumerate(zip(titles, sentences, strict=True))
        ]
    paragraphs = []
    for i, item in enumerate(context):  # original: [[title, [sentences]], ...]
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise where.error(f"context[{i}] should be [title, [sentences]], got {str(item)[:80]}")
        paragraphs.append(Paragraph.from_sentences(item[0], string_list(item[1], f"context[{i}][1]", where)))
    return paragraphs


def parse_supporting_facts(record: dict[str, Any], where: Where) -> list[tuple[str, int]]:
    """The record's ``(title, sent_id)`` supporting facts from either layout (empty when the key is absent)."""
    facts = field(record, "supporting_facts", (dict, list), where, default=[])
    if isinstance(facts, dict):
        titles = string_list(field(facts, "title", list, where), "supporting_facts.title", where)
        sent_ids = field(facts, "sent_id", list, where)
        if len(titles) != len(sent_ids) or not all(isinstance(i, int) for i in sent_ids):
            raise where.error("supporting_facts.title and supporting_facts.sent_id should be parallel lists")
        return list(zip(titles, sent_ids, strict=True))
    out = []
    for i, item in enumerate(facts):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)):
            raise where.error(f"supporting_facts[{i}] should be [title, sent_id], got {str(item)[:80]}")
        out.append((item[0], item[1]))
    return out


def supporting_ids_from_facts(
    paragraphs: list[Paragraph], facts: list[tuple[str, int]], where: Where
) -> tuple[list[str], list[str]]:
    """Gold paragraph ids and gold sentence ids (``f"{paragraph_id}#s{i}"``) of the supporting facts, in fact order.

    When a title occurs more than once in the context (2WikiMultihopQA has a few such records), the first paragraph
    with that title that has sentence ``sent_id`` is used. A fact whose title is not in the context is skipped with a
    warning (the original HotpotQA train set has a handful).
    """
    by_title: dict[str, list[Paragraph]] = {}
    for p in paragraphs:
        by_title.setdefault(p.title, []).append(p)
    paragraph_ids: list[str] = []
    sentence_ids: list[str] = []
    for title, sent_id in facts:
        candidates = by_title.get(title)
        if not candidates:
            logger.warning("%s: supporting fact title %r is not in the context; skipped", where, title)
            continue
        p = next((c for c in candidates if 0 <= sent_id < len(c.sentences)), candidates[0])
        if p.id not in paragraph_ids:
            paragraph_ids.append(p.id)
        if 0 <= sent_id < len(p.sentences) and p.sentence_id(sent_id) not in sentence_ids:
            sentence_ids.append(p.sentence_id(sent_id))
    return paragraph_ids, sentence_ids


def _parse_example(record: dict[str, Any], where: Where) -> Example:
    qid = field(record, "_id" if "_id" in record else "id", (str, int), where)
    paragraphs = parse_context(record, where)
    facts = parse_supporting_facts(record, where)
    supporting_ids, sentence_ids = supporting_ids_from_facts(paragraphs, facts, where)
    answer = gold_answer(record, "answer", where)
    metadata: dict[str, Any] = {
        "supporting_facts": [[t, i] for t, i in facts],
        "supporting_sentence_ids": sentence_ids,
    }
    if "level" in record:
        metadata["level"] = field(record, "level", str, where)
    return Example(
        id=str(qid),
        question=field(record, "question", str, where),
        answers=[answer],
        supporting_ids=supporting_ids,
        decomposition=None,
        hops=2,  # every HotpotQA question needs exactly two paragraphs
        type=field(record, "type", str, where, default="unknown"),
        dataset="hotpotqa",
        metadata=metadata,
    )


def load_hotpotqa(path: str | Path, *, limit: int | None = None) -> list[Example]:
    """Load HotpotQA examples from a Hugging Face-layout JSONL or an original-layout JSON list.

    ``answers`` is ``[answer]`` (``yes``/``no`` kept as they are; a record without one, such as the unlabelled test
    set's, is an error: it could not be scored), ``hops`` is 2,
    ``type`` is ``bridge`` or ``comparison``, and ``metadata`` holds ``level``, ``supporting_facts``
    (``[[title, sent_id], ...]``) and ``supporting_sentence_ids`` (ids in a ``level="sentence"`` corpus).

    Args:
        path: the dataset file.
        limit: keep only the first ``limit`` examples.

    Returns:
        The examples, in file order.

    Raises:
        DataFormatError: a record is malformed; the message names the file and the line or ``record N``.

    Example:
        >>> from rolecall.data.hotpotqa import load_hotpotqa
        >>> examples = load_hotpotqa("../shared/data/hotpotqa/hotpot_dev_distractor_600.jsonl")  # doctest: +SKIP
    """
    return load_examples(path, _parse_example, limit=limit, name="HotpotQA")


def iter_paragraphs(path: str | Path) -> Iterator[Paragraph]:
    """Every context paragraph of every record, in file order, duplicates included (the corpus builder dedups)."""
    for where, record in iter_records(path):
        yield from parse_context(record, where)
