"""Tests for rolecall.data.flashrag: datasets and corpora read, written and read back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolecall.data.corpus import build_corpus, load_dataset
from rolecall.data.flashrag import (
    join_contents,
    load_flashrag,
    load_flashrag_corpus,
    split_contents,
    write_flashrag,
    write_flashrag_corpus,
)
from rolecall.data.hotpotqa import load_hotpotqa
from rolecall.data.musique import load_musique
from rolecall.data.twowiki import load_twowiki
from rolecall.data.types import Document, Example, SubStep
from rolecall.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
REAL = {
    "hotpotqa": (load_hotpotqa, DATA / "hotpotqa" / "hotpot_dev_distractor_600.jsonl"),
    "2wiki": (load_twowiki, DATA / "2wikimultihopqa" / "2wiki_dev_243.json"),
    "musique": (load_musique, DATA / "musique" / "musique_ans_dev_55.jsonl"),
}


def toy_example() -> Example:
    return Example(
        id="t1",
        question="What did the star of Film win?",
        answers=["a Tony", "Tony Award"],
        supporting_ids=["Film::00000001", "Ann::00000002"],
        decomposition=[SubStep("who stars in Film", "Ann", ["Film::00000001"]), SubStep("what did #1 win", "a Tony")],
        hops=2,
        type="2hop",
        dataset="synthetic",
        metadata={"seed": 0, "names": ["Ann"]},
    )


def test_example_round_trip(tmp_path: Path) -> None:
    plain = Example(id="t2", question="Q?", answers=["A"])
    assert write_flashrag([toy_example(), plain], tmp_path / "d.jsonl") == 2
    assert load_flashrag(tmp_path / "d.jsonl") == [toy_example(), plain]
    first = json.loads((tmp_path / "d.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"id", "question", "golden_answers", "metadata"}
    assert first["golden_answers"] == ["a Tony", "Tony Award"] and first["metadata"]["hops"] == 2


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_round_trip(tmp_path: Path, name: str) -> None:
    loader, path = REAL[name]
    if not path.is_file():
        pytest.skip(f"real {name} subset not found at {path} (the shared data folder is absent)")
    examples = loader(path, limit=40)
    write_flashrag(examples, tmp_path / "d.jsonl")
    assert load_flashrag(tmp_path / "d.jsonl") == examples
    assert load_dataset(tmp_path / "d.jsonl") == examples  # detected as FlashRAG


def test_real_corpus_round_trip(tmp_path: Path) -> None:
    path = REAL["musique"][1]
    if not path.is_file():
        pytest.skip(f"real MuSiQue subset not found at {path} (the shared data folder is absent)")
    docs = build_corpus("musique", path)
    assert write_flashrag_corpus(docs, tmp_path / "c.jsonl") == len(docs)
    assert load_flashrag_corpus(tmp_path / "c.jsonl") == docs
    assert build_corpus("flashrag", tmp_path / "c.jsonl") == docs  # ids re-derived from (title, text) agree


def test_native_flashrag_records(tmp_path: Path) -> None:
    row = {"id": "test_0", "question": "Q?", "golden_answers": ["A"], "metadata": {"type": "bridge", "level": "hard"}}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({"id": 7, "question": "R?", "golden_answers": ["B"]}) + "\n")
    a, b = load_flashrag(path)
    assert (a.id, a.type, a.hops, a.dataset, a.metadata) == ("test_0", "bridge", 1, "flashrag", {"level": "hard"})
    assert (b.id, b.answers, b.metadata) == ("7", ["B"], {})
    with path.open("a", encoding="utf-8") as f:  # a question without a gold answer could not be scored
        f.write(json.dumps({"id": 8, "question": "S?", "golden_answers": []}) + "\n")
    with pytest.raises(DataFormatError, match=f"{path}:3: key 'golden_answers' should be a non-empty list"):
        load_flashrag(path)


@pytest.mark.parametrize(
    ("contents", "expected"),
    [
        ('"Paris"\nParis is the capital.', ("Paris", "Paris is the capital.")),
        ("Paris\nline one\nline two", ("Paris", "line one\nline two")),
        ('""Quoted""\ntext', ('"Quoted"', "text")),
        ('""\ntext', ("", "text")),
        ("no title at all", ("", "no title at all")),
    ],
)
def test_split_contents(contents: str, expected: tuple[str, str]) -> None:
    assert split_contents(contents) == expected


@pytest.mark.parametrize("title", ["Paris", '"Quoted"', "", '"', "with\ttab"])
def test_contents_round_trip(title: str) -> None:
    assert split_contents(join_contents(title, "text\nmore")) == (title, "text\nmore")


def test_title_with_newline_cannot_be_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="newline"):
        write_flashrag_corpus([Document(id="x", title="a\nb", text="t")], tmp_path / "c.jsonl")


def test_corpus_with_title_and_text_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": 3, "title": "T", "text": "body"}) + "\n", encoding="utf-8")
    assert load_flashrag_corpus(path) == [Document(id="3", title="T", text="body")]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"id": "x", "question": "Q?"}, "missing required key 'golden_answers'"),
        ({"id": "x", "question": "Q?", "golden_answers": "A"}, "key 'golden_answers' should be list"),
        ({"id": "x", "question": "Q?", "golden_answers": []}, "should be a non-empty list of non-blank"),
        ({"id": "x", "question": "Q?", "golden_answers": [""]}, "should be a non-empty list of non-blank"),
        ({"id": "x", "question": "Q?", "golden_answers": ["A"], "metadata": {"hops": "2"}}, "key 'hops' should be int"),
        ({"id": "x", "question": "Q?", "golden_answers": ["A"], "metadata": {"decomposition": [1]}}, "decomposition"),
    ],
)
def test_malformed_dataset_line(tmp_path: Path, line: dict, message: str) -> None:
    path = tmp_path / "d.jsonl"
    write_flashrag([toy_example()], path)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    with pytest.raises(DataFormatError, match=message) as info:
        load_flashrag(path)
    assert info.value.line == 2 and str(info.value).startswith(f"{path}:2:")


def test_malformed_corpus_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "\\"A\\"\\ntext"}\n{"id": "b"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match="missing required key 'contents'") as info:
        load_flashrag_corpus(path)
    assert info.value.line == 2
