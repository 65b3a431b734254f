"""Write a synthetic world as FlashRAG JSONL: ``train.jsonl dev.jsonl test.jsonl corpus.jsonl``.

Question lines are ``{"id", "question", "golden_answers", "metadata"}`` with ``metadata`` holding ``supporting_ids``,
``decomposition`` (``[{"question", "answer", "supporting_ids"}]``), ``hops``, ``type`` and the synthetic extras
(``subtype``, ``template``, ``program``, ``facts``). Corpus lines are ``{"id", "contents"}`` with
``contents = '"<title>"\\n<text>'``, FlashRAG's convention.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rolecall.data.types import Document, Example

__all__ = ["example_record", "document_record", "write_jsonl", "write_questions", "write_corpus"]


def example_record(example: Example) -> dict[str, Any]:
    """The FlashRAG question record of ``example``."""
    metadata = {
        "supporting_ids": list(example.supporting_ids),
        "decomposition": [asdict(s) for s in example.decomposition or []],
        "hops": example.hops,
        "type": example.type,
        "dataset": example.dataset,
        **example.metadata,
    }
    return {
        "id": example.id,
        "question": example.question,
        "golden_answers": list(example.answers),
        "metadata": metadata,
    }


def document_record(document: Document) -> dict[str, str]:
    """The FlashRAG corpus record of ``document``."""
    return {"id": document.id, "contents": f'"{document.title}"\n{document.text}'}


def write_jsonl(records: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write one compact JSON object per line (UTF-8, ``\\n`` endings) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def write_questions(examples: Iterable[Example], path: str | Path) -> Path:
    """Write examples as FlashRAG question JSONL."""
    return write_jsonl((example_record(e) for e in examples), path)


def write_corpus(documents: Iterable[Document], path: str | Path) -> Path:
    """Write documents as FlashRAG corpus JSONL."""
    return write_jsonl((document_record(d) for d in documents), path)
