"""Tests for rolecall.data.corpus (closed corpora, dataset registry) and the paragraph helpers of rolecall.data.io."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rolecall.data.corpus import (
    build_corpus,
    corpus_by_id,
    detect_format,
    dev_subset_path,
    documents_from_paragraphs,
    load_corpus_jsonl,
    load_dataset,
    paragraph_id_of,
    save_corpus_jsonl,
)
from rolecall.data.io import Paragraph, split_sentences
from rolecall.data.types import Document, doc_id
from rolecall.errors import ConfigError, DataFormatError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
FILES = {
    "hotpotqa": DATA / "hotpotqa" / "hotpot_dev_distractor_600.jsonl",
    "2wikimultihopqa": DATA / "2wikimultihopqa" / "2wiki_dev_243.json",
    "musique": DATA / "musique" / "musique_ans_dev_55.jsonl",
}


def test_dev_subset_paths_name_the_shared_files():
    assert dev_subset_path("hotpotqa", DATA) == FILES["hotpotqa"]
    assert dev_subset_path("2wiki", DATA) == FILES["2wikimultihopqa"]
    assert dev_subset_path("musique", DATA) == FILES["musique"]
    assert dev_subset_path("musique") == Path("../shared/data/musique/musique_ans_dev_55.jsonl")
    with pytest.raises(ConfigError, match="no dev subset"):
        dev_subset_path("squad")


def hotpot_row(qid: str, titles: list[str]) -> dict[str, Any]:
    return {
        "id": qid,
        "question": "Q?",
        "answer": "yes",
        "type": "comparison",
        "supporting_facts": {"title": titles[:2], "sent_id": [0, 1]},
        "context": {"title": titles, "sentences": [[f"{t} one.", f" {t} two."] for t in titles]},
    }


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(hotpot_row("1", ["A", "B", "C"])) + "\n" + json.dumps(hotpot_row("2", ["B", "D"])) + "\n")
    b.write_text(json.dumps(hotpot_row("3", ["D", "E"])) + "\n")
    return a, b


def test_paragraph_corpus_dedups_in_first_seen_order(two_files: tuple[Path, Path]) -> None:
    a, b = two_files
    docs = build_corpus("hotpotqa", a)
    assert [d.title for d in docs] == ["A", "B", "C", "D"]
    assert docs[0] == Document(id=doc_id("A", "A one. A two."), title="A", text="A one. A two.")
    assert [d.title for d in build_corpus("auto", [a, b])] == ["A", "B", "C", "D", "E"]


def test_sentence_corpus_ids_and_gold(two_files: tuple[Path, Path]) -> None:
    a, _ = two_files
    sentences = build_corpus("hotpotqa", a, level="sentence")
    assert len(sentences) == 8
    assert sentences[1] == Document(id=f"{doc_id('A', 'A one. A two.')}#s1", title="A", text="A two.")
    gold = {i for ex in load_dataset("hotpotqa", a) for i in ex.metadata["supporting_sentence_ids"]}
    assert gold <= {d.id for d in sentences}
    assert {paragraph_id_of(d.id) for d in sentences} == {d.id for d in build_corpus("hotpotqa", a)}


def test_documents_from_paragraphs_and_level_check() -> None:
    ps = [Paragraph.from_text("T", "One. Two."), Paragraph.from_text("T", "One. Two."), Paragraph.from_text("U", "")]
    assert [d.title for d in documents_from_paragraphs(ps)] == ["T", "U"]
    assert [d.text for d in documents_from_paragraphs(ps, level="sentence")] == ["One.", "Two."]
    with pytest.raises(ConfigError, match="level must be 'paragraph' or 'sentence', got 'word'"):
        documents_from_paragraphs(ps, level="word")  # type: ignore[arg-type]


def test_paragraph_helpers() -> None:
    p = Paragraph.from_sentences("T", ["First.", " Second.", "  ", "Third."])
    assert p.text == "First. Second. Third." and len(p.sentences) == 4  # indices kept for sent_id
    assert p.id == doc_id("T", p.text) and p.sentence_id(3) == f"{p.id}#s3"
    assert paragraph_id_of(p.sentence_id(3)) == p.id
    assert paragraph_id_of("Title #shadow::0123abcd") == "Title #shadow::0123abcd"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It rains. The sky is grey! Is it 3 p.m. now?", ["It rains.", "The sky is grey!", "Is it 3 p.m. now?"]),
        ('He said "Go." Then he left.', ['He said "Go."', "Then he left."]),
        ("No end", ["No end"]),
        ("", []),
        ("Born in 1990. 2001 was next.", ["Born in 1990.", "2001 was next."]),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_corpus_jsonl_round_trip_and_by_id(tmp_path: Path, two_files: tuple[Path, Path]) -> None:
    docs = build_corpus("hotpotqa", two_files[0])
    assert save_corpus_jsonl(docs, tmp_path / "sub" / "corpus.jsonl") == len(docs)
    assert load_corpus_jsonl(tmp_path / "sub" / "corpus.jsonl") == docs
    by_id = corpus_by_id(docs + docs[:1])
    assert list(by_id) == [d.id for d in docs]
    with pytest.raises(ValueError, match="share the id"):
        corpus_by_id([Document("x", "T", "a"), Document("x", "T", "b")])
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "title": "T"}\n')
    with pytest.raises(DataFormatError, match="missing required key 'text'"):
        load_corpus_jsonl(tmp_path / "bad.jsonl")


def test_load_dataset_dispatch_and_errors(two_files: tuple[Path, Path]) -> None:
    a, _ = two_files
    by_name = load_dataset("hotpotqa", a)
    assert load_dataset("HotpotQA", a) == by_name and load_dataset(a) == by_name and load_dataset(str(a)) == by_name
    assert load_dataset("hotpotqa", a, limit=1) == by_name[:1]
    with pytest.raises(ConfigError, match="needs a file"):
        load_dataset("musique")
    with pytest.raises(ConfigError, match=r"unknown dataset 'squad'; choose one of: .*2wiki.*musique"):
        load_dataset("squad", a)
    with pytest.raises(ConfigError, match="unknown dataset"):
        build_corpus("squad", a)


def test_detect_format(tmp_path: Path) -> None:
    cases = {
        "flashrag": {"id": "1", "question": "Q", "golden_answers": ["A"]},
        "musique": {"id": "1", "paragraphs": []},
        "2wikimultihopqa": {"_id": "1", "context": [], "evidences": []},
        "hotpotqa": {"_id": "1", "context": []},
    }
    for name, rec in cases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps([rec]))
        assert detect_format(tmp_path / f"{name}.json") == name
    (tmp_path / "odd.jsonl").write_text('{"query": "Q"}\n')
    with pytest.raises(DataFormatError, match=r"odd.jsonl:1: cannot tell the dataset format"):
        detect_format(tmp_path / "odd.jsonl")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(DataFormatError, match="no records"):
        detect_format(tmp_path / "empty.json")
    (tmp_path / "csv.txt").write_text("a,b\n")
    with pytest.raises(DataFormatError, match="expected a JSON list"):
        detect_format(tmp_path / "csv.txt")


@pytest.mark.parametrize("name", sorted(FILES))
def test_real_files_detect_and_close(name: str) -> None:
    path = FILES[name]
    if not path.is_file():
        pytest.skip(f"real {name} subset not found at {path} (the shared data folder is absent)")
    assert detect_format(path) == name
    examples = load_dataset(path)
    ids = {d.id for d in build_corpus("auto", path)}
    assert examples and all(e.dataset == name for e in examples)
    assert all(i in ids for e in examples for i in e.supporting_ids)
