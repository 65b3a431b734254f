"""Tests for rolecall.data.twowiki: hops by supporting titles, evidences, aliases and malformed records."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rolecall.data.corpus import build_corpus
from rolecall.data.twowiki import HOPS_BY_TYPE, load_twowiki
from rolecall.data.types import Example, SubStep, doc_id
from rolecall.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
TWOWIKI = DATA / "2wikimultihopqa" / "2wiki_dev_243.json"


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    if not TWOWIKI.is_file():
        pytest.skip(f"real 2WikiMultihopQA subset not found at {TWOWIKI} (the shared data folder is absent)")
    return load_twowiki(TWOWIKI)


def record(qid: str = "w1", **overrides: Any) -> dict[str, Any]:
    """A small official-layout 2WikiMultihopQA record."""
    rec = {
        "_id": qid,
        "type": "compositional",
        "question": "Where was the father of X buried?",
        "context": [
            ["X", ["X was a barrister.", "His father was Y."]],
            ["Y", ["Y was buried in Cork."]],
            ["Z", ["Z."]],
        ],
        "supporting_facts": [["X", 1], ["Y", 0]],
        "evidences": [["X", "father", "Y"], ["Y", "place of burial", "Cork"]],
        "answer": "Cork",
    }
    rec.update(overrides)
    return rec


def write_list(path: Path, records: list[Any]) -> Path:
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def test_small_record(tmp_path: Path) -> None:
    (ex,) = load_twowiki(write_list(tmp_path / "d.json", [record()]))
    assert ex.id == "w1" and ex.answers == ["Cork"] and ex.type == "compositional" and ex.hops == 2
    assert ex.dataset == "2wikimultihopqa"
    assert ex.supporting_ids == [
        doc_id("X", "X was a barrister. His father was Y."),
        doc_id("Y", "Y was buried in Cork."),
    ]
    assert ex.decomposition == [
        SubStep("Who is the father of X?", "Y", [ex.supporting_ids[0]]),
        SubStep("What is the place of burial of #1?", "Cork", [ex.supporting_ids[1]]),
    ]
    assert ex.metadata["evidences"] == [["X", "father", "Y"], ["Y", "place of burial", "Cork"]]


def test_aliases_follow_the_answer(tmp_path: Path) -> None:
    path = write_list(
        tmp_path / "d.json", [record(answer_aliases=["County Cork", "Cork"]), record("w2", aliases=["C"])]
    )
    a, b = load_twowiki(path)
    assert a.answers == ["Cork", "County Cork"] and b.answers == ["Cork", "C"]


def test_hops_fall_back_to_type_table_without_supporting_facts(tmp_path: Path) -> None:
    (ex,) = load_twowiki(write_list(tmp_path / "d.json", [record(type="bridge_comparison", supporting_facts=[])]))
    assert ex.hops == HOPS_BY_TYPE["bridge_comparison"] == 4 and ex.supporting_ids == []


def test_real_counts_hops_and_types(examples: list[Example]) -> None:
    assert len(examples) == 243
    assert Counter(e.type for e in examples) == {
        "compositional": 96,
        "bridge_comparison": 69,
        "comparison": 48,
        "inference": 30,
    }
    # Distinct supporting titles agree with the paper's per-type convention on the whole dev subset.
    assert all(e.hops == HOPS_BY_TYPE[e.type] == len(e.supporting_ids) for e in examples)
    assert all(e.metadata["evidences"] and e.answers for e in examples)


def test_real_gold_ids_are_in_the_closed_corpus(examples: list[Example]) -> None:
    corpus = build_corpus("2wiki", TWOWIKI)
    ids = {d.id for d in corpus}
    assert len(ids) == len(corpus) and 1000 < len(corpus) < 2430
    assert all(i in ids for e in examples for i in e.supporting_ids)
    sentences = {d.id for d in build_corpus("twowiki", TWOWIKI, level="sentence")}
    assert all(i in sentences for e in examples for i in e.metadata["supporting_sentence_ids"])


def test_duplicate_titles_in_context_load(tmp_path: Path) -> None:
    ctx = [["X", ["First X."]], ["X", ["Second X.", "More."]], ["Y", ["Y."]]]
    (ex,) = load_twowiki(write_list(tmp_path / "d.json", [record(context=ctx, supporting_facts=[["X", 1], ["Y", 0]])]))
    assert ex.supporting_ids == [doc_id("X", "Second X. More."), doc_id("Y", "Y.")]  # the X that has sentence 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (record(supporting_facts=[["X", "one"]]), r"supporting_facts\[0\] should be \[title, sent_id\]"),
        (record(evidences="X father Y"), "key 'evidences' should be list"),
        (record(answer_aliases="Cork"), "key 'answer_aliases' should be a list of strings"),
        ({k: v for k, v in record().items() if k != "context"}, "missing required key 'context'"),
        ({k: v for k, v in record().items() if k != "answer"}, "missing required key 'answer'"),
        (record(answer=""), "key 'answer' is blank"),
    ],
)
def test_malformed_record_names_file_and_index(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    path = write_list(tmp_path / "d.json", [record("ok"), record("ok2"), bad])
    with pytest.raises(DataFormatError, match=message) as info:
        load_twowiki(path)
    assert str(info.value).startswith(f"{path}: record 2: ")


def test_not_a_list_of_objects(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="record 1: expected a JSON object"):
        load_twowiki(write_list(tmp_path / "d.json", [record(), "oops"]))
    (tmp_path / "e.json").write_text("[\n" + json.dumps(record()) + ",\n{oops}\n]", encoding="utf-8")
    with pytest.raises(DataFormatError, match="invalid JSON") as info:
        load_twowiki(tmp_path / "e.json")
    assert info.value.line == 3
