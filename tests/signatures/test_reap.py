"""REAP role signatures: fields, types, ChatAdapter parsing, and the typed values (sub-tasks, facts, answers)."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError
from pydantic import ValidationError

from rolecall.signatures.reap import (
    FACT_LEVELS,
    REPLAN_ACTIONS,
    DecomposeTaskPlan,
    ExtractStructuredFact,
    FactTuple,
    RepairPlan,
    SubTask,
    SynthesizeFromFacts,
    split_answers,
)


def test_signature_fields():
    assert list(DecomposeTaskPlan.input_fields) == ["question"]
    assert list(DecomposeTaskPlan.output_fields) == ["plan"]
    assert DecomposeTaskPlan.output_fields["plan"].annotation == list[str]
    assert list(ExtractStructuredFact.input_fields) == ["sub_question", "known_facts", "passages"]
    assert list(ExtractStructuredFact.output_fields) == ["statement", "answer", "level", "evidence", "reasoning"]
    assert typing.get_args(ExtractStructuredFact.output_fields["level"].annotation) == FACT_LEVELS
    assert list(RepairPlan.input_fields) == ["question", "sub_question", "fact", "known_facts", "plan"]
    assert list(RepairPlan.output_fields) == ["action", "answer", "sub_questions"]
    assert typing.get_args(RepairPlan.output_fields["action"].annotation) == REPLAN_ACTIONS
    assert list(SynthesizeFromFacts.input_fields) == ["question", "facts"]
    assert list(SynthesizeFromFacts.output_fields) == ["answer"]
    for signature in (DecomposeTaskPlan, ExtractStructuredFact, RepairPlan, SynthesizeFromFacts):
        assert 0 < len(signature.instructions) < 400  # short: the default model has 135M parameters


def test_chat_adapter_parses_typed_outputs():
    adapter = dspy.ChatAdapter()
    plan = adapter.parse(DecomposeTaskPlan, '[[ ## plan ## ]]\n["1. Who? (deps: none)", "2. Where #1? (deps: 1)"]')
    assert plan == {"plan": ["1. Who? (deps: none)", "2. Where #1? (deps: 1)"]}
    text = (
        "[[ ## evidence ## ]]\nShe was born in Varn.\n\n[[ ## reasoning ## ]]\nIt says so.\n\n"
        "[[ ## statement ## ]]\nAda was born in Varn.\n\n[[ ## answer ## ]]\nVarn\n\n[[ ## level ## ]]\nDirectAnswer"
    )
    fact = adapter.parse(ExtractStructuredFact, text)
    assert fact["level"] == "DirectAnswer" and fact["answer"] == "Varn"
    with pytest.raises(AdapterParseError):
        adapter.parse(ExtractStructuredFact, text.replace("DirectAnswer", "direct answer"))
    repair = adapter.parse(
        RepairPlan, '[[ ## action ## ]]\nreplace\n\n[[ ## answer ## ]]\nnone\n\n[[ ## sub_questions ## ]]\n["1. a?"]'
    )
    assert repair == {"action": "replace", "answer": "none", "sub_questions": ["1. a?"]}


def test_sub_task_validation():
    with pytest.raises(ValidationError):
        SubTask(id=0, question="q")
    with pytest.raises(ValidationError):
        SubTask(id=1, question="")


def test_answers_and_facts():
    assert split_answers("Varn; Dellin ; varn; unknown") == ["Varn", "Dellin"]
    assert split_answers("A, B and C") == ["A, B and C"] and split_answers(None) == [] and split_answers("none") == []
    fact = FactTuple(statement="unknown", answer="Varn; Dellin", level="DirectAnswer")
    assert fact.answers == ["Varn", "Dellin"] and fact.brief() == "Varn; Dellin"
    assert FactTuple(statement="Ada was born in Varn.").brief() == "Ada was born in Varn."
    assert FactTuple().brief() == "" and FactTuple().level == "Failed"
