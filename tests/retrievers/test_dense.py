"""DenseRetriever with a deterministic hashed bag-of-words embedder (exact, HNSW and IVF), plus the real MiniLM."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np
import pytest

from rolecall.data.types import Document
from rolecall.errors import ConfigError, RetrieverError
from rolecall.retrievers import BM25, DenseRetriever

pytest.importorskip("faiss")

CORPUS = [
    Document("d0", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    Document("d1", "Rome", "Rome is the capital city of Italy and was the centre of the Roman Empire."),
    Document("d2", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower designed by Gustave Eiffel."),
    Document("d3", "Gustave Eiffel", "Gustave Eiffel was a French civil engineer born in Dijon in 1832."),
    Document("d4", "Dijon", "Dijon is a city in eastern France famous for its mustard."),
    Document("d5", "Tiber", "The Tiber is the third-longest river in Italy and flows through Rome."),
]


class HashEmbedder:
    """Hashed bag of words: each lowercase word adds 1 to dimension crc32(word) % dim. Deterministic across runs."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.calls = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)  # (n, dim)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        return out


def _random_corpus(n: int, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(500)]
    return [Document(f"r{i}", f"T{i}", " ".join(rng.choice(vocab, size=12))) for i in range(n)]


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivf"])
def test_ranks_the_right_document_first(index: str) -> None:
    retriever = DenseRetriever(CORPUS, encoder=HashEmbedder(), index=index)
    assert retriever.resolved_index == index
    assert retriever("Gustave Eiffel born engineer", k=2)[0].id == "d3"
    assert retriever("Tiber river Rome", k=1)[0].id == "d5"
    scores = [p.score for p in retriever("capital city", k=6)]
    assert scores == sorted(scores, reverse=True) and len(scores) == 6


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivf"])
def test_exact_text_finds_itself_in_a_larger_corpus(index: str) -> None:
    corpus = _random_corpus(300)  # IVF trains 300 // 39 = 7 lists here
    retriever = DenseRetriever(corpus, encoder=HashEmbedder(), index=index, batch_size=32)
    queries = [f"{d.title}: {d.text}" for d in corpus[:20]]
    top = retriever.retrieve_batch(queries, k=3)
    assert [hits[0].id for hits in top] == [d.id for d in corpus[:20]]
    assert top[0][0].score == pytest.approx(1.0, abs=1e-5)  # normalised: cosine of a vector with itself


def test_auto_switches_to_hnsw_above_the_exact_threshold() -> None:
    assert DenseRetriever(CORPUS, encoder=HashEmbedder()).resolved_index == "flat"
    assert DenseRetriever(CORPUS, encoder=HashEmbedder(), exact_threshold=3).resolved_index == "hnsw"


def test_batch_equals_single_blank_query_and_k_clamp() -> None:
    retriever = DenseRetriever(CORPUS, encoder=HashEmbedder())
    queries = ["Eiffel Tower", "", "mustard city", "   "]
    batch = retriever.retrieve_batch(queries, k=3)
    assert [len(b) for b in batch] == [3, 0, 3, 0]
    for query, hits in zip(queries, batch, strict=True):
        single = retriever(query, k=3)
        assert [p.id for p in single] == [p.id for p in hits]
        np.testing.assert_allclose([p.score for p in single], [p.score for p in hits], rtol=1e-5)
    assert len(retriever("Paris", k=100)) == len(CORPUS)
    with pytest.raises(ValueError, match="k must be >= 1"):
        retriever("Paris", k=0)


def test_encoder_is_called_in_batches() -> None:
    embedder = HashEmbedder()
    DenseRetriever(CORPUS, encoder=embedder, batch_size=4)
    assert embedder.calls == 2  # 6 documents in batches of 4


def test_invalid_arguments_raise_clear_errors() -> None:
    with pytest.raises(ConfigError, match="'auto', 'flat', 'hnsw', 'ivf'"):
        DenseRetriever(CORPUS, encoder=HashEmbedder(), index="pq")  # type: ignore[arg-type]
    with pytest.raises(RetrieverError, match="empty"):
        DenseRetriever([], encoder=HashEmbedder())
    with pytest.raises(ConfigError, match="encode"):
        DenseRetriever(CORPUS, encoder=object())

    class Flat:
        def encode(self, texts: list[str]) -> np.ndarray:
            return np.zeros(len(texts))

    with pytest.raises(RetrieverError, match="shape"):
        DenseRetriever(CORPUS, encoder=Flat())


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivf"])
def test_save_load_round_trip_without_pickle(index: str, tmp_path: Path) -> None:
    retriever = DenseRetriever(_random_corpus(100), encoder=HashEmbedder(), index=index)
    retriever.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "corpus.jsonl", "index.faiss"]
    loaded = DenseRetriever.load(tmp_path, HashEmbedder())
    assert loaded.resolved_index == index and loaded.docs == retriever.docs
    queries = ["w1 w2 w3", "w400 w7", ""]
    assert loaded.retrieve_batch(queries, k=5) == retriever.retrieve_batch(queries, k=5)


def test_load_needs_the_encoder_object_when_none_was_named(tmp_path: Path) -> None:
    DenseRetriever(CORPUS, encoder=HashEmbedder()).save(tmp_path)
    with pytest.raises(RetrieverError, match="encoder"):
        DenseRetriever.load(tmp_path)


def test_corrupt_or_missing_files_raise_retriever_error_naming_them(tmp_path: Path) -> None:
    DenseRetriever(CORPUS, encoder=HashEmbedder()).save(tmp_path)
    index_file = tmp_path / "index.faiss"
    index_file.write_bytes(b"garbage, not a faiss index")
    with pytest.raises(RetrieverError, match=r"index\.faiss is corrupt"):
        DenseRetriever.load(tmp_path, HashEmbedder())
    index_file.unlink()
    with pytest.raises(RetrieverError, match=r"index\.faiss is missing"):
        DenseRetriever.load(tmp_path, HashEmbedder())


def test_index_and_corpus_must_agree(tmp_path: Path) -> None:
    DenseRetriever(CORPUS, encoder=HashEmbedder()).save(tmp_path)
    lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(RetrieverError, match="6 vectors"):
        DenseRetriever.load(tmp_path, HashEmbedder())


def test_loading_the_wrong_kind_of_index_says_so(tmp_path: Path) -> None:
    BM25(CORPUS).save(tmp_path)
    with pytest.raises(RetrieverError, match="'bm25' retriever, not 'dense'"):
        DenseRetriever.load(tmp_path, HashEmbedder())


@pytest.mark.slow
def test_embedded_minilm_retrieves_the_right_document(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    from rolecall.errors import ModelLoadError

    try:
        retriever = DenseRetriever(CORPUS, device="cpu")
    except ModelLoadError as err:
        pytest.skip(f"the embedded MiniLM is not installed: {err}")
    assert retriever.dim == 384
    assert retriever("Who designed the iron tower in Paris?", k=2)[0].id == "d2"
    assert retriever("Which river runs through the Italian capital?", k=2)[0].id == "d5"
    retriever.save(tmp_path)
    loaded = DenseRetriever.load(tmp_path, device="cpu")  # re-creates MiniLM from the saved name
    assert [p.id for p in loaded("mustard", k=3)] == [p.id for p in retriever("mustard", k=3)]
