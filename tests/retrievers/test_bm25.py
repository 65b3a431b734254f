"""BM25 on bm25s: ranking, parity with rank_bm25, batch/single agreement, k clamp and no-pickle save/load."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rolecall.data.types import Document
from rolecall.errors import ConfigError, RetrieverError
from rolecall.retrievers import BM25, Passage

CORPUS = [
    Document("d0", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    Document("d1", "Rome", "Rome is the capital city of Italy and was the centre of the Roman Empire."),
    Document(
        "d2", "Seine", "The Seine is a river in northern France that flows through Paris into the English Channel."
    ),
    Document(
        "d3", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris designed by Gustave Eiffel."
    ),
    Document("d4", "Gustave Eiffel", "Gustave Eiffel was a French civil engineer born in Dijon in 1832."),
    Document("d5", "Dijon", "Dijon is a city in eastern France famous for its mustard."),
    Document("d6", "Colosseum", "The Colosseum is an ancient amphitheatre in the centre of Rome, Italy."),
    Document("d7", "Tiber", "The Tiber is the third-longest river in Italy and flows through Rome."),
    Document("d8", "Mustard", "Mustard is a condiment made from the seeds of a mustard plant."),
    Document("d9", "Lattice", "A lattice tower is a freestanding framework tower of steel or wrought iron."),
]


@pytest.fixture(scope="module")
def bm25() -> BM25:
    return BM25(CORPUS)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Who designed the Eiffel Tower?", "d3"),
        ("In which city was Gustave Eiffel born?", "d4"),
        ("Which river flows through Rome?", "d7"),
        ("What is Dijon famous for?", "d5"),
    ],
)
def test_ranks_the_right_document_first(bm25: BM25, query: str, expected: str) -> None:
    passages = bm25(query, k=3)
    assert passages[0].id == expected
    assert all(isinstance(p, Passage) for p in passages)
    scores = [p.score for p in passages]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0


def test_title_is_indexed(bm25: BM25) -> None:
    # "Colosseum" appears only in d6's title and text; "Lattice" is d9's title and also in d3's text.
    assert bm25("lattice", k=1)[0].id in {"d3", "d9"}
    only_title = BM25([Document("x", "Zanzibar", "An island."), Document("y", "Other", "Something else.")])
    assert only_title("zanzibar", k=1)[0].id == "x"


def _okapi_reference(query: str) -> np.ndarray:
    """rank_bm25's BM25Okapi on the same tokens (title + text, bm25s tokenizer with English stopwords)."""
    bm25s = pytest.importorskip("bm25s")
    rank_bm25 = pytest.importorskip("rank_bm25")
    corpus_tokens = bm25s.tokenize(
        [f"{d.title} {d.text}" for d in CORPUS], stopwords="en", return_ids=False, show_progress=False
    )
    query_tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
    return rank_bm25.BM25Okapi(corpus_tokens, k1=1.5, b=0.75).get_scores(query_tokens)


@pytest.mark.parametrize("query", ["capital city of Italy", "river through Paris France", "wrought iron tower"])
def test_robertson_scores_match_rank_bm25_okapi(query: str) -> None:
    """bm25s's "robertson" variant drops Okapi's constant (k1 + 1) factor; otherwise the scores are identical.

    Okapi: IDF(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * |D| / avgdl)) with IDF = log((N - df + 0.5) / (df + 0.5)),
    so with k1 = 1.5 every robertson score times 2.5 equals the Okapi score (all query terms here have df < N / 2, so
    Okapi's epsilon floor for negative IDF never applies).
    """
    reference = _okapi_reference(query)  # (N,)
    passages = BM25(CORPUS, method="robertson")(query, k=len(CORPUS))
    ours = np.zeros(len(CORPUS))
    for p in passages:
        ours[int(p.id[1:])] = p.score * 2.5
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "query", ["capital city of Italy", "river through Paris France", "wrought iron tower", "mustard"]
)
def test_lucene_ranking_agrees_with_rank_bm25_okapi(bm25: BM25, query: str) -> None:
    """Lucene's IDF log(1 + (N - df + 0.5) / (df + 0.5)) is a monotone shift of Okapi's: the top ids agree."""
    reference = _okapi_reference(query)
    ref_order = [f"d{i}" for i in np.argsort(-reference, kind="stable") if reference[i] > 0]
    ours = [p.id for p in bm25(query, k=3)]
    assert ours[0] == ref_order[0]
    assert set(ours) == set(ref_order[:3])


