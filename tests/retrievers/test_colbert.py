"""ColBERTRetriever: ColBERT from the embedded MiniLM (PyLate's recipe), PLAID and exact indexes, no-pickle save/load,
fine-tuning with PyLate's contrastive loss, and BM25 hard-negative triples.

The PLAID tests compile PyLate's C++ kernels on a machine's first run (about 2-3 minutes, cached in
``~/.cache/torch_extensions``); after that the whole module takes well under a minute.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import dspy
import pytest

from rolecall.data.types import Document, Example
from rolecall.errors import ConfigError, RetrieverError
from rolecall.retrievers import (
    BM25,
    ColBERTRetriever,
    ColBERTTrainConfig,
    ColBERTTriple,
    fine_tune_colbert,
    hard_negative_triples,
)
from rolecall.retrievers.colbert import colbert_model, document_text
from rolecall.retrievers.colbert_train import _batch, _pylate_view
from rolecall.retrievers.tool import NO_PASSAGES

pytest.importorskip("pylate")
torch = pytest.importorskip("torch")

CORPUS = [
    Document("d00", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    Document("d01", "Rome", "Rome is the capital city of Italy and was the centre of the Roman Empire."),
    Document(
        "d02", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris built by Eiffel's company."
    ),
    Document("d03", "Gustave Eiffel", "Gustave Eiffel was a French civil engineer born in Dijon in 1832."),
    Document("d04", "Dijon", "Dijon is a city in eastern France famous for its mustard."),
    Document("d05", "Tiber", "The Tiber is the third-longest river in Italy and flows through Rome."),
    Document("d06", "Berlin", "Berlin is the capital of Germany and its most populous city."),
    Document(
        "d07", "Brandenburg Gate", "The Brandenburg Gate is an eighteenth-century neoclassical monument in Berlin."
    ),
    Document("d08", "Madrid", "Madrid is the capital of Spain, located in the centre of the Iberian Peninsula."),
    Document("d09", "Prado Museum", "The Prado Museum in Madrid holds one of the finest collections of European art."),
    Document("d10", "Lisbon", "Lisbon is the capital of Portugal, on the estuary of the Tagus river."),
    Document(
        "d11", "Tagus", "The Tagus is the longest river of the Iberian Peninsula, reaching the Atlantic at Lisbon."
    ),
    Document("d12", "Vienna", "Vienna is the capital of Austria, known for its classical music and coffee houses."),
    Document(
        "d13", "Mozart", "Wolfgang Amadeus Mozart was a prolific composer of the classical period, born in Salzburg."
    ),
    Document("d14", "Salzburg", "Salzburg is an Austrian city on the border with Germany, birthplace of Mozart."),
    Document("d15", "Danube", "The Danube is Europe's second-longest river, flowing through Vienna and Budapest."),
    Document("d16", "Budapest", "Budapest is the capital of Hungary, split by the Danube into Buda and Pest."),
    Document("d17", "Amsterdam", "Amsterdam is the capital of the Netherlands, famous for its canals and bicycles."),
    Document("d18", "Rembrandt", "Rembrandt van Rijn was a Dutch painter of the Golden Age who lived in Amsterdam."),
    Document(
        "d19", "Van Gogh", "Vincent van Gogh was a Dutch post-impressionist painter who painted The Starry Night."
    ),
    Document("d20", "Mona Lisa", "The Mona Lisa is a portrait painted by Leonardo da Vinci, displayed in the Louvre."),
    Document("d21", "Louvre", "The Louvre in Paris is the world's most-visited art museum."),
    Document(
        "d22", "Leonardo da Vinci", "Leonardo da Vinci was an Italian polymath of the Renaissance, born in Vinci."
    ),
    Document("d23", "Florence", "Florence is the capital of Tuscany and the birthplace of the Renaissance."),
    Document("d24", "Arno", "The Arno is a river in Tuscany that flows through Florence and Pisa."),
    Document("d25", "Pisa", "Pisa is a Tuscan city best known for its leaning bell tower."),
    Document("d26", "Athens", "Athens is the capital of Greece and one of the oldest cities in the world."),
    Document("d27", "Parthenon", "The Parthenon is a former temple on the Athenian Acropolis dedicated to Athena."),
    Document("d28", "Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    Document(
        "d29", "Photosynthesis", "Photosynthesis is how green plants turn light, water and carbon dioxide into sugar."
    ),
]

OBVIOUS = {
    "Gustave Eiffel born engineer": "d03",
    "Tiber river Rome": "d05",
    "who painted the starry night": "d19",
    "highest mountain on Earth": "d28",
    "mustard": "d04",
}


@pytest.fixture(scope="module")
def model():
    """The untrained ColBERT built from the embedded MiniLM (seeded projection); tests must not train it."""
    return colbert_model(device="cpu")


@pytest.fixture(scope="module")
def plaid(model) -> ColBERTRetriever:
    return ColBERTRetriever(CORPUS, model=model, index="plaid", device="cpu")


def _assert_no_pickle(root: Path) -> None:
    """Every saved file is JSON, JSONL or safetensors, and parses as such (a pickle or torch .pt file would not)."""
    from safetensors import safe_open

    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    for file in files:
        assert file.suffix in {".json", ".jsonl", ".safetensors"}, file
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                assert list(f.keys())
        elif file.suffix == ".json":
            json.loads(file.read_text(encoding="utf-8"))
        else:
            assert all(json.loads(line) for line in file.read_text(encoding="utf-8").splitlines())


def test_the_model_is_minilm_plus_a_projection_with_colbert_markers(model) -> None:
    assert [type(m).__name__ for m in model] == ["Transformer", "Dense", "MultiVectorMask", "Normalize"]
    assert model[1].linear.weight.shape == (128, 384)  # PyLate's projection: MiniLM's 384 dims to 128
    query = model.preprocess(["capital of France?"], prompt=model.prompts["query"], task="query")
    tokens = model.tokenizer.convert_ids_to_tokens(query["input_ids"][0])
    assert tokens[:3] == ["[CLS]", "[unused0]", "capital"] and len(tokens) == 32 and tokens[-1] == "[MASK]"
    document = model.encode_document(["Paris, France."])[0]  # [CLS] [unused1] paris france [SEP]: "," and "." skipped
    assert document.shape == (5, 128)
    torch.testing.assert_close(document.norm(dim=-1), torch.ones(5))


def test_plaid_ranks_the_obvious_document_first(plaid: ColBERTRetriever) -> None:
    assert plaid.resolved_index == "plaid" and len(plaid) == len(CORPUS)
    for query, expected in OBVIOUS.items():
        hits = plaid(query, k=3)
        assert hits[0].id == expected, (query, [p.id for p in hits])
        assert [p.score for p in hits] == sorted((p.score for p in hits), reverse=True)
    top = plaid("Gustave Eiffel born engineer", k=1)[0]
    assert (top.title, top.text) == (CORPUS[3].title, CORPUS[3].text)


def test_batch_equals_single_blank_queries_and_k(plaid: ColBERTRetriever) -> None:
    queries = ["Eiffel Tower", "", "mustard city", "   ", "painter of the Golden Age"]
    batch = plaid.retrieve_batch(queries, k=3)
    assert [len(b) for b in batch] == [3, 0, 3, 0, 3]
    for query, hits in zip(queries, batch, strict=True):
        single = plaid(query, k=3)
        assert [p.id for p in single] == [p.id for p in hits]
        assert [p.score for p in single] == pytest.approx([p.score for p in hits], rel=1e-4)
    assert len(plaid("Paris")) == plaid.default_k == 5
    everything = plaid("Paris", k=100)  # k covers the corpus: every document is scored
    assert sorted(p.id for p in everything) == sorted(d.id for d in CORPUS)
    with pytest.raises(ValueError, match="k must be >= 1"):
        plaid("Paris", k=0)


def test_concurrent_queries_match_sequential_ones(plaid: ColBERTRetriever) -> None:
    """Agents call the search tool from many threads; answers must not depend on that, nor leak captured output."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    queries = list(OBVIOUS) * 3
    stdout, stderr = sys.stdout, sys.stderr
    with ThreadPoolExecutor(max_workers=6) as pool:
        concurrent = list(pool.map(lambda q: plaid(q, k=3), queries))
    assert concurrent == [plaid(q, k=3) for q in queries]
    assert (sys.stdout, sys.stderr) == (stdout, stderr)


