"""Dense retrieval: a sentence-transformers encoder and a FAISS inner-product index (CPU, or GPU when FAISS has one).

Documents and queries are embedded by the same encoder ``E`` (Karpukhin et al., 2020, DPR); with ``normalize=True`` the
vectors are L2-normalised, so the inner product is the cosine similarity

    score(D, Q) = <E(Q), E(D)> / (||E(Q)|| * ||E(D)||)

and the index returns the top-k documents by that score: exactly (``IndexFlatIP``), or approximately with HNSW (Malkov &
Yashunin, 2018) or an inverted file of k-means lists (``IndexIVFFlat``, Jégou et al., 2011).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from rolecall.errors import ConfigError, RetrieverError
from rolecall.retrievers.base import Passage, Retriever
from rolecall.retrievers.bm25 import as_documents, read_saved, write_config, write_corpus

__all__ = ["DenseRetriever", "IndexKind"]

logger = logging.getLogger(__name__)

IndexKind = Literal["auto", "flat", "hnsw", "ivf"]
"""``"flat"``: exact ``IndexFlatIP``; ``"hnsw"``: ``IndexHNSWFlat``; ``"ivf"``: trained ``IndexIVFFlat``;
``"auto"``: flat below ``exact_threshold`` documents, HNSW above."""

# Same value as rolecall.lm.embedded.DEFAULT_EMBEDDER, repeated so importing this module does not import rolecall.lm.
_DEFAULT_ENCODER = "embedded:all-minilm-l6-v2"
_INDEX_KINDS: tuple[str, ...] = get_args(IndexKind)
_CONFIG_NAME = "config.json"
_CORPUS_NAME = "corpus.jsonl"
_INDEX_NAME = "index.faiss"
_FORMAT_VERSION = 1
_HNSW_M = 32  # graph degree: FAISS's usual choice for ~100-1k dimensional vectors
_HNSW_EF_CONSTRUCTION = 80
_HNSW_EF_SEARCH = 64  # raised to k when k is larger
_IVF_POINTS_PER_LIST = 39  # FAISS's k-means wants at least 39 training points per centroid


def _import_faiss() -> Any:
    try:
        import faiss
    except ImportError as err:
        raise ImportError("DenseRetriever needs FAISS: pip install faiss-cpu (or faiss-gpu-cu12 on a GPU)") from err
    return faiss


def _load_encoder(name: str, device: str | None) -> Any:
    from rolecall.lm.embedded import resolve_embedder_path

    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as err:
        raise ImportError("DenseRetriever needs sentence-transformers: pip install sentence-transformers") from err
    return SentenceTransformer(resolve_embedder_path(name), device=device)


def _is_sentence_transformer(encoder: Any) -> bool:
    return type(encoder).__module__.startswith("sentence_transformers")


def document_text(title: str, text: str) -> str:
    """The string a document is embedded as: ``"title: text"`` (just ``text`` when there is no title)."""
    return f"{title}: {text}" if title else text


class DenseRetriever(Retriever):
    """Embedding retriever: a sentence encoder plus a FAISS inner-product index over ``title: text`` of each document.

    Args:
        corpus: the documents (``Document`` or anything with ``id``, ``title`` and ``text``).
        encoder: a sentence-transformers model name or path (``"embedded:all-minilm-l6-v2"``, the embedded MiniLM, is
            the default), an already built ``SentenceTransformer``, or any object whose ``encode(list[str])`` returns
            an ``(n, d)`` array (a test double, say).
        index: ``"auto"`` (exact below ``exact_threshold`` documents, HNSW above), ``"flat"``, ``"hnsw"`` or ``"ivf"``
            (about sqrt(N) k-means lists).
        exact_threshold: corpus size from which ``index="auto"`` switches from exact search to HNSW.
        device: torch device of the encoder (``None`` lets sentence-transformers choose). FAISS moves a flat or IVF
            index to every GPU it sees unless ``device`` names a non-CUDA device.
        batch_size: encoder batch size.
        normalize: L2-normalise embeddings so the inner product is the cosine similarity (recommended).
        show_progress: show a tqdm bar while encoding the corpus.
        default_k: number of passages when a call gives no ``k``.

    Raises:
        RetrieverError: if the corpus is empty or the encoder returns vectors of the wrong shape.
        ConfigError: if ``index`` is not one of the choices or a size is out of range.
    """

    def __init__(
        self,
        corpus: Sequence[Any],
        *,
        encoder: str | Any = _DEFAULT_ENCODER,
        index: IndexKind = "auto",
        exact_threshold: int = 20000,
        device: str | None = None,
        batch_size: int = 64,
        normalize: bool = True,
        show_progress: bool = False,
        default_k: int = 5,
    ) -> None:
        _check_params(index=index, exact_threshold=exact_threshold, batch_size=batch_size, default_k=default_k)
        self.docs = as_documents(corpus)
        self.index_kind: str = index
        self.exact_threshold, self.device, self.batch_size = exact_threshold, device, batch_size
        self.normalize, self.show_progress, self.default_k = normalize, show_progress, default_k
        self.encoder_name: str | None = str(encoder) if isinstance(encoder, (str, Path)) else None
        self.encoder = _load_encoder(str(encoder), device) if self.encoder_name is not None else encoder
        if not hasattr(self.encoder, "encode"):
            raise ConfigError(
                f"encoder={type(encoder).__name__} has no encode(); pass a model name, a SentenceTransformer or an "
                "object whose encode(list[str]) returns an (n, d) array."
            )
        vectors = self._encode([document_text(d.title, d.text) for d in self.docs], self.show_progress)  # (N, d)
        self.dim = int(vectors.shape[1])
        self.resolved_index = self._resolve_kind(len(self.docs))
        self._index = self._build_index(vectors)
        self._on_gpu = False
        self._index = self._place_index(self._index)
        logger.info("Indexed %d documents densely (%s, d=%d)", len(self.docs), self.resolved_index, self.dim)

    def __len__(self) -> int:
        return len(self.docs)

    def __repr__(self) -> str:
        encoder = self.encoder_name or type(self.encoder).__name__
        return f"DenseRetriever(n_docs={len(self.docs)}, encoder={encoder!r}, index={self.resolved_index!r})"

    # -- encoding --------------------------------------------------------------------------------------------------

    def _encode(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        """Embed ``texts`` as a C-contiguous float32 ``(n, d)`` array, L2-normalised when ``normalize``."""
        if _is_sentence_transformer(self.encoder):
            vectors = self.encoder.encode(
                texts,
                batch_size=self.batch_size,
                show_progress_bar=show_progress,
                convert_to_numpy=True,
                normalize_embeddings=False,
            )
        else:
            chunks = range(0, len(texts), self.batch_size)
            if show_progress:
                from tqdm.auto import tqdm

                chunks = tqdm(chunks, desc="Encoding", unit="batch")
            parts = [np.asarray(self.encoder.encode(texts[i : i + self.batch_size])) for i in chunks]
            vectors = np.concatenate(parts, axis=0) if parts else np.zeros((0, 0))
        vectors = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise RetrieverError(
                f"The encoder returned an array of shape {vectors.shape} for {len(texts)} texts; it must return "
                "(n_texts, dim)."
            )
        if self.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (n, 1)
            vectors /= np.maximum(norms, 1e-12)
        return vectors

    # -- the FAISS index --------------------------------------------------------------------------------------------

    def _resolve_kind(self, n_docs: int) -> str:
        if self.index_kind == "auto":
            return "flat" if n_docs < self.exact_threshold else "hnsw"
        return self.index_kind

    def _build_index(self, vectors: np.ndarray) -> Any:
        faiss = _import_faiss()
        n, d = vectors.shape
        if self.resolved_index == "flat":
            index = faiss.IndexFlatIP(d)
        elif self.resolved_index == "hnsw":
            index = faiss.IndexHNSWFlat(d, _HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = _HNSW_EF_CONSTRUCTION
            index.hnsw.efSearch = _HNSW_EF_SEARCH
        else:
            # about sqrt(N) lists, but never fewer than 39 training points per list (k-means would warn and degrade)
            nlist = max(1, min(round(math.sqrt(n)), n // _IVF_POINTS_PER_LIST))
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(vectors)
            index.nprobe = min(nlist, max(8, nlist // 8))
            self._quantizer = quantizer  # the IVF index holds a raw pointer to it; keep it alive
        index.add(vectors)
        return index

    def _place_index(self, index: Any) -> Any:
        """Move a flat or IVF index to all GPUs when the FAISS build has GPU support and GPUs are visible."""
        if self.device is not None and not str(self.device).startswith("cuda"):
            return index
        faiss = _import_faiss()
        num_gpus = getattr(faiss, "get_num_gpus", lambda: 0)()
        if num_gpus == 0 or not hasattr(faiss, "index_cpu_to_all_gpus"):
            return index
        if self.resolved_index == "hnsw":
            logger.info("FAISS-GPU has no HNSW index; keeping the HNSW index on the CPU.")
            return index
        logger.info("Moving the %s index to %d GPU(s)", self.resolved_index, num_gpus)
        gpu_index = faiss.index_cpu_to_all_gpus(index)
        self._on_gpu = True
        return gpu_index

    def _cpu_index(self) -> Any:
        return _import_faiss().index_gpu_to_cpu(self._index) if self._on_gpu else self._index

    # -- retrieval ---------------------------------------------------------------------------------------------------

    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        """Top-``k`` passages for each query, best first, scored by inner product (cosine when ``normalize``).

        ``k`` is clamped to the corpus size; empty or blank queries get ``[]``. All non-empty queries are encoded and
        searched as one batch.

        Raises:
            ValueError: if ``k`` is smaller than 1.
        """
        return self._retrieve_live(queries, k, len(self.docs), self._search)

    def _search(self, texts: list[str], k: int) -> list[list[Passage]]:
        """The top-``k`` passages of each non-empty query, encoded and searched as one batch."""
        vectors = self._encode(texts)  # (Q, d)
        if self.resolved_index == "hnsw" and not self._on_gpu:
            self._index.hnsw.efSearch = max(_HNSW_EF_SEARCH, k)
        scores, indices = self._index.search(vectors, k)  # (Q, k), (Q, k); -1 marks a missing hit
        return [
            [Passage.of(self.docs[int(idx)], float(score)) for idx, score in zip(ids, row, strict=True) if idx >= 0]
            for ids, row in zip(indices, scores, strict=True)
        ]

    # -- persistence ------------------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write ``config.json``, ``corpus.jsonl`` and ``index.faiss`` (``faiss.write_index``, no pickle) to ``path``.

        The encoder itself is not saved, only its name; an index built from an encoder object needs that object again
        at :meth:`load`.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.encoder_name is None:
            logger.warning("The encoder object is not saved; pass it again to DenseRetriever.load(..., encoder=...).")
        config = {
            "retriever": "dense",
            "format_version": _FORMAT_VERSION,
            "encoder": self.encoder_name,
            "index": self.index_kind,
            "resolved_index": self.resolved_index,
            "exact_threshold": self.exact_threshold,
            "batch_size": self.batch_size,
            "normalize": self.normalize,
            "default_k": self.default_k,
            "dim": self.dim,
            "n_docs": len(self.docs),
        }
        write_corpus(path / _CORPUS_NAME, self.docs)
        _import_faiss().write_index(self._cpu_index(), str(path / _INDEX_NAME))
        write_config(path / _CONFIG_NAME, config)

    @classmethod
    def load(cls, path: str | Path, encoder: Any | None = None, *, device: str | None = None) -> DenseRetriever:
        """Read a dense index written by :meth:`save` without re-encoding the corpus.

        Args:
            path: the directory given to :meth:`save`.
            encoder: the encoder to embed queries with; by default it is re-created from the saved encoder name.
            device: torch device for a re-created encoder, and whether FAISS may use the GPU (see the class).

        Raises:
            RetrieverError: naming the file when one is missing, corrupt or inconsistent with the others.
        """
        path = Path(path)
        config_file, config, docs = read_saved(path, "dense")
        index_file = path / _INDEX_NAME
        if not index_file.is_file():
            raise RetrieverError(f"{index_file} is missing; re-save the retriever.")
        try:
            index = _import_faiss().read_index(str(index_file))
        except RuntimeError as err:
            raise RetrieverError(f"{index_file} is corrupt ({str(err).strip().splitlines()[0]}); re-save.") from err
        self = cls.__new__(cls)
        try:
            self.encoder_name = config["encoder"]
            self.index_kind, self.resolved_index = config["index"], config["resolved_index"]
            self.exact_threshold, self.batch_size = int(config["exact_threshold"]), int(config["batch_size"])
            self.normalize, self.default_k, self.dim = (
                bool(config["normalize"]),
                int(config["default_k"]),
                config["dim"],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise RetrieverError(f"{config_file} lacks a valid field ({err}); re-save the retriever.") from err
        if index.ntotal != len(docs) or index.d != self.dim:
            raise RetrieverError(
                f"{index_file} holds {index.ntotal} vectors of dimension {index.d}, but {path / _CORPUS_NAME} has "
                f"{len(docs)} documents and {config_file} says dimension {self.dim}; re-save the retriever."
            )
        if encoder is None and self.encoder_name is None:
            raise RetrieverError(
                f"{path} was built with an encoder object, not a model name; pass it again: "
                "DenseRetriever.load(path, encoder)."
            )
        self.docs, self.device, self.show_progress = docs, device, False
        self.encoder = encoder if encoder is not None else _load_encoder(self.encoder_name, device)
        self._on_gpu = False
        self._index = self._place_index(index)
        return self


def _check_params(*, index: str, exact_threshold: int, batch_size: int, default_k: int) -> None:
    if index not in _INDEX_KINDS:
        raise ConfigError(
            f"index={index!r} is not a FAISS index kind; choose one of {', '.join(map(repr, _INDEX_KINDS))}."
        )
    if exact_threshold < 1:
        raise ConfigError(f"exact_threshold must be >= 1 (20000 is a good default), got {exact_threshold}.")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
    if default_k < 1:
        raise ConfigError(f"default_k must be >= 1, got {default_k}.")