def test_batch_equals_single(bm25: BM25) -> None:
    queries = ["Eiffel Tower designer", "", "river Rome", "mustard seeds", "zzzz unknown"]
    batch = bm25.retrieve_batch(queries, k=4)
    assert batch == [bm25.retrieve(q, k=4) for q in queries]


@pytest.mark.parametrize("query", ["", "   ", "the of and", "qwertyuiop"])
def test_empty_blank_stopword_or_unknown_query_returns_nothing(bm25: BM25, query: str) -> None:
    assert bm25(query) == []


def test_k_is_clamped_and_non_matching_documents_are_dropped(bm25: BM25) -> None:
    # "capital" occurs in d0 and d1 only; k far beyond the corpus size neither fails nor pads.
    assert {p.id for p in bm25("capital", k=1000)} == {"d0", "d1"}
    everywhere = BM25([Document(f"x{i}", "", f"common word {i}") for i in range(3)])
    assert len(everywhere("common", k=50)) == 3


def test_default_k_and_invalid_k(bm25: BM25) -> None:
    assert len(BM25(CORPUS, default_k=2)("the river Seine flows through Paris France")) == 2
    with pytest.raises(ValueError, match="k must be >= 1"):
        bm25("Paris", k=0)


def test_accepts_any_object_with_id_title_text() -> None:
    corpus = [
        SimpleNamespace(id=1, title="Alpha", text="first letter"),
        SimpleNamespace(id=2, title="Beta", text="second"),
    ]
    assert BM25(corpus)("first letter", k=1)[0].id == "1"


def test_bad_corpus_and_config_raise_clear_errors() -> None:
    with pytest.raises(RetrieverError, match="empty"):
        BM25([])
    with pytest.raises(RetrieverError, match="id/title/text"):
        BM25(["just a string"])
    with pytest.raises(ConfigError, match="'lucene'.*'robertson'"):
        BM25(CORPUS, method="okapi")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="b must lie in"):
        BM25(CORPUS, b=1.5)


def test_save_load_round_trip_without_pickle(bm25: BM25, tmp_path: Path) -> None:
    bm25.save(tmp_path / "index")
    loaded = BM25.load(tmp_path / "index")
    queries = ["Eiffel Tower designer", "river Rome", "mustard", ""]
    assert loaded.retrieve_batch(queries, k=5) == bm25.retrieve_batch(queries, k=5)
    assert loaded.docs == bm25.docs and loaded.default_k == bm25.default_k
    files = [p for p in (tmp_path / "index").rglob("*") if p.is_file()]
    assert files and not [p for p in files if p.suffix in {".pkl", ".pickle", ".joblib"}]
    for npy in (p for p in files if p.suffix == ".npy"):
        np.load(npy, allow_pickle=False)  # would raise on an object (pickled) array


def test_custom_stemmer_must_be_passed_again(tmp_path: Path) -> None:
    def stem(words: list[str]) -> list[str]:
        return [w.rstrip("s") for w in words]

    retriever = BM25(CORPUS, stemmer=stem)
    assert retriever("rivers", k=1)[0].id in {"d2", "d7", "d0"}
    retriever.save(tmp_path)
    with pytest.raises(RetrieverError, match="custom stemmer"):
        BM25.load(tmp_path)
    assert BM25.load(tmp_path, stemmer=stem)("rivers", k=3) == retriever("rivers", k=3)


@pytest.mark.parametrize(
    ("relative", "content"),
    [
        ("bm25s/data.csc.index.npy", b"not a numpy file"),
        ("bm25s/vocab.index.json", b"{broken json"),
        ("config.json", b"[1, 2"),
        ("corpus.jsonl", b'{"id": "d0"}\n'),
    ],
)
def test_corrupt_file_raises_retriever_error_naming_it(
    bm25: BM25, tmp_path: Path, relative: str, content: bytes
) -> None:
    bm25.save(tmp_path)
    (tmp_path / relative).write_bytes(content)
    with pytest.raises(RetrieverError, match=Path(relative).name.replace(".", r"\.")):
        BM25.load(tmp_path)


def test_missing_file_raises_retriever_error_naming_it(bm25: BM25, tmp_path: Path) -> None:
    bm25.save(tmp_path)
    (tmp_path / "bm25s" / "indptr.csc.index.npy").unlink()
    with pytest.raises(RetrieverError, match=r"indptr\.csc\.index\.npy is missing"):
        BM25.load(tmp_path)
    with pytest.raises(RetrieverError, match=r"config\.json is missing"):
        BM25.load(tmp_path / "nowhere")
