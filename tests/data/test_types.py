"""Tests for rolecall.data.types: doc_id, Example round trips and the dspy view."""

from __future__ import annotations

import json

from rolecall.data.types import Document, Example, SubStep, doc_id


def test_doc_id_is_stable_and_depends_on_title_and_text() -> None:
    a = doc_id("Paris", "Paris is the capital of France.")
    assert a == doc_id("Paris", "Paris is the capital of France.")
    assert a.startswith("Paris::") and len(a.split("::")[1]) == 8
    assert a != doc_id("Paris", "Paris is a city.")
    assert a != doc_id("Lyon", "Paris is the capital of France.")


def test_example_dict_round_trip_through_json() -> None:
    ex = Example(
        id="q1",
        question="Where was the father of X born?",
        answers=["Cork", "County Cork"],
        supporting_ids=["A::00000000", "B::11111111"],
        decomposition=[SubStep("Who is the father of X?", "Y", ["A::00000000"]), SubStep("Where was #1 born?", "Cork")],
        hops=2,
        type="compositional",
        dataset="2wikimultihopqa",
        metadata={"evidences": [["X", "father", "Y"]]},
    )
    back = Example.from_dict(json.loads(json.dumps(ex.to_dict())))
    assert back == ex
    assert back.answer == "Cork"
    assert back.decomposition is not None and back.decomposition[1].supporting_ids == []


def test_example_defaults_and_empty_answer() -> None:
    ex = Example(id="q", question="?", answers=[])
    assert ex.answer == "" and ex.hops == 1 and ex.decomposition is None and ex.metadata == {}
    assert Example.from_dict(ex.to_dict()) == ex


def test_to_dspy_has_question_as_only_input() -> None:
    ex = Example(id="q", question="Who?", answers=["Ann", "Anne"], supporting_ids=["T::0"], hops=2, type="bridge")
    d = ex.to_dspy()
    assert set(d.inputs().keys()) == {"question"}
    assert d.answer == "Ann" and d.answers == ["Ann", "Anne"] and d.supporting_ids == ["T::0"] and d.hops == 2


def test_document_is_frozen_and_hashable() -> None:
    d = Document(id="T::0", title="T", text="x")
    assert {d: 1}[Document(id="T::0", title="T", text="x")] == 1
