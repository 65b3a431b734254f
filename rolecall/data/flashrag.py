"""FlashRAG JSONL datasets and corpora (Jin et al., 2024, https://github.com/RUC-NLPIR/FlashRAG), read and written.

* **Datasets**: one ``{id, question, golden_answers, metadata}`` object per line.
* **Corpora**: one ``{id, contents}`` object per line, where ``contents`` is ``"title"\\ntext`` (the first line is the
  title, in double quotes by convention).

rolecall's extra gold fields ride in ``metadata`` under the reserved keys :data:`RESERVED_KEYS` (``supporting_ids``,
``decomposition``, ``hops``, ``type``, ``dataset``), so :func:`write_flashrag` followed by :func:`load_flashrag` gives
back equal :class:`~rolecall.data.types.Example`\\ s. FlashRAG's own files already use ``metadata.type`` for the
question type, which :func:`load_flashrag` reads the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rolecall.data.io import (
    Paragraph,
    Where,
    field,
    gold_answer_list,
    iter_records,
    load_examples,
    string_list,
    write_jsonl,
)
from rolecall.data.types import Document, Example, SubStep

__all__ = [
    "RESERVED_KEYS",
    "load_flashrag",
    "write_flashrag",
    "load_flashrag_corpus",
    "write_flashrag_corpus",
    "iter_paragraphs",
    "split_contents",
    "join_contents",
]

logger = logging.getLogger(__name__)

RESERVED_KEYS: tuple[str, ...] = ("supporting_ids", "decomposition", "hops", "type", "dataset")
"""``metadata`` keys that carry :class:`Example` fields through a FlashRAG file."""


def split_contents(contents: str) -> tuple[str, str]:
    """``(title, text)`` of a FlashRAG ``contents`` string: the first line, less one pair of enclosing double quotes.

    A string without a newline is all text, with an empty title.

    Example:
        >>> split_contents('"Paris"\\nParis is the capital of France.')
        ('Paris', 'Paris is the capital of France.')
    """
    if "\n" not in contents:
        return "", contents
    title, text = contents.split("\n", 1)
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def join_contents(title: str, text: str) -> str:
    """Inverse of :func:`split_contents`: ``f'"{title}"\\n{text}'``.

    Raises:
        ValueError: the title contains a newline (it could not be read back).
    """
    if "\n" in title:
        raise ValueError(f"a FlashRAG title cannot contain a newline, got {title!r}")
    return f'"{title}"\n{text}'


def _parse_decomposition(value: Any, where: Where) -> list[SubStep] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise where.error(f"metadata.decomposition should be a list of steps, got {type(value).__name__}")
    steps = []
    for i, step in enumerate(value):
        if not isinstance(step, dict):
            raise where.error(f"metadata.decomposition[{i}] should be an object, got {type(step).__name__}")
        steps.append(
            SubStep(
                question=field(step, "question", str, where),
                answer=field(step, "answer", str, where, default=""),
                supporting_ids=string_list(step.get("supporting_ids") or [], "supporting_ids", where),
            )
        )
    return steps


def _parse_example(record: dict[str, Any], where: Where) -> Example:
    metadata = dict(field(record, "metadata", dict, where, default={}))
    reserved = {key: metadata.pop(key) for key in RESERVED_KEYS if key in metadata}
    hops = field(reserved, "hops", int, where, default=1)
    return Example(
        id=str(field(record, "id", (str, int), where)),
        question=field(record, "question", str, where),
        answers=gold_answer_list(record, "golden_answers", where),
        supporting_ids=list(string_list(reserved.get("supporting_ids") or [], "supporting_ids", where)),
        decomposition=_parse_decomposition(reserved.get("decomposition"), where),
        hops=hops,
        type=field(reserved, "type", str, where, default="unknown"),
        dataset=field(reserved, "dataset", str, where, default="flashrag"),
        metadata=metadata,
    )


def load_flashrag(path: str | Path, *, limit: int | None = None) -> list[Example]:
    """Load a FlashRAG ``{id, question, golden_answers, metadata}`` JSONL dataset.

    Args:
        path: the dataset file.
        limit: keep only the first ``limit`` examples.

    Returns:
        The examples, in file order; :data:`RESERVED_KEYS` found in ``metadata`` become :class:`Example` fields.

    Raises:
        DataFormatError: a record is malformed; the message names the file and the line.
    """
    return load_examples(path, _parse_example, limit=limit, name="FlashRAG")


def write_flashrag(examples: Iterable[Example], path: str | Path) -> int:
    """Write examples as a FlashRAG JSONL dataset that :func:`load_flashrag` reads back unchanged.

    A key of ``example.metadata`` named like one of :data:`RESERVED_KEYS` is replaced by the field's value (with a
    warning when they differ).

    Returns:
        The number of examples written.
    """

    def records() -> Iterator[dict[str, Any]]:
        for ex in examples:
            metadata = dict(ex.metadata)
            reserved = {
                "supporting_ids": list(ex.supporting_ids),
                "decomposition": [asdict(s) for s in ex.decomposition] if ex.decomposition is not None else None,
                "hops": ex.hops,
                "type": ex.type,
                "dataset": ex.dataset,
            }
            clashes = [k for k in RESERVED_KEYS if k in metadata and metadata[k] != reserved[k]]
            if clashes:
                logger.warning("example %s: metadata keys %s are replaced by the example's fields", ex.id, clashes)
            metadata.update(reserved)
            yield {"id": ex.id, "question": ex.question, "golden_answers": list(ex.answers), "metadata": metadata}

    return write_jsonl(records(), path)


def _parse_document(record: dict[str, Any], where: Where) -> Document:
    doc = str(field(record, "id", (str, int), where))
    if "contents" in record or not ("title" in record and "text" in record):
        title, text = split_contents(field(record, "contents", str, where))
    else:  # some corpora store the title and text separately
        title, text = field(record, "title", str, where), field(record, "text", str, where)
    return Document(id=doc, title=title, text=text)


def load_flashrag_corpus(path: str | Path) -> list[Document]:
    """Load a FlashRAG ``{id, contents}`` JSONL corpus, keeping the file's ids.

    Records with separate ``title`` and ``text`` keys (and no ``contents``) are accepted too.

    Raises:
        DataFormatError: a record is malformed; the message names the file and the line.
    """
    docs = [_parse_document(record, where) for where, record in iter_records(path)]
    logger.info("loaded %d FlashRAG corpus documents from %s", len(docs), path)
    return docs


def write_flashrag_corpus(docs: Iterable[Document], path: str | Path) -> int:
    """Write documents as a FlashRAG ``{id, contents}`` JSONL corpus (``contents = '"title"\\ntext'``).

    Returns:
        The number of documents written.

    Raises:
        ValueError: a title contains a newline.
    """
    return write_jsonl(({"id": d.id, "contents": join_contents(d.title, d.text)} for d in docs), path)


def iter_paragraphs(path: str | Path) -> Iterator[Paragraph]:
    """Every document of a FlashRAG corpus as a :class:`Paragraph` (ids are then re-derived from title and text)."""
    for where, record in iter_records(path):
        doc = _parse_document(record, where)
        yield Paragraph.from_text(doc.title, doc.text)
