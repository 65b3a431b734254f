"""Tests for rolecall.data.musique: gold decompositions with #k placeholders, aliases and the answerable filter."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rolecall.data.corpus import build_corpus
from rolecall.data.musique import load_musique
from rolecall.data.types import Example, doc_id
from rolecall.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
MUSIQUE = DATA / "musique" / "musique_ans_dev_55.jsonl"


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    if not MUSIQUE.is_file():
        pytest.skip(f"real MuSiQue subset not found at {MUSIQUE} (the shared data folder is absent)")
    return load_musique(MUSIQUE)


def record(qid: str = "2hop__1_2", **overrides: Any) -> dict[str, Any]:
    """A small MuSiQue-Ans record."""
    rec = {
        "id": qid,
        "paragraphs": [
            {"idx": 0, "title": "Noise", "paragraph_text": "Nothing here.", "is_supporting": False},
            {"idx": 1, "title": "Film", "paragraph_text": "The film stars Ann.", "is_supporting": True},
            {"idx": 2, "title": "Ann", "paragraph_text": "Ann won a Tony. She sings.", "is_supporting": True},
        ],
        "question": "What did the star of Film win?",
        "question_decomposition": [
            {"id": 1, "question": "who stars in Film", "answer": "Ann", "paragraph_support_idx": 1},
            {"id": 2, "question": "what did #1 win", "answer": "a Tony", "paragraph_support_idx": 2},
        ],
        "answer": "a Tony",
        "answer_aliases": ["Tony Award"],
        "answerable": True,
    }
    rec.update(overrides)
    return rec


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_small_record(tmp_path: Path) -> None:
    (ex,) = load_musique(write_jsonl(tmp_path / "d.jsonl", [record()]))
    film, ann = doc_id("Film", "The film stars Ann."), doc_id("Ann", "Ann won a Tony. She sings.")
    assert ex.answers == ["a Tony", "Tony Award"] and ex.hops == 2 and ex.type == "2hop" and ex.dataset == "musique"
    assert ex.supporting_ids == [film, ann]
    assert ex.decomposition is not None
    assert [(s.question, s.answer, s.supporting_ids) for s in ex.decomposition] == [
        ("who stars in Film", "Ann", [film]),
        ("what did #1 win", "a Tony", [ann]),
    ]
    assert ex.metadata == {"answerable": True, "step_ids": [1, 2]}


def test_type_falls_back_to_hop_count(tmp_path: Path) -> None:
    (ex,) = load_musique(write_jsonl(tmp_path / "d.jsonl", [record("custom-7")]))
    assert ex.type == "2hop"


def test_answerable_filter(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl", [record("2hop__a"), record("2hop__b", answerable=False), record("2hop__c")]
    )
    assert [e.id for e in load_musique(path)] == ["2hop__a", "2hop__c"]
    assert [e.id for e in load_musique(path, answerable_only=False)] == ["2hop__a", "2hop__b", "2hop__c"]
    assert [e.id for e in load_musique(path, limit=2)] == ["2hop__a", "2hop__c"]


def test_an_unanswerable_record_may_lack_an_answer(tmp_path: Path) -> None:
    """MuSiQue-Full's contrast questions need no gold answer; an answerable record without one is an error."""
    bare = {k: v for k, v in record("2hop__b", answerable=False, answer_aliases=[]).items() if k != "answer"}
    path = write_jsonl(tmp_path / "d.jsonl", [record("2hop__a"), bare])
    assert [e.answers for e in load_musique(path, answerable_only=False)][1] == []


def test_real_counts_and_hops(examples: list[Example]) -> None:
    assert len(examples) == 55
    assert Counter(e.hops for e in examples) == {2: 30, 3: 21, 4: 4}
    assert all(e.type.startswith(f"{e.hops}hop") for e in examples)
    assert all(len(e.supporting_ids) == e.hops for e in examples)
    assert any(len(e.answers) > 1 for e in examples)  # answer_aliases follow the answer


def test_real_decomposition_placeholders(examples: list[Example]) -> None:
    placeholders = 0
    for e in examples:
        assert e.decomposition is not None and len(e.decomposition) == e.hops
        for j, step in enumerate(e.decomposition, start=1):
            refs = [int(k) for k in re.findall(r"#(\d+)", step.question)]
            assert all(1 <= k < j for k in refs), (e.id, step.question)  # only earlier steps are referenced
            placeholders += len(refs)
            assert len(step.supporting_ids) == 1 and step.supporting_ids[0] in e.supporting_ids
            assert step.answer
        assert e.decomposition[-1].question.count("#") >= 1
    assert placeholders >= 55


def test_real_gold_ids_are_in_the_closed_corpus(examples: list[Example]) -> None:
    corpus = build_corpus("musique", MUSIQUE)
    ids = {d.id for d in corpus}
    assert len(ids) == len(corpus) and 900 <= len(corpus) <= 1100  # about 1k paragraphs (1,037)
    assert all(i in ids for e in examples for i in e.supporting_ids)
    assert all(i in ids for e in examples for s in e.decomposition or [] for i in s.supporting_ids)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (record(question_decomposition=[{"id": 1, "question": "q", "paragraph_support_idx": 9}]), "is not a paragraph"),
        (record(paragraphs=[{"idx": 0, "title": "T"}]), "missing required key 'paragraph_text'"),
        (record(paragraphs="T: text"), "key 'paragraphs' should be list"),
        (record(answerable="yes"), "key 'answerable' should be bool"),
        (record(paragraphs=[record()["paragraphs"][0]] * 2), "repeats idx 0"),
        ({k: v for k, v in record().items() if k != "answer"}, "missing required key 'answer'"),
        (record(answer=" "), "key 'answer' is blank"),
    ],
)
def test_malformed_record_names_file_and_line(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [record(), bad])
    with pytest.raises(DataFormatError, match=message) as info:
        load_musique(path)
    assert info.value.path == str(path) and info.value.line == 2
