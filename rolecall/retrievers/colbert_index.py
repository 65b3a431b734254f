"""The two ColBERT indexes: PyLate's PLAID over compressed token embeddings, and exact MaxSim over all of them; both
stored without pickle.

PLAID (Santhanam et al., CIKM 2022, arXiv:2205.09707) compresses every document token embedding ``d`` into the id of
its nearest k-means centroid ``C_c`` plus an ``nbits``-per-dimension quantized residual ``r = d - C_c`` (ColBERTv2,
arXiv:2112.01488). A query ``Q`` is answered in stages:

    1. candidate generation: the ``ncells`` centroids nearest to each query token, and the documents listed under them;
    2. centroid interaction: score(D, Q) ~ sum_i max_j <q_i, C_{c(d_j)}>, pruning centroids scoring below
       ``centroid_score_threshold`` and keeping the best ``ndocs`` documents;
    3. exact late interaction on the decompressed embeddings d_j = C_{c(d_j)} + r_j of the survivors.

The backend is PyLate's PLAID with ``use_fast=False`` (``pylate.indexes.stanford_nlp``: the Stanford ColBERT
implementation PyLate ships, whose C++ kernels torch compiles once per machine into ``~/.cache/torch_extensions``). Its
fast-plaid backend is a Rust extension built per torch release (``fast-plaid 1.4.6.2110`` = torch 2.11.0); there is no
build for torch 2.13, and the 2.11 build segfaults in ``c10::TensorImpl::incref_pyobject`` as soon as a tensor crosses
into it, so it cannot be used here.

Storage: the Stanford code writes ``*.pt`` files (``torch.save`` of plain tensors, a pickle container) and JSON into a
working directory. :meth:`PlaidIndex.save` re-stores every tensor of those files into one ``tensors.safetensors``
(copying the JSON files as they are), and :meth:`PlaidIndex.load` writes them back as ``.pt`` files into a fresh
working directory before PyLate opens it. No pickle is ever read from a saved directory: the only ``.pt`` files PyLate
reads are the ones just written from safetensors tensors, and torch >= 2.6 reads them with ``weights_only=True``.

:class:`ExactIndex` keeps every token embedding and scores every document with PyLate's ``colbert_scores``: exact, and
the only choice for a corpus too small for PLAID's k-means (fewer token embeddings than centroids).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rolecall.errors import RetrieverError

__all__ = ["PlaidIndex", "ExactIndex", "import_pylate", "PLAID_MIN_EMBEDDINGS"]

logger = logging.getLogger(__name__)

PLAID_MIN_EMBEDDINGS = 300
"""The fewest token embeddings PLAID can index: it trains ``2 ** floor(log2(16 * sqrt(E)))`` centroids on ``E`` token
embeddings less a 5% held-out set, so it needs ``16 * sqrt(E) <= 0.95 * E``, that is ``E >= 284``."""

_INDEX_NAME = "plaid"
_TENSORS_NAME = "tensors.safetensors"
_MANIFEST_NAME = "manifest.json"
_EXACT_NAME = "exact.safetensors"
_PIP_HINT = "pip install --no-deps pylate==1.6.0 && pip install ujson fastkmeans ninja"
# Redirecting stdout/stderr is process-wide: two threads doing it at once could leave sys.stdout pointing at a buffer.
_OUTPUT_LOCK = threading.Lock()


def import_pylate() -> Any:
    """Import ``pylate``, or raise an ImportError that names the install command."""
    try:
        import pylate
        import pylate.indexes.stanford_nlp  # noqa: F401  (the PLAID backend; needs ujson and fastkmeans)
    except ImportError as err:
        raise ImportError(
            f"ColBERTRetriever needs PyLate ({err}); install it without its pins (they ask for torch 2.11 and "
            f"sentence-transformers 5.3): {_PIP_HINT}"
        ) from err
    return pylate


@contextlib.contextmanager
def _quiet(what: str) -> Iterator[None]:
    """Route the Stanford code's ``print`` and tqdm output to this module's DEBUG log instead of the terminal.

    Used only while building and opening an index (searches print nothing once :meth:`PlaidIndex._open` has loaded
    every kernel); the redirection is process-wide, so other threads' output in that window goes to the log too.
    """
    out, err = io.StringIO(), io.StringIO()
    try:
        with _OUTPUT_LOCK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        text = (out.getvalue() + err.getvalue()).strip()
        if text:
            logger.debug("%s:\n%s", what, text)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed Python's and torch's global generators (PLAID's sampling and k-means use them), restoring both after."""
    import torch

    state = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            random.seed(seed)
            torch.manual_seed(seed)
            yield
    finally:
        random.setstate(state)


