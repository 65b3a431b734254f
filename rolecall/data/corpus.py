"""Closed corpora built from dataset files, and the registry that maps dataset names to loaders.

A closed corpus (IRCoT, STRIDE) is the union of every context paragraph in a dataset file, de-duplicated by
(title, text) and keyed by :func:`~rolecall.data.types.doc_id`, so every gold ``supporting_ids`` of the examples loaded
from the same file is in it. ``level="sentence"`` (as OPERA retrieves) splits each paragraph into sentences with ids
``f"{paragraph_id}#s{i}"``, ``i`` being the dataset's sentence index where it ships sentences (HotpotQA, 2Wiki), so the
``supporting_sentence_ids`` in those examples' metadata are in it too.

Example:
    >>> from rolecall.data.corpus import build_corpus, load_dataset
    >>> path = "../shared/data/musique/musique_ans_dev_55.jsonl"
    >>> examples = load_dataset("musique", path)  # doctest: +SKIP
    >>> corpus = build_corpus("musique", path)  # doctest: +SKIP
    >>> ids = {d.id for d in corpus}  # doctest: +SKIP
    >>> all(i in ids for ex in examples for i in ex.supporting_ids)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rolecall.data import flashrag, hotpotqa, musique, twowiki
from rolecall.data.io import Paragraph, field, iter_records, write_jsonl
from rolecall.data.types import Document, Example
from rolecall.errors import ConfigError, DataFormatError

__all__ = [
    "DATASETS",
    "DEV_SUBSET_FILES",
    "dev_subset_path",
    "DatasetFormat",
    "load_dataset",
    "detect_format",
    "build_corpus",
    "documents_from_paragraphs",
    "paragraph_id_of",
    "corpus_by_id",
    "save_corpus_jsonl",
    "load_corpus_jsonl",
]

logger = logging.getLogger(__name__)

#: The real dev subsets (``data/README.md`` of the shared folder), by dataset name, relative to that folder.
DEV_SUBSET_FILES: dict[str, str] = {
    "hotpotqa": "hotpotqa/hotpot_dev_distractor_600.jsonl",
    "2wiki": "2wikimultihopqa/2wiki_dev_243.json",
    "musique": "musique/musique_ans_dev_55.jsonl",
}


def dev_subset_path(name: str, root: str | Path = "../shared/data") -> Path:
    """Where dataset ``name``'s dev subset lies under ``root`` (default: the shared folder beside a checkout, relative
    to the working directory). Raises ConfigError for a name without a dev subset."""
    if name not in DEV_SUBSET_FILES:
        raise ConfigError(f"no dev subset named {name!r}; known: {sorted(DEV_SUBSET_FILES)}")
    return Path(root) / DEV_SUBSET_FILES[name]


Level = Literal["paragraph", "sentence"]


@dataclass(frozen=True)
class DatasetFormat:
    """How to read one dataset format: its example loader and its paragraph iterator."""

    load: Callable[..., list[Example]]
    iter_paragraphs: Callable[[str | Path], Iterator[Paragraph]]


DATASETS: dict[str, DatasetFormat] = {
    "hotpotqa": DatasetFormat(hotpotqa.load_hotpotqa, hotpotqa.iter_paragraphs),
    "2wikimultihopqa": DatasetFormat(twowiki.load_twowiki, twowiki.iter_paragraphs),
    "musique": DatasetFormat(musique.load_musique, musique.iter_paragraphs),
    "flashrag": DatasetFormat(flashrag.load_flashrag, flashrag.iter_paragraphs),
}
"""Canonical dataset names (the ``Example.dataset`` they produce) to their format."""

_ALIASES = {"hotpot": "hotpotqa", "hotpot_qa": "hotpotqa", "2wiki": "2wikimultihopqa", "twowiki": "2wikimultihopqa"}


def _canonical(name: str) -> str | None:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in DATASETS else None


def _choices() -> str:
    return ", ".join(sorted([*DATASETS, *_ALIASES]))


def detect_format(path: str | Path) -> str:
    """The canonical dataset name of a file, read from its first record's keys.

    ``golden_answers`` or ``contents`` → ``flashrag``; ``paragraphs`` → ``musique``; ``evidences`` →
    ``2wikimultihopqa``; ``context`` → ``hotpotqa``.

    Raises:
        DataFormatError: the file is empty or its first record matches none of these layouts.
    """
    for where, record in iter_records(path):
        if "golden_answers" in record or "contents" in record:
            return "flashrag"
        if "paragraphs" in record:
            return "musique"
        if "evidences" in record:
            return "2wikimultihopqa"
        if "context" in record:
            return "hotpotqa"
        raise where.error(
            f"cannot tell the dataset format from keys {sorted(record)}; pass the dataset name ({_choices()})"
        )
    raise DataFormatError("the file holds no records", path=str(path))


def load_dataset(name_or_path: str | Path, path: str | Path | None = None, **kwargs: Any) -> list[Example]:
    """Load examples by dataset name and path, or from a path alone (the format is then detected).

    Args:
        name_or_path: a dataset name (``hotpotqa``, ``2wiki``/``twowiki``/``2wikimultihopqa``, ``musique``,
            ``flashrag``) followed by ``path``, or the path itself.
        path: the file, when ``name_or_path`` is a name.
        **kwargs: passed to the loader (``limit``; ``answerable_only`` for MuSiQue).

    Returns:
        The examples.

    Raises:
        ConfigError: a name without a path, or a path with an unknown name.
        DataFormatError: the file is malformed or its format cannot be detected.

    Example:
        >>> path = "../shared/data/hotpotqa/hotpot_dev_distractor_600.jsonl"
        >>> examples = load_dataset("hotpotqa", path)  # doctest: +SKIP
        >>> examples = load_dataset("../shared/data/musique/musique_ans_dev_55.jsonl", limit=5)  # doctest: +SKIP
    """
    if path is None:
        name = _canonical(str(name_or_path))
        if name is not None and not Path(name_or_path).is_file():
            raise ConfigError(
                f"load_dataset({name_or_path!r}) needs a file: rolecall does not download datasets. "
                f"Call load_dataset({name_or_path!r}, path) with the dataset's JSON/JSONL file."
            )
        path = name_or_path
        name = detect_format(path)
    else:
        name = _canonical(str(name_or_path))
        if name is None:
            raise ConfigError(f"unknown dataset {str(name_or_path)!r}; choose one of: {_choices()}")
    return DATASETS[name].load(path, **kwargs)


def documents_from_paragraphs(paragraphs: Iterable[Paragraph], *, level: Level = "paragraph") -> list[Document]:
    """De-duplicate paragraphs by (title, text) in first-seen order and turn them into documents.

    Args:
        paragraphs: paragraphs from any source (see each loader module's ``iter_paragraphs``).
        level: ``"paragraph"``: one document per paragraph, id ``doc_id(title, text)``; ``"sentence"``: one document
            per non-empty sentence, id ``f"{paragraph_id}#s{i}"``, title kept.

    Returns:
        The documents.

    Raises:
        ConfigError: ``level`` is not one of the two options.
        DataFormatError: two different paragraphs got the same id (an 8-hex-digit hash collision under one title).
    """
    if level not in ("paragraph", "sentence"):
        raise ConfigError(f"level must be 'paragraph' or 'sentence', got {level!r}")
    seen: dict[str, Paragraph] = {}
    for p in paragraphs:
        other = seen.setdefault(p.id, p)
        if (other.title, other.text) != (p.title, p.text):
            raise DataFormatError(f"doc_id collision: {p.id!r} names two different paragraphs of {p.title!r}")
    if level == "paragraph":
        return [Document(id=pid, title=p.title, text=p.text) for pid, p in seen.items()]
    return [
        Document(id=p.sentence_id(i), title=p.title, text=s.strip())
        for p in seen.values()
        for i, s in enumerate(p.sentences)
        if s.strip()
    ]


def build_corpus(
    dataset: str, path: str | Path | Iterable[str | Path], *, level: Level = "paragraph"
) -> list[Document]:
    """The closed corpus of one or more dataset files: the union of their paragraphs, de-duplicated.

    Args:
        dataset: a dataset name (see :func:`load_dataset`), or ``"auto"`` to detect each file's format.
        path: one file or several (e.g. train and dev, to retrieve over both).
        level: ``"paragraph"`` or ``"sentence"`` (see :func:`documents_from_paragraphs`).

    Returns:
        The documents, in first-seen order.

    Raises:
        ConfigError: an unknown dataset name or level.
        DataFormatError: a file is malformed.
    """
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    fixed = None if dataset == "auto" else _canonical(dataset)
    if dataset != "auto" and fixed is None:
        raise ConfigError(f"unknown dataset {dataset!r}; choose 'auto' or one of: {_choices()}")

    def paragraphs() -> Iterator[Paragraph]:
        for p in paths:
            yield from DATASETS[fixed or detect_format(p)].iter_paragraphs(p)

    docs = documents_from_paragraphs(paragraphs(), level=level)
    logger.info("built a %s-level corpus of %d documents from %s", level, len(docs), [str(p) for p in paths])
    return docs


def paragraph_id_of(document_id: str) -> str:
    """The paragraph id of a sentence id (``"T::abcd1234#s3"`` → ``"T::abcd1234"``); other ids are returned as is.

    Example:
        >>> paragraph_id_of("Paris::0123abcd#s2"), paragraph_id_of("Paris::0123abcd")
        ('Paris::0123abcd', 'Paris::0123abcd')
    """
    head, sep, tail = document_id.rpartition("#s")
    return head if sep and tail.isdigit() else document_id


def corpus_by_id(docs: Iterable[Document]) -> dict[str, Document]:
    """``{doc.id: doc}``.

    Raises:
        ValueError: two different documents share an id.
    """
    out: dict[str, Document] = {}
    for d in docs:
        if out.setdefault(d.id, d) != d:
            raise ValueError(f"two different documents share the id {d.id!r}")
    return out


def save_corpus_jsonl(docs: Iterable[Document], path: str | Path) -> int:
    """Write documents as ``{id, title, text}`` JSONL (see :func:`rolecall.data.flashrag.write_flashrag_corpus` for
    FlashRAG's ``{id, contents}``).

    Returns:
        The number of documents written.
    """
    return write_jsonl(({"id": d.id, "title": d.title, "text": d.text} for d in docs), path)


def load_corpus_jsonl(path: str | Path) -> list[Document]:
    """Read documents written by :func:`save_corpus_jsonl`.

    Raises:
        DataFormatError: a record lacks ``id``, ``title`` or ``text``, or has the wrong types; the message names the
            line.
    """
    return [
        Document(id=field(r, "id", str, w), title=field(r, "title", str, w), text=field(r, "text", str, w))
        for w, r in iter_records(path)
    ]
