"""Reading and writing dataset files (JSON lists and JSONL) with errors that name the file and the line.

Every loader reads its records through :func:`iter_records`, which accepts both containers and reports where each record
came from as a :class:`Where`. Field access goes through :func:`field`, so a missing key or a value of the wrong type
raises :class:`~rolecall.errors.DataFormatError` naming the file, the line (JSONL, 1-based) or the record index (JSON
list, 0-based, written ``record N``), the key and the value received.

The :class:`Paragraph` type is the unit the loaders read from a dataset's contexts; :mod:`rolecall.data.corpus` turns
paragraphs into :class:`~rolecall.data.types.Document`\\ s. Its text rule (:meth:`Paragraph.from_sentences`) is the only
place where sentences become paragraph text, so the gold ids of examples and the ids of a built corpus always agree.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from rolecall.data.types import doc_id
from rolecall.errors import DataFormatError

__all__ = [
    "Where",
    "Paragraph",
    "iter_records",
    "field",
    "string_list",
    "gold_answer",
    "gold_answer_list",
    "check_limit",
    "write_jsonl",
    "split_sentences",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A sentence ends at ., ! or ? (optionally followed by a closing quote or bracket) followed by whitespace and an
# upper-case letter, a digit or an opening quote. Deliberately simple: it only serves level="sentence" corpora of
# datasets that ship whole paragraphs (MuSiQue, FlashRAG corpora).
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"')\]]?)\s+(?=[A-Z0-9\"'(])")


@dataclass(frozen=True)
class Where:
    """Where a record came from: its file and either its 1-based line (JSONL) or its 0-based list index (JSON)."""

    path: str
    line: int | None = None
    index: int | None = None

    def __str__(self) -> str:
        return f"{self.path} record {self.index}" if self.index is not None else f"{self.path}:{self.line}"

    def error(self, message: str) -> DataFormatError:
        """A :class:`DataFormatError` for this record, naming the file and the line or ``record N``."""
        if self.index is not None:
            return DataFormatError(f"record {self.index}: {message}", path=self.path)
        return DataFormatError(message, path=self.path, line=self.line)


class Paragraph(NamedTuple):
    """One titled paragraph of a dataset's context, with its sentences when the dataset ships them split."""

    title: str
    text: str
    sentences: tuple[str, ...]

    @property
    def id(self) -> str:
        """The paragraph's :func:`~rolecall.data.types.doc_id`."""
        return doc_id(self.title, self.text)

    def sentence_id(self, i: int) -> str:
        """Id of the paragraph's ``i``-th sentence in a ``level="sentence"`` corpus: ``f"{paragraph_id}#s{i}"``."""
        return f"{self.id}#s{i}"

    @classmethod
    def from_sentences(cls, title: str, sentences: Iterable[str]) -> Paragraph:
        """A paragraph whose text is its stripped, non-empty sentences joined with one space.

        HotpotQA sentences carry their own leading space (most of the time) and 2WikiMultihopQA sentences do not;
        stripping then joining with ``" "`` gives the same text for both. Empty sentences are kept in
        :attr:`sentences` (so sentence indices match the dataset's ``sent_id``) but add nothing to the text.

        Example:
            >>> Paragraph.from_sentences("A", ["One.", " Two.", ""]).text
            'One. Two.'
        """
        sentences = tuple(sentences)
        return cls(title, " ".join(s.strip() for s in sentences if s.strip()), sentences)

    @classmethod
    def from_text(cls, title: str, text: str) -> Paragraph:
        """A paragraph that ships as one text; its sentences come from :func:`split_sentences`."""
        return cls(title, text, tuple(split_sentences(text)))


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences with a small regular expression (no model, no download).

    Naive equivalent: ``re.split(r"(?<=[.!?])\\s+(?=[A-Z])", text)``; unlike it, a closing quote or bracket stays
    with the sentence it closes, and a sentence may also start with a digit or an opening quote.

    Example:
        >>> split_sentences("It rains. The sky is grey! Is it 3 p.m. now?")
        ['It rains.', 'The sky is grey!', 'Is it 3 p.m. now?']
    """
    parts: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        end = match.start() + len(match.group(1))  # a closing quote or bracket stays with its sentence
        parts.append(text[start:end].strip())
        start = match.end()
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _detect_container(path: Path) -> str:
    with path.open("r", encoding="utf-8-sig") as f:
        while True:
            ch = f.read(1)
            if ch == "" or not ch.isspace():
                break
    if ch == "[":
        return "json"
    if ch == "{":
        return "jsonl"
    raise DataFormatError(
        f"expected a JSON list (starting with '[') or JSONL (one object per line, starting with '{{'), "
        f"found {ch!r} as the first character",
        path=str(path),
    )


def iter_records(path: str | Path) -> Iterator[tuple[Where, dict[str, Any]]]:
    """Yield ``(where, record)`` for every object in a JSON-list or JSONL file.

    The container is detected from the first non-blank character (``[`` for a JSON list, ``{`` for JSONL). Blank
    JSONL lines are skipped.

    Args:
        path: the file to read.

    Returns:
        An iterator of ``(Where, dict)`` pairs, in file order.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: a line is not valid JSON or a record is not a JSON object; the message names the file and
            the line (JSONL) or ``record N`` (JSON list).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    name = str(path)
    if _detect_container(path) == "json":
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as e:
            raise DataFormatError(f"invalid JSON: {e.msg} (column {e.colno})", path=name, line=e.lineno) from e
        if not isinstance(data, list):
            raise DataFormatError(f"expected a JSON list of records, got {type(data).__name__}", path=name)
        for i, record in enumerate(data):
            where = Where(name, index=i)
            if not isinstance(record, dict):
                raise where.error(f"expected a JSON object, got {type(record).__name__}")
            yield where, record
        return
    with path.open("r", encoding="utf-8-sig") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = Where(name, line=lineno)
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as e:
                raise where.error(f"invalid JSON: {e.msg} (column {e.colno})") from e
            if not isinstance(record, dict):
                raise where.error(f"expected a JSON object, got {type(record).__name__}")
            yield where, record


_MISSING = object()


def field(
    record: dict[str, Any], key: str, kind: type[T] | tuple[type, ...], where: Where, *, default: Any = _MISSING
) -> T:
    """``record[key]``, checked to be an instance of ``kind``; a missing key returns ``default`` when one is given.

    Raises:
        DataFormatError: the key is missing (and no default was given) or the value has the wrong type.
    """
    if key not in record or record[key] is None:
        if default is not _MISSING:
            return default
        if key in record:
            raise where.error(f"required key {key!r} is null")
        raise where.error(f"missing required key {key!r} (keys present: {sorted(record)})")
    value = record[key]
    # bool is a subclass of int; a JSON true where a number is expected is still a format error.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise where.error(f"key {key!r} should be {names}, got {type(value).__name__}: {_short(value)}")
    return value


def string_list(value: Any, key: str, where: Where) -> list[str]:
    """``value`` checked to be a list of strings (used for sentence lists, answer aliases and title lists)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise where.error(f"key {key!r} should be a list of strings, got {_short(value)}")
    return value


def gold_answer(record: dict[str, Any], key: str, where: Where) -> str:
    """``record[key]``, the gold answer: a non-empty string (an example without one cannot be scored).

    Raises:
        DataFormatError: the key is missing, null, not a string or blank; the message names the file and the line.
    """
    answer = field(record, key, str, where)
    if not answer.strip():
        raise where.error(f"key {key!r} is blank; every example needs a gold answer to be scored against")
    return answer


def gold_answer_list(record: dict[str, Any], key: str, where: Where) -> list[str]:
    """``record[key]``, the gold answers: a non-empty list of non-empty strings.

    Raises:
        DataFormatError: the key is missing, not a list of strings, empty or holds a blank answer.
    """
    answers = string_list(field(record, key, list, where), key, where)
    if not answers or not all(a.strip() for a in answers):
        raise where.error(f"key {key!r} should be a non-empty list of non-blank answers, got {_short(answers)}")
    return list(answers)


def check_limit(limit: int | None) -> None:
    """Raise ``ValueError`` unless ``limit`` is None or a non-negative int."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be None or a non-negative int, got {limit!r}")


def write_jsonl(records: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write records as UTF-8 JSONL (one object per line, non-ASCII kept), creating parent folders.

    Returns:
        The number of records written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    logger.debug("wrote %d records to %s", n, path)
    return n


def _short(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def load_examples(
    path: str | Path, parse: Callable[[dict[str, Any], Where], Any], *, limit: int | None, name: str
) -> list[Any]:
    """Parse every record of a dataset file with ``parse(record, where)``, stopping after ``limit`` examples.

    The loop every loader shares; ``name`` is the dataset's display name for the log line.
    """
    check_limit(limit)
    examples: list[Any] = []
    for where, record in iter_records(path):
        if limit is not None and len(examples) >= limit:
            break
        examples.append(parse(record, where))
    logger.info("loaded %d %s examples from %s", len(examples), name, path)
    return examples