def test_plaid_save_load_round_trip_without_pickle(plaid: ColBERTRetriever, tmp_path: Path) -> None:
    plaid.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "corpus.jsonl", "index", "model"]
    assert (tmp_path / "index" / "tensors.safetensors").is_file()
    assert (tmp_path / "model" / "model.safetensors").is_file()
    _assert_no_pickle(tmp_path)
    loaded = ColBERTRetriever.load(tmp_path, device="cpu")
    assert loaded.resolved_index == "plaid" and loaded.docs == plaid.docs
    queries = [*OBVIOUS, "", "a river in Tuscany"]
    assert loaded.retrieve_batch(queries, k=5) == plaid.retrieve_batch(queries, k=5)
    assert loaded.retrieve_batch(["Paris"], k=100) == plaid.retrieve_batch(["Paris"], k=100)


def test_small_corpus_uses_the_exact_index(model, tmp_path: Path) -> None:
    small = ColBERTRetriever(CORPUS[:6], model=model)
    assert small.resolved_index == "exact"
    assert small("mustard", k=1)[0].id == "d04"
    assert len(small("mustard", k=100)) == 6
    small.save(tmp_path)
    _assert_no_pickle(tmp_path)
    loaded = ColBERTRetriever.load(tmp_path, device="cpu")
    assert loaded.resolved_index == "exact"
    assert loaded.retrieve_batch(["mustard", "", "Roman Empire"], k=6) == small.retrieve_batch(
        ["mustard", "", "Roman Empire"], k=6
    )
    with pytest.raises(RetrieverError, match="PLAID needs at least 300 token embeddings"):
        ColBERTRetriever(CORPUS[:2], model=model, index="plaid")


