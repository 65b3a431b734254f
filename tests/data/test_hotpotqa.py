"""Tests for rolecall.data.hotpotqa: both layouts, gold ids against the closed corpus, and malformed records."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rolecall.data.corpus import build_corpus
from rolecall.data.hotpotqa import iter_paragraphs, load_hotpotqa
from rolecall.data.types import Example, doc_id
from rolecall.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
HOTPOT = DATA / "hotpotqa" / "hotpot_dev_distractor_600.jsonl"


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    if not HOTPOT.is_file():
        pytest.skip(f"real HotpotQA subset not found at {HOTPOT} (the shared data folder ../shared/data is absent)")
    return load_hotpotqa(HOTPOT)


def hf_row(qid: str = "q1", **overrides: Any) -> dict[str, Any]:
    """A small Hugging Face-layout HotpotQA row."""
    row = {
        "id": qid,
        "question": "Which city is the capital of the country where X was born?",
        "answer": "Paris",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": {"title": ["X", "France"], "sent_id": [1, 0]},
        "context": {
            "title": ["X", "France", "Noise"],
            "sentences": [["X is a painter.", " X was born in France."], ["Its capital is Paris."], ["Unrelated."]],
        },
    }
    row.update(overrides)
    return row


def to_original(row: dict[str, Any]) -> dict[str, Any]:
    """The same record in the original HotpotQA release layout."""
    ctx, sf = row["context"], row["supporting_facts"]
    return {
        "_id": row["id"],
        "question": row["question"],
        "answer": row["answer"],
        "type": row["type"],
        "level": row["level"],
        "supporting_facts": [[t, i] for t, i in zip(sf["title"], sf["sent_id"], strict=True)],
        "context": [[t, s] for t, s in zip(ctx["title"], ctx["sentences"], strict=True)],
    }


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_small_hf_row(tmp_path: Path) -> None:
    (ex,) = load_hotpotqa(write_jsonl(tmp_path / "d.jsonl", [hf_row()]))
    assert ex.answers == ["Paris"] and ex.hops == 2 and ex.type == "bridge" and ex.dataset == "hotpotqa"
    assert ex.decomposition is None
    x_id = doc_id("X", "X is a painter. X was born in France.")  # sentences stripped, joined with one space
    assert ex.supporting_ids == [x_id, doc_id("France", "Its capital is Paris.")]
    assert ex.metadata["level"] == "hard"
    assert ex.metadata["supporting_facts"] == [["X", 1], ["France", 0]]
    assert ex.metadata["supporting_sentence_ids"][0] == f"{x_id}#s1"


def test_both_layouts_give_equal_examples(tmp_path: Path) -> None:
    rows = [hf_row("a"), hf_row("b", answer="yes", type="comparison")]
    from_hf = load_hotpotqa(write_jsonl(tmp_path / "hf.jsonl", rows))
    original = tmp_path / "hotpot_dev.json"
    original.write_text(json.dumps([to_original(r) for r in rows]), encoding="utf-8")
    assert load_hotpotqa(original) == from_hf
    assert load_hotpotqa(write_jsonl(tmp_path / "orig.jsonl", [to_original(r) for r in rows])) == from_hf


def test_real_rows_in_original_layout_match(examples: list[Example], tmp_path: Path) -> None:
    rows = [json.loads(line) for line in HOTPOT.read_text(encoding="utf-8").splitlines()[:5]]
    original = tmp_path / "orig.json"
    original.write_text(json.dumps([to_original(r) for r in rows]), encoding="utf-8")
    assert load_hotpotqa(original) == examples[:5]


def test_real_counts_and_types(examples: list[Example]) -> None:
    assert len(examples) == 600
    assert Counter(e.type for e in examples) == {"bridge": 468, "comparison": 132}
    assert all(e.hops == 2 and len(e.answers) == 1 and e.metadata["level"] == "hard" for e in examples)
    assert all(len(e.supporting_ids) == 2 for e in examples)
    answers = Counter(e.answer for e in examples)
    assert answers["yes"] > 0 and answers["no"] > 0  # yes/no comparison answers are kept as they are
    assert len({e.id for e in examples}) == 600


def test_real_gold_ids_are_in_the_closed_corpus(examples: list[Example]) -> None:
    corpus = build_corpus("hotpotqa", HOTPOT)
    ids = {d.id for d in corpus}
    assert 5500 <= len(corpus) <= 6500  # about 6k paragraphs after de-duplication (5,913)
    assert len(ids) == len(corpus)
    assert all(i in ids for e in examples for i in e.supporting_ids)
    sentences = {d.id for d in build_corpus("hotpotqa", HOTPOT, level="sentence")}
    assert all(i in sentences for e in examples for i in e.metadata["supporting_sentence_ids"])


def test_limit_and_iter_paragraphs(examples: list[Example]) -> None:
    assert load_hotpotqa(HOTPOT, limit=3) == examples[:3]
    assert load_hotpotqa(HOTPOT, limit=0) == []
    n = sum(1 for _ in iter_paragraphs(HOTPOT))  # up to 10 per question, duplicates included
    assert len(build_corpus("hotpotqa", HOTPOT)) < n <= 6000
    with pytest.raises(ValueError, match="limit"):
        load_hotpotqa(HOTPOT, limit=-1)


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(hf_row("a")) + "\n\n" + '{"id": "b", "question": \n', encoding="utf-8")
    with pytest.raises(DataFormatError, match="invalid JSON") as info:
        load_hotpotqa(path)
    assert info.value.path == str(path) and info.value.line == 3
    assert str(info.value).startswith(f"{path}:3:")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({k: v for k, v in hf_row().items() if k != "question"}, "missing required key 'question'"),
        (hf_row(context="X was born in France."), "key 'context' should be dict or list"),
        (hf_row(question=7), "key 'question' should be str"),
        (hf_row(question=None), "required key 'question' is null"),
        (hf_row(context={"title": ["X"], "sentences": [["a"], ["b"]]}), "parallel lists"),
        (hf_row(context={"title": ["X"], "sentences": ["not a list"]}), "list of strings"),
        ({k: v for k, v in hf_row().items() if k != "answer"}, "missing required key 'answer'"),  # nothing to score
        (hf_row(answer=None), "required key 'answer' is null"),
        (hf_row(answer=" "), "key 'answer' is blank"),
    ],
)
def test_malformed_record_names_file_and_line(tmp_path: Path, row: dict[str, Any], message: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [hf_row("ok"), row])
    with pytest.raises(DataFormatError, match=message) as info:
        load_hotpotqa(path)
    assert info.value.line == 2 and str(path) in str(info.value)


def test_malformed_json_list_names_record_index(tmp_path: Path) -> None:
    bad = to_original(hf_row("b"))
    bad["context"][0] = ["X"]  # no sentence list
    path = tmp_path / "d.json"
    path.write_text(json.dumps([to_original(hf_row("a")), bad]), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"record 1: context\[0\] should be \[title, \[sentences\]\]"):
        load_hotpotqa(path)


def test_supporting_title_missing_from_context_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    row = hf_row(supporting_facts={"title": ["X", "Nowhere"], "sent_id": [0, 0]})
    with caplog.at_level(logging.WARNING, logger="rolecall.data.hotpotqa"):
        (ex,) = load_hotpotqa(write_jsonl(tmp_path / "d.jsonl", [row]))
    assert len(ex.supporting_ids) == 1 and "Nowhere" in caplog.text


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_text("\ufeff" + json.dumps(hf_row()) + "\n", encoding="utf-8")
    assert [e.id for e in load_hotpotqa(path)] == ["q1"]


def test_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_hotpotqa(tmp_path / "absent.jsonl")
