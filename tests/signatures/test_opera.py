"""OPERA role signatures (fields, types, ChatAdapter parsing) and the placeholder helpers."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from rolecall.programs.core.plan import SubGoal, fill_placeholders, find_placeholders, hash_refs_to_placeholders
from rolecall.signatures import AnalyzeAnswer, PlanSubGoals, RewriteQuery, SynthesizeAnswer, is_null_answer


def test_signature_fields():
    assert list(PlanSubGoals.input_fields) == ["question"] and list(PlanSubGoals.output_fields) == ["sub_goals"]
    assert PlanSubGoals.output_fields["sub_goals"].annotation == list[str]
    assert list(AnalyzeAnswer.input_fields) == ["sub_goal", "passages"]
    assert list(AnalyzeAnswer.output_fields) == ["sufficient", "answer", "confidence", "missing_information"]
    assert typing.get_args(AnalyzeAnswer.output_fields["sufficient"].annotation) == ("yes", "no")
    assert typing.get_args(AnalyzeAnswer.output_fields["confidence"].annotation) == ("high", "medium", "low")
    assert list(RewriteQuery.input_fields) == ["sub_goal", "passages", "missing_information"]
    assert list(RewriteQuery.output_fields) == ["query"]
    assert list(SynthesizeAnswer.input_fields) == ["question", "evidence"]
    for signature in (PlanSubGoals, AnalyzeAnswer, RewriteQuery, SynthesizeAnswer):
        assert 0 < len(signature.instructions) < 300  # short: the default model has 135M parameters


def test_chat_adapter_parses_typed_outputs():
    adapter = dspy.ChatAdapter()
    plan = adapter.parse(
        PlanSubGoals, '[[ ## sub_goals ## ]]\n["Who directed X?", "Where was [person from step 1] born?"]'
    )
    assert plan["sub_goals"] == ["Who directed X?", "Where was [person from step 1] born?"]
    text = (
        "[[ ## sufficient ## ]]\nyes\n\n[[ ## answer ## ]]\nVarn\n\n[[ ## confidence ## ]]\nhigh\n\n"
        "[[ ## missing_information ## ]]\nnone\n\n[[ ## completed ## ]]"
    )
    assert adapter.parse(AnalyzeAnswer, text) == {
        "sufficient": "yes",
        "answer": "Varn",
        "confidence": "high",
        "missing_information": "none",
    }
    with pytest.raises(AdapterParseError):
        adapter.parse(AnalyzeAnswer, text.replace("\nyes\n", "\nmaybe\n"))


def test_find_placeholders():
    found = find_placeholders("Is [location from step 2] older than #1 or [ entity  from step 3 ]?")
    assert [(p.type, p.step) for p in found] == [("location", 2), ("entity", 1), ("entity", 3)]
    assert SubGoal.parse("Who founded [company from step 1] and #1?", 2).dependencies == [1]
    assert find_placeholders("No references, #0 is not one.") == []


def test_fill_placeholders():
    answers = {1: "Totom Pictures", 2: "unknown"}
    assert fill_placeholders("Who founded [company from step 1]?", answers) == ("Who founded Totom Pictures?", [])
    filled, unresolved = fill_placeholders("Where is [city from step 2] near #1?", answers)
    assert filled == "Where is [city from step 2] near Totom Pictures?" and unresolved == ["[city from step 2]"]
    # a reference to the current or a later step is never filled
    assert fill_placeholders("[entity from step 1]", answers, before=1) == (
        "[entity from step 1]",
        ["[entity from step 1]"],
    )


def test_hash_refs_to_placeholders():
    assert hash_refs_to_placeholders("Who is in both #1 and #2?", {1: "A", 2: "1953"}) == (
        "Who is in both [entity from step 1] and [year from step 2]?"
    )


def test_is_null_answer():
    assert is_null_answer("") and is_null_answer(" Unknown. ") and is_null_answer(None) and is_null_answer("N/A")
    assert not is_null_answer("Varn")