def test_as_tool_works_like_the_other_retrievers(plaid: ColBERTRetriever) -> None:
    tool = plaid.as_tool(k=2)
    assert isinstance(tool, dspy.Tool) and tool.name == "search" and list(tool.args) == ["query"]
    lines = tool(query="Gustave Eiffel born engineer").splitlines()
    assert len(lines) == 2 and lines[0] == "[1] Gustave Eiffel | " + CORPUS[3].text
    assert tool(query="") == NO_PASSAGES


def test_invalid_arguments_raise_clear_errors(model) -> None:
    with pytest.raises(ConfigError, match="'auto', 'plaid', 'exact'"):
        ColBERTRetriever(CORPUS, model=model, index="ivf")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="nbits"):
        ColBERTRetriever(CORPUS, model=model, nbits=3)
    with pytest.raises(ConfigError, match="encode_query"):
        ColBERTRetriever(CORPUS, model=object())
    with pytest.raises(RetrieverError, match="empty"):
        ColBERTRetriever([], model=model)


def test_load_errors_name_the_file(model, tmp_path: Path) -> None:
    BM25(CORPUS).save(tmp_path / "bm25")
    with pytest.raises(RetrieverError, match="'bm25' retriever, not 'colbert'"):
        ColBERTRetriever.load(tmp_path / "bm25")
    saved = tmp_path / "colbert"
    ColBERTRetriever(CORPUS[:6], model=model).save(saved)
    lines = (saved / "corpus.jsonl").read_text().splitlines()
    (saved / "corpus.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(RetrieverError, match="indexes 6 documents"):
        ColBERTRetriever.load(saved)
    (saved / "index" / "exact.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(RetrieverError, match=r"exact\.safetensors is corrupt"):
        ColBERTRetriever.load(saved)


TRIPLES = [
    ColBERTTriple(
        "Where was Gustave Eiffel born?", document_text("Dijon", CORPUS[4].text), document_text("Paris", CORPUS[0].text)
    ),
    ColBERTTriple(
        "Which river flows through Rome?",
        document_text("Tiber", CORPUS[5].text),
        document_text("Arno", CORPUS[24].text),
    ),
    ColBERTTriple(
        "Who painted The Starry Night?",
        document_text("Van Gogh", CORPUS[19].text),
        document_text("Rembrandt", CORPUS[18].text),
    ),
    ColBERTTriple(
        "What is the capital of Hungary?",
        document_text("Budapest", CORPUS[16].text),
        document_text("Vienna", CORPUS[12].text),
    ),
]


def test_pylate_contrastive_loss_matches_sentence_transformers(model) -> None:
    """PyLate's Contrastive (through the adapter) and sentence-transformers' multi-vector MNRL are the same loss."""
    from pylate.losses import Contrastive
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

    features = _batch(model, TRIPLES)
    with torch.no_grad():
        ours = Contrastive(_pylate_view(model))([dict(f) for f in features])
        reference = MultiVectorMultipleNegativesRankingLoss(model)([dict(f) for f in features])
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    assert math.isfinite(float(ours)) and float(ours) > 0


def test_fine_tuning_changes_the_weights_and_the_loss_is_finite() -> None:
    student = colbert_model(device="cpu")
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    config = ColBERTTrainConfig(learning_rate=1e-3, batch_size=4, epochs=3, max_steps=2, warmup_steps=0)
    metrics = fine_tune_colbert(student, TRIPLES, config)
    assert metrics["train/steps"] == 2 and metrics["train/skipped_steps"] == 0
    assert metrics["train/triples_seen"] == 8 and metrics["train/epochs"] == 2
    for key in ("loss/first", "loss/last", "loss/mean", "grad/norm_mean"):
        assert math.isfinite(metrics[key]), key
    after = dict(student.named_parameters())
    for name in ("1.linear.weight", "0.model.encoder.layer.5.output.dense.weight"):
        assert not torch.equal(before[name], after[name]), f"{name} did not change"
    assert not student.training


def test_train_config_validation() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        ColBERTTrainConfig(batch_size=1)
    with pytest.raises(ConfigError, match="learning_rate"):
        ColBERTTrainConfig(learning_rate=0)
    with pytest.raises(ConfigError, match="max_minutes"):
        ColBERTTrainConfig(max_minutes=0)
    with pytest.raises(ConfigError, match="at least 2 triples"):
        fine_tune_colbert(object(), TRIPLES[:1])


def test_hard_negative_is_the_best_ranked_non_gold_bm25_passage() -> None:
    bm25 = BM25(CORPUS)
    question = "Where was the engineer Gustave Eiffel of the Eiffel Tower born?"
    examples = [
        Example(id="q1", question=question, answers=["Dijon"], supporting_ids=["d03", "d04"]),
        Example(id="q2", question="Who is this?", answers=["x"], supporting_ids=["missing"]),  # gold not in corpus
    ]
    ranked = [p.id for p in bm25(question, k=10)]
    assert ranked[0] in {"d03", "d04"}  # BM25 puts a gold passage first: the negative must skip it
    expected = next(i for i in ranked if i not in {"d03", "d04"})
    triples = hard_negative_triples(examples, bm25, depth=10)
    by_id = {d.id: d for d in CORPUS}
    negative = document_text(by_id[expected].title, by_id[expected].text)
    assert triples == [
        ColBERTTriple(question, document_text("Gustave Eiffel", CORPUS[3].text), negative),
        ColBERTTriple(question, document_text("Dijon", CORPUS[4].text), negative),
    ]
    assert hard_negative_triples(examples[:1], bm25, depth=1) == []  # the only candidate is gold: skipped
    with pytest.raises(ConfigError, match="depth"):
        hard_negative_triples(examples, bm25, depth=0)


def test_rolecall_index_fine_tunes_indexes_and_saves(tmp_path: Path, capsys) -> None:
    """``rolecall index`` on a tiny HotpotQA file: fine-tunes on the train side, saves a loadable index."""
    from rolecall.cli import main

    facts = [(CORPUS[i], CORPUS[j], CORPUS[(i + 7) % 30]) for i, j in ((3, 4), (5, 1), (19, 18), (16, 15), (13, 14))]
    facts += [(CORPUS[i], CORPUS[j], CORPUS[(i + 11) % 30]) for i, j in ((20, 22), (24, 23), (27, 26))]
    records = [
        {
            "_id": f"q{n}",
            "question": f"What links {a.title} and {b.title}, unlike {c.title}?",
            "answer": b.title,
            "type": "bridge",
            "level": "easy",
            "supporting_facts": [[a.title, 0], [b.title, 0]],
            "context": [[d.title, [d.text]] for d in (a, b, c)],
        }
        for n, (a, b, c) in enumerate(facts)
    ]
    data = tmp_path / "hotpot.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "index"
    argv = ["index", "--dataset", "hotpotqa", "--data-path", str(data), "--out", str(out), "--no-progress"]
    assert main([*argv, "--fine-tune-minutes", "0.01", "--batch-size", "2", "--index", "exact"]) == 0
    assert "indexed" in capsys.readouterr().out
    training = json.loads((out / "training.json").read_text())
    assert training["triples"] >= 2 and training["train/steps"] >= 1 and math.isfinite(training["loss/first"])
    loaded = ColBERTRetriever.load(out, device="cpu")
    assert loaded.resolved_index == "exact" and len(loaded) == len({d for f in facts for d in f})
    assert loaded("mustard", k=1)[0].title == "Dijon"
