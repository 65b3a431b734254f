"""D2Plan role signatures: fields, types, ChatAdapter parsing (the #A_j helpers: tests/programs/d2plan/test_refs.py)."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from rolecall.signatures.d2plan import (
    Purify,
    ReasonerAnswer,
    ReasonerPlan,
    ReasonerRefine,
    ReasonerRevise,
    ReasonerStep,
)

SIGNATURES = (ReasonerPlan, ReasonerStep, ReasonerRefine, ReasonerRevise, ReasonerAnswer, Purify)


def test_signature_fields():
    assert list(ReasonerPlan.input_fields) == ["question"]
    assert list(ReasonerPlan.output_fields) == ["complexity", "plan"]
    assert typing.get_args(ReasonerPlan.output_fields["complexity"].annotation) == ("single-hop", "multi-hop")
    assert ReasonerPlan.output_fields["plan"].annotation == list[str]
    assert list(ReasonerStep.input_fields) == ["question", "context", "sub_question", "notes"]
    assert list(ReasonerStep.output_fields) == ["action", "query", "answer"]
    assert typing.get_args(ReasonerStep.output_fields["action"].annotation) == ("search", "answer")
    assert list(ReasonerRefine.input_fields) == ["question", "context", "sub_question"]
    assert list(ReasonerRefine.output_fields) == ["refined"]
    assert list(ReasonerRevise.input_fields) == ["question", "context", "failed", "failure"]
    assert ReasonerRevise.output_fields["plan"].annotation == list[str]
    assert list(ReasonerAnswer.input_fields) == ["question", "context"]
    assert list(Purify.input_fields) == ["sub_question", "passages"]
    assert list(Purify.output_fields) == ["relevant", "information"]
    assert typing.get_args(Purify.output_fields["relevant"].annotation) == ("yes", "no")
    for signature in SIGNATURES:
        assert 0 < len(signature.instructions) < 300  # short: the default model has 135M parameters


def test_chat_adapter_parses_typed_outputs():
    adapter = dspy.ChatAdapter()
    text = '[[ ## complexity ## ]]\nmulti-hop\n\n[[ ## plan ## ]]\n["Who directed X?", "Where was #A_1 born?"]'
    assert adapter.parse(ReasonerPlan, text) == {
        "complexity": "multi-hop",
        "plan": ["Who directed X?", "Where was #A_1 born?"],
    }
    step = "[[ ## action ## ]]\nanswer\n\n[[ ## query ## ]]\nnone\n\n[[ ## answer ## ]]\nVarn\n\n[[ ## completed ## ]]"
    assert adapter.parse(ReasonerStep, step) == {"action": "answer", "query": "none", "answer": "Varn"}
    with pytest.raises(AdapterParseError):
        adapter.parse(ReasonerStep, step.replace("\nanswer\n\n[[ ## query", "\nmaybe\n\n[[ ## query"))
    purified = "[[ ## relevant ## ]]\nno\n\n[[ ## information ## ]]\npassages about Varn"
    assert adapter.parse(Purify, purified) == {"relevant": "no", "information": "passages about Varn"}
