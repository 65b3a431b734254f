"""Sparse BM25 retrieval on ``bm25s`` (Lù, 2024, arXiv:2407.03618), and the no-pickle corpus storage of all retrievers.

BM25 (Robertson & Zaragoza, 2009) scores a document ``D`` for a query ``Q`` as

    score(D, Q) = sum_{t in Q} IDF(t) * tf(t, D) * (k1 + 1) / (tf(t, D) + k1 * (1 - b + b * |D| / avgdl))

and the ``"lucene"`` variant (the default, as in Kamphuis et al., ECIR 2020) uses ``IDF(t) = log(1 + (N - df + 0.5) /
(df + 0.5))``. bm25s pre-computes every ``(t, D)`` term of the sum into a sparse matrix at index time, so a query is a
sum of a few sparse columns followed by a top-k selection.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from rolecall.data.types import Document
from rolecall.errors import ConfigError, RetrieverError
from rolecall.retrievers.base import Passage, Retriever

__all__ = [
    "BM25",
    "BM25Method",
    "as_documents",
    "write_corpus",
    "read_corpus",
    "write_config",
    "read_config",
    "read_saved",
]

logger = logging.getLogger(__name__)

BM25Method = Literal["lucene", "robertson", "atire", "bm25l", "bm25+"]
"""BM25 variants bm25s implements (Kamphuis et al., ECIR 2020); ``"lucene"`` is the recommended default."""

_METHODS: tuple[str, ...] = get_args(BM25Method)
_CONFIG_NAME = "config.json"
_CORPUS_NAME = "corpus.jsonl"
_BM25S_DIR = "bm25s"
_BM25S_FILES = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy")
_BM25S_JSON = ("vocab.index.json", "params.index.json")
_FORMAT_VERSION = 1
# bm25s's thread pool only pays off for large batches on machines with a few cores (measured: on 2 cores it is ~8%
# slower than sequential for 600 queries over 6k documents).
_THREADED_BATCH = 256
_MIN_CPUS_FOR_THREADS = 4


# ----------------------------------------------------------------------------------------------------------------------
# Corpus and config storage shared by every retriever (JSON / JSONL only, never pickle).
# ----------------------------------------------------------------------------------------------------------------------


def as_documents(corpus: Sequence[Any]) -> list[Document]:
    """Turn a corpus of ``Document``-like objects (anything with ``id``, ``title`` and ``text``) into ``Document``\\ s.

    Raises:
        RetrieverError: if the corpus is empty or an item lacks one of the three attributes.
    """
    docs: list[Document] = []
    for i, item in enumerate(corpus):
        if isinstance(item, Document):
            docs.append(item)
            continue
        try:
            docs.append(Document(id=str(item.id), title=str(item.title or ""), text=str(item.text or "")))
        except AttributeError as err:
            raise RetrieverError(
                f"corpus[{i}] is a {type(item).__name__} without id/title/text attributes; pass "
                "rolecall.data.types.Document objects (or anything with those three attributes)."
            ) from err
    if not docs:
        raise RetrieverError("The corpus is empty: a retriever needs at least one document to index.")
    return docs


def write_corpus(path: Path, docs: Sequence[Document]) -> None:
    """Write ``docs`` as JSONL, one ``{"id", "title", "text"}`` object a line."""
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n")


def read_corpus(path: Path) -> list[Document]:
    """Read a corpus written by :func:`write_corpus`.

    Raises:
        RetrieverError: naming the file (and line) when it is missing or malformed.
    """
    if not path.is_file():
        raise RetrieverError(f"{path} is missing: this directory does not hold a saved retriever corpus.")
    docs: list[Document] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                docs.append(Document(id=str(row["id"]), title=str(row["title"]), text=str(row["text"])))
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise RetrieverError(f"{path}:{line_no} is corrupt ({err}); re-save the retriever.") from err
    if not docs:
        raise RetrieverError(f"{path} holds no documents; re-save the retriever.")
    return docs


def write_config(path: Path, config: dict[str, Any]) -> None:
    """Write a retriever's config as indented JSON."""
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: Path, *, missing: str = "; re-save the retriever.") -> Any:
    """The JSON value in ``path``.

    Raises:
        RetrieverError: naming the file when it is missing (the message ends with ``missing``) or not UTF-8 JSON.
    """
    if not path.is_file():
        raise RetrieverError(f"{path} is missing{missing}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RetrieverError(f"{path} is corrupt ({err}); re-save the retriever.") from err


def read_config(path: Path, retriever: str) -> dict[str, Any]:
    """Read a config written by :func:`write_config` and check it belongs to a ``retriever`` index.

    Raises:
        RetrieverError: naming the file when it is missing, malformed or written by another retriever.
    """
    config = _read_json(path, missing=f": this directory does not hold a saved {retriever} retriever.")
    if not isinstance(config, dict) or config.get("retriever") != retriever:
        found = config.get("retriever") if isinstance(config, dict) else type(config).__name__
        raise RetrieverError(f"{path} describes a {found!r} retriever, not {retriever!r}; load it with that class.")
    return config


def read_saved(path: str | Path, retriever: str) -> tuple[Path, dict[str, Any], list[Document]]:
    """The config file, its config and the corpus of a ``retriever`` index saved in directory ``path``.

    Raises:
        RetrieverError: naming the file when one is missing, malformed or written by another retriever.
    """
    config_file = Path(path) / _CONFIG_NAME
    config = read_config(config_file, retriever)
    return config_file, config, read_corpus(Path(path) / _CORPUS_NAME)


# ----------------------------------------------------------------------------------------------------------------------
# BM25
# ----------------------------------------------------------------------------------------------------------------------


def _import_bm25s() -> Any:
    try:
        import bm25s
    except ImportError as err:
        raise ImportError("BM25 needs the bm25s package: pip install bm25s") from err
    return bm25s


def _resolve_stemmer(stemmer: str | Callable[[list[str]], list[str]] | None) -> Any:
    """A stemmer bm25s accepts: ``None``, a callable on a list of words, or a PyStemmer language name."""
    if stemmer is None or callable(stemmer) or hasattr(stemmer, "stemWords"):
        return stemmer
    try:
        import Stemmer
    except ImportError as err:
        raise ImportError(f"stemmer={stemmer!r} needs PyStemmer: pip install PyStemmer") from err
    return Stemmer.Stemmer(stemmer)


class BM25(Retriever):
    """Sparse BM25 retriever over ``title + text`` of each document, on bm25s's numpy backend.

    Documents that share no term with the query are not returned (as in Lucene), so a query may get fewer than ``k``
    passages; an empty or blank query, or one whose terms are all unknown to the corpus, gets ``[]``.

    Args:
        corpus: the documents (``Document`` or anything with ``id``, ``title`` and ``text``).
        k1: term-frequency saturation; 1.2-2.0 is typical, 1.5 recommended.
        b: document-length normalisation in [0, 1]; 0.75 recommended.
        method: the BM25 variant, one of ``"lucene"`` (recommended), ``"robertson"``, ``"atire"``, ``"bm25l"``,
            ``"bm25+"``.
        stemmer: ``None``, a PyStemmer language name (``"english"``, needs ``pip install PyStemmer``) or a callable
            mapping a list of words to their stems. A callable is not saved: pass it again to :meth:`load`.
        stopwords: a bm25s stopword language (``"en"``), a list of words, or ``None`` to keep every word.
        default_k: number of passages when a call gives no ``k``.

    Raises:
        RetrieverError: if the corpus is empty.
        ConfigError: if ``method``, ``k1``, ``b`` or ``default_k`` is out of range.

    Example:
        >>> from rolecall.data.types import Document
        >>> docs = [Document("a", "Paris", "Capital of France."), Document("b", "Rome", "Rome is in Italy.")]
        >>> BM25(docs)("capital of France", k=1)[0].id
        'a'
    """

    def __init__(
        self,
        corpus: Sequence[Any],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: BM25Method = "lucene",
        stemmer: str | Callable[[list[str]], list[str]] | None = None,
        stopwords: str | list[str] | None = "en",
        default_k: int = 5,
    ) -> None:
        _check_params(k1=k1, b=b, method=method, default_k=default_k)
        self.docs = as_documents(corpus)
        self.k1, self.b, self.method = float(k1), float(b), method
        self.stemmer, self.stopwords, self.default_k = stemmer, stopwords, default_k
        self._stemmer = _resolve_stemmer(stemmer)
        bm25s = _import_bm25s()
        tokens = self._tokenize([f"{d.title} {d.text}" for d in self.docs])
        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b, method=method, backend="numpy")
        self._bm25.index(tokens, show_progress=False)
        logger.info("Indexed %d documents with BM25 (%s, vocab %d)", len(self.docs), method, len(self._bm25.vocab_dict))

    def __len__(self) -> int:
        return len(self.docs)

    def __repr__(self) -> str:
        return f"BM25(n_docs={len(self.docs)}, method={self.method!r}, k1={self.k1}, b={self.b})"

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        bm25s = _import_bm25s()
        return bm25s.tokenize(
            texts, stopwords=self.stopwords, stemmer=self._stemmer, return_ids=False, show_progress=False
        )

    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        """Top-``k`` passages for each query, best first, with their BM25 scores.

        ``k`` is clamped to the corpus size. All non-empty queries go through one bm25s ``retrieve`` call.

        Raises:
            ValueError: if ``k`` is smaller than 1.
        """
        k = self._resolve_k(k, len(self.docs))
        results: list[list[Passage]] = [[] for _ in queries]
        tokens = self._tokenize([q if isinstance(q, str) else "" for q in queries])
        vocab = self._bm25.vocab_dict
        live = [i for i, toks in enumerate(tokens) if any(t and t in vocab for t in toks)]
        if not live:
            return results
        cpus = os.cpu_count() or 1
        n_threads = min(8, cpus) if len(live) >= _THREADED_BATCH and cpus >= _MIN_CPUS_FOR_THREADS else 0
        indices, scores = self._bm25.retrieve(
            [tokens[i] for i in live],
            k=k,
            show_progress=False,
            n_threads=n_threads,
            backend_selection="numpy",
        )  # (Q, k), (Q, k)
        drop_zero = self._bm25.nonoccurrence_array is None  # bm25l / bm25+ give every document a positive score
        for row, qi in enumerate(live):
            results[qi] = [
                Passage.of(self.docs[int(idx)], float(score))
                for idx, score in zip(indices[row], scores[row], strict=True)
                if not (drop_zero and score == 0.0)
            ]
        return results

    def save(self, path: str | Path) -> None:
        """Write ``config.json``, ``corpus.jsonl`` and the bm25s arrays (``.npy``/``.json``, no pickle) to ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        stemmer = self.stemmer if isinstance(self.stemmer, str) or self.stemmer is None else None
        if stemmer is None and self.stemmer is not None:
            logger.warning(
                "The custom stemmer %r is not saved; pass it again to BM25.load(..., stemmer=...).", self.stemmer
            )
        config = {
            "retriever": "bm25",
            "format_version": _FORMAT_VERSION,
            "k1": self.k1,
            "b": self.b,
            "method": self.method,
            "stemmer": stemmer,
            "custom_stemmer": self.stemmer is not None and stemmer is None,
            "stopwords": self.stopwords,
            "default_k": self.default_k,
            "n_docs": len(self.docs),
        }
        write_corpus(path / _CORPUS_NAME, self.docs)
        self._bm25.save(path / _BM25S_DIR, show_progress=False, allow_pickle=False)
        write_config(path / _CONFIG_NAME, config)

    @classmethod
    def load(cls, path: str | Path, *, stemmer: Callable[[list[str]], list[str]] | None = None) -> BM25:
        """Read a BM25 index written by :meth:`save` without re-indexing.

        Args:
            path: the directory given to :meth:`save`.
            stemmer: the custom stemmer callable the index was built with, if any (names are restored on their own).

        Raises:
            RetrieverError: naming the file when one is missing, corrupt or inconsistent with the corpus.
        """
        path = Path(path)
        config = read_config(path / _CONFIG_NAME, "bm25")
        if config.get("custom_stemmer") and stemmer is None:
            raise RetrieverError(
                f"{path} was built with a custom stemmer; pass it again: BM25.load(path, stemmer=...)."
            )
        docs = read_corpus(path / _CORPUS_NAME)
        index_dir = path / _BM25S_DIR
        _check_bm25s_files(index_dir, n_docs=len(docs))
        bm25s = _import_bm25s()
        try:
            inner = bm25s.BM25.load(index_dir, load_corpus=False, mmap=False, allow_pickle=False, show_progress=False)
        except (OSError, ValueError, KeyError) as err:
            raise RetrieverError(f"{index_dir} holds a corrupt bm25s index ({err}); re-save the retriever.") from err
        self = cls.__new__(cls)
        try:
            self.docs = docs
            self.k1, self.b, self.method = float(config["k1"]), float(config["b"]), config["method"]
            self.stemmer = stemmer if stemmer is not None else config["stemmer"]
            self.stopwords, self.default_k = config["stopwords"], int(config["default_k"])
        except (KeyError, TypeError, ValueError) as err:
            raise RetrieverError(f"{path / _CONFIG_NAME} lacks a valid field ({err}); re-save the retriever.") from err
        self._stemmer = _resolve_stemmer(self.stemmer)
        self._bm25 = inner
        return self


def _check_params(*, k1: float, b: float, method: str, default_k: int) -> None:
    if method not in _METHODS:
        raise ConfigError(f"method={method!r} is not a BM25 variant; choose one of {', '.join(map(repr, _METHODS))}.")
    if k1 < 0:
        raise ConfigError(f"k1 must be >= 0 (1.2-2.0 is typical), got {k1}.")
    if not 0.0 <= b <= 1.0:
        raise ConfigError(f"b must lie in [0, 1] (0.75 is typical), got {b}.")
    if default_k < 1:
        raise ConfigError(f"default_k must be >= 1, got {default_k}.")


def _check_bm25s_files(index_dir: Path, *, n_docs: int) -> None:
    """Open every bm25s file once (cheaply: arrays memory-mapped) so a broken one is reported by name."""
    for name in _BM25S_FILES:
        file = index_dir / name
        if not file.is_file():
            raise RetrieverError(f"{file} is missing; re-save the retriever.")
        try:
            np.load(file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise RetrieverError(f"{file} is corrupt ({err}); re-save the retriever.") from err
    for name in _BM25S_JSON:
        file = index_dir / name
        content = _read_json(file)
        if name == "params.index.json" and content.get("num_docs") != n_docs:
            raise RetrieverError(
                f"{file} indexes {content.get('num_docs')} documents but the saved corpus has {n_docs}; re-save."
            )