def _as_arrays(embeddings: Sequence[Any]) -> list[Any]:
    """Float32 ``(n_tokens_i, dim)`` arrays, checked: at least one document, each with at least one token."""
    import numpy as np

    arrays = [np.ascontiguousarray(_as_numpy(e), dtype=np.float32) for e in embeddings]
    if not arrays:
        raise RetrieverError("A ColBERT index needs at least one document.")
    empty = [i for i, a in enumerate(arrays) if a.ndim != 2 or a.shape[0] == 0]
    if empty:
        raise RetrieverError(f"documents {empty[:5]} have no token embeddings; each needs at least one.")
    return arrays


class PlaidIndex:
    """PyLate's PLAID index (Stanford backend) over one list of per-document token embeddings.

    Document ``i`` of the embeddings given to :meth:`build` has PLAID id ``i``; searches return those ids.

    Args:
        workdir: directory PyLate writes its index files into; ``None`` makes a temporary one, removed when this
            object is garbage-collected.
        nbits: bits per dimension of the quantized residuals (2 as in ColBERTv2/PLAID; 1 is smaller, 4 closer to exact).
        kmeans_niters: k-means iterations when choosing the centroids.
        ncells: centroids probed per query token (stage 1).
        centroid_score_threshold: centroids scoring below this are pruned in stage 2.
        ndocs: documents kept after centroid interaction for exact scoring (stage 3).
        seed: seeds PLAID's sampling and k-means.
    """

    kind = "plaid"

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        nbits: int = 2,
        kmeans_niters: int = 4,
        ncells: int = 8,
        centroid_score_threshold: float = 0.35,
        ndocs: int = 8192,
        seed: int = 0,
    ) -> None:
        self.nbits, self.kmeans_niters, self.ncells = nbits, kmeans_niters, ncells
        self.centroid_score_threshold, self.ndocs, self.seed = centroid_score_threshold, ndocs, seed
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="rolecall-plaid-")
            self._finalizer = weakref.finalize(self, shutil.rmtree, workdir, True)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.n_docs = 0
        self._searcher: Any = None
        self._lock = threading.Lock()  # the Stanford searcher was not written for concurrent queries

    @property
    def path(self) -> Path:
        """The directory holding PyLate's index files."""
        return self.workdir / _INDEX_NAME

    def _config(self) -> Any:
        import_pylate()
        from pylate.indexes.stanford_nlp.infra import ColBERTConfig

        return ColBERTConfig(
            nbits=self.nbits,
            nranks=1,
            root=str(self.workdir),
            index_root=str(self.workdir),
            overwrite=True,
            kmeans_niters=self.kmeans_niters,
            index_bsize=1,
            ndocs=self.ndocs,
            centroid_score_threshold=self.centroid_score_threshold,
            ncells=self.ncells,
            use_triton=False,  # k-means without triton: reproducible, and there is no triton on a CPU
        )

    def build(self, embeddings: Sequence[Any]) -> None:
        """Index ``embeddings``: one ``(n_tokens_i, dim)`` float array or tensor per document.

        Raises:
            RetrieverError: if there are no documents, a document has no token embedding, or there are fewer than
                :data:`PLAID_MIN_EMBEDDINGS` token embeddings in all.
        """
        arrays = _as_arrays(embeddings)
        total = sum(a.shape[0] for a in arrays)
        if total < PLAID_MIN_EMBEDDINGS:
            raise RetrieverError(
                f"PLAID needs at least {PLAID_MIN_EMBEDDINGS} token embeddings to train its centroids, this corpus "
                f"has {total}; use index='exact' (or 'auto') for a corpus this small."
            )
        import_pylate()
        from pylate.indexes.stanford_nlp import Indexer

        config = self._config()
        config.configure(dim=int(arrays[0].shape[1]))
        with _quiet("PLAID indexing"), _seeded(self.seed):
            Indexer(config=config, verbose=0).index(name=_INDEX_NAME, collection=arrays, overwrite=True)
        self.n_docs = len(arrays)
        self._open()

    def _open(self) -> None:
        import_pylate()
        from pylate.indexes.stanford_nlp import Searcher

        with _quiet("PLAID loading"):
            searcher = Searcher(index=_INDEX_NAME, config=self._config(), index_root=str(self.workdir), verbose=0)
            # Score one document once, so the last lazily compiled kernel (segmented MaxSim) loads here, quietly.
            dim = int(searcher.config.dim)
            searcher.search(_as_numpy(_unit_query(dim)), k=1, pids=[0])
        self._searcher = searcher

    def search(self, query: Any, k: int, *, exhaustive: bool = False) -> tuple[list[int], list[float]]:
        """The top-``k`` PLAID ids and their MaxSim scores for one query's ``(n_tokens, dim)`` embeddings.

        ``exhaustive=True`` skips candidate generation and scores every document on its decompressed embeddings.
        """
        if self._searcher is None:
            raise RetrieverError("The PLAID index is not built; call build() or load() first.")
        pids = list(range(self.n_docs)) if exhaustive else None
        with self._lock:
            ids, _ranks, scores = self._searcher.search(_as_numpy(query), k=k, pids=pids)
        return [int(i) for i in ids], [float(s) for s in scores]

    def save(self, path: str | Path) -> None:
        """Write the index to directory ``path``: its JSON files as they are, every tensor in ``tensors.safetensors``
        and a ``manifest.json`` saying which ``.pt`` file each tensor came from."""
        import torch
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, Any] = {}
        manifest: dict[str, Any] = {"n_docs": self.n_docs, "pt_files": {}, "json_files": []}
        for file in sorted(self.path.iterdir()):
            if file.suffix == ".json":
                shutil.copyfile(file, path / file.name)
                manifest["json_files"].append(file.name)
            elif file.suffix == ".pt":
                obj = torch.load(file, map_location="cpu", weights_only=True)
                parts = list(obj) if isinstance(obj, (tuple, list)) else [obj]
                keys = [f"{file.name}/{i}" for i in range(len(parts))]
                tensors.update({key: t.contiguous() for key, t in zip(keys, parts, strict=True)})
                manifest["pt_files"][file.name] = {"keys": keys, "tuple": isinstance(obj, (tuple, list))}
            else:
                logger.warning("Not saving unexpected PLAID file %s", file)
        save_file(tensors, str(path / _TENSORS_NAME))
        (path / _MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, workdir: str | Path | None = None, **params: Any) -> PlaidIndex:
        """Read an index written by :meth:`save` into a fresh working directory and open it.

        Args:
            path: the directory given to :meth:`save`.
            workdir: where to lay out PyLate's working files (``None``: a temporary directory).
            **params: the search parameters of the class.

        Raises:
            RetrieverError: naming the file when one is missing or corrupt.
        """
        import torch

        path = Path(path)
        manifest_file, tensors_file = path / _MANIFEST_NAME, path / _TENSORS_NAME
        if not manifest_file.is_file():
            raise RetrieverError(f"{manifest_file} is missing; re-save the retriever.")
        try:
            manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
            pt_files, json_files, n_docs = manifest["pt_files"], manifest["json_files"], int(manifest["n_docs"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise RetrieverError(f"{manifest_file} is corrupt ({err}); re-save the retriever.") from err
        tensors = _read_safetensors(tensors_file)
        self = cls(workdir, **params)
        self.path.mkdir(parents=True, exist_ok=True)
        for name in json_files:
            source = path / os.path.basename(name)
            if not source.is_file():
                raise RetrieverError(f"{source} is missing; re-save the retriever.")
            shutil.copyfile(source, self.path / source.name)
        for name, entry in pt_files.items():
            missing = [key for key in entry["keys"] if key not in tensors]
            if missing:
                raise RetrieverError(f"{tensors_file} lacks tensors {missing}; re-save the retriever.")
            parts = [tensors[key] for key in entry["keys"]]
            torch.save(tuple(parts) if entry["tuple"] else parts[0], self.path / os.path.basename(name))
        self.n_docs = n_docs
        try:
            self._open()
        except (OSError, RuntimeError, KeyError, ValueError, AssertionError) as err:
            raise RetrieverError(f"{path} does not hold a usable PLAID index ({err}); re-save the retriever.") from err
        return self


class ExactIndex:
    """Every token embedding kept as is; each query is scored against every document with PyLate's
    ``colbert_scores`` (MaxSim over the padded, masked document embeddings).

    Naive equivalent: ``[sum(max(q @ d.T, axis=1)) for d in documents]`` for query embeddings ``q``.
    """

    kind = "exact"

    def __init__(self) -> None:
        self.n_docs = 0

    def build(self, embeddings: Sequence[Any]) -> None:
        """Keep ``embeddings`` (one ``(n_tokens_i, dim)`` array or tensor per document), padded into one tensor."""
        import torch

        arrays = _as_arrays(embeddings)
        self._set(torch.cat([torch.from_numpy(a) for a in arrays]), torch.tensor([a.shape[0] for a in arrays]))

    def _set(self, flat: Any, doclens: Any) -> None:
        import torch

        self.n_docs = int(doclens.shape[0])
        self._flat, self._doclens = flat, doclens  # (E, dim), (N,)
        n_tokens = int(doclens.max())
        mask = torch.arange(n_tokens)[None, :] < doclens[:, None]  # (N, L)
        self._padded = torch.zeros(self.n_docs, n_tokens, flat.shape[1])  # (N, L, dim)
        self._padded[mask] = flat
        self._mask = mask.float()

    def search(self, query: Any, k: int, *, exhaustive: bool = True) -> tuple[list[int], list[float]]:
        """The top-``k`` document ids and their MaxSim scores for one query's ``(n_tokens, dim)`` embeddings."""
        import torch
        from pylate.scores import colbert_scores

        q = torch.as_tensor(_as_numpy(query))[None]  # (1, T, dim)
        scores = colbert_scores(q, self._padded, documents_mask=self._mask, backend="torch")[0]  # (N,)
        top = torch.topk(scores, k=min(k, self.n_docs))
        return top.indices.tolist(), top.values.tolist()

    def save(self, path: str | Path) -> None:
        """Write ``exact.safetensors`` (all token embeddings ``(E, dim)`` and the per-document counts) to ``path``."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file({"embeddings": self._flat.contiguous(), "doclens": self._doclens}, str(path / _EXACT_NAME))

    @classmethod
    def load(cls, path: str | Path, workdir: str | Path | None = None, **params: Any) -> ExactIndex:
        """Read an index written by :meth:`save` (``workdir`` and ``params`` are accepted and unused)."""
        file = Path(path) / _EXACT_NAME
        tensors = _read_safetensors(file)
        if set(tensors) != {"embeddings", "doclens"} or int(tensors["doclens"].sum()) != tensors["embeddings"].shape[0]:
            raise RetrieverError(f"{file} does not hold consistent ColBERT embeddings; re-save the retriever.")
        self = cls()
        self._set(tensors["embeddings"], tensors["doclens"])
        return self


def _read_safetensors(file: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise RetrieverError(f"{file} is missing; re-save the retriever.")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise RetrieverError(f"{file} is corrupt ({err}); re-save the retriever.") from err


def _unit_query(dim: int) -> Any:
    import numpy as np

    return np.full((1, dim), dim**-0.5, dtype=np.float32)  # (1, dim), unit norm


def _as_numpy(x: Any) -> Any:
    import numpy as np

    if hasattr(x, "detach"):
        return x.detach().to("cpu").float().numpy()
    return np.asarray(x, dtype=np.float32)
