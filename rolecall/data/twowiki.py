"""2WikiMultihopQA loader (Ho et al., COLING 2020, https://github.com/Alab-NII/2wikimultihop).

The official release is a JSON list of ``{_id, type, question, context, supporting_facts, evidences, answer}`` in
HotpotQA's original layout (``context: [[title, [sentences]]]``, ``supporting_facts: [[title, sent_id]]``), so the
paragraph and gold-id rules are those of :mod:`rolecall.data.hotpotqa`. JSONL files with the same records also load.

**Hops.** The paper's four types need 2 paragraphs (``comparison``, ``compositional``, ``inference``) or 4
(``bridge_comparison``: two bridge hops, then a comparison). ``hops`` is the number of distinct supporting titles,
which equals that convention on the official dev set but stays right for any record that departs from it; the type
table is the fallback when a record has no supporting facts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rolecall.data.hotpotqa import parse_context, parse_supporting_facts, supporting_ids_from_facts
from rolecall.data.io import Paragraph, Where, field, iter_records, load_examples, string_list
from rolecall.data.types import Example

__all__ = ["load_twowiki", "iter_paragraphs", "HOPS_BY_TYPE"]

logger = logging.getLogger(__name__)

HOPS_BY_TYPE: dict[str, int] = {"comparison": 2, "compositional": 2, "inference": 2, "bridge_comparison": 4}
"""Paragraphs each 2WikiMultihopQA question type needs (Ho et al. 2020, Section 3); the fallback for ``hops``."""

_ALIAS_KEYS = ("answer_aliases", "aliases")


def _parse_example(record: dict[str, Any], where: Where) -> Example:
    qid = field(record, "_id" if "_id" in record else "id", (str, int), where)
    qtype = field(record, "type", str, where, default="unknown")
    paragraphs = parse_context(record, where)
    facts = parse_supporting_facts(record, where)
    supporting_ids, sentence_ids = supporting_ids_from_facts(paragraphs, facts, where)
    answer = field(record, "answer", str, where, default=None)
    answers = [answer] if answer is not None else []
    for key in _ALIAS_KEYS:
        for alias in string_list(record.get(key) or [], key, where):
            if alias not in answers:
                answers.append(alias)
    evidences = field(record, "evidences", list, where, default=[])
    distinct_titles = len({title for title, _ in facts})
    return Example(
        id=str(qid),
        question=field(record, "question", str, where),
        answers=answers,
        supporting_ids=supporting_ids,
        decomposition=None,
        hops=distinct_titles or HOPS_BY_TYPE.get(qtype, 2),
        type=qtype,
        dataset="2wikimultihopqa",
        metadata={
            "evidences": evidences,
            "supporting_facts": [[t, i] for t, i in facts],
            "supporting_sentence_ids": sentence_ids,
        },
    )


def load_twowiki(path: str | Path, *, limit: int | None = None) -> list[Example]:
    """Load 2WikiMultihopQA examples from the official JSON list (or JSONL of the same records).

    ``answers`` is ``[answer]`` followed by ``answer_aliases``/``aliases`` when a record has them; ``metadata`` holds
    ``evidences`` (``[[subject, relation, object], ...]``), ``supporting_facts`` and ``supporting_sentence_ids``.

    Args:
        path: the dataset file.
        limit: keep only the first ``limit`` examples.

    Returns:
        The examples, in file order.

    Raises:
        DataFormatError: a record is malformed; the message names the file and the line or ``record N``.
    """
    return load_examples(path, _parse_example, limit=limit, name="2WikiMultihopQA")


def iter_paragraphs(path: str | Path) -> Iterator[Paragraph]:
    """Every context paragraph of every record, in file order, duplicates included (the corpus builder dedups)."""
    for where, record in iter_records(path):
        yield from parse_context(record, where)
