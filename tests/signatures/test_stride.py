"""STRIDE role signatures: fields, types, short instructions and ChatAdapter parsing of their outputs."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from rolecall.signatures.stride import (
    ACTIONS,
    Action,
    DirectPlan,
    ExtractFacts,
    FallbackAnswer,
    MetaPlan,
    ReasonAnswer,
    Supervise,
    parse_facts,
    read_action,
)

SIGNATURES = (MetaPlan, DirectPlan, Supervise, ExtractFacts, ReasonAnswer, FallbackAnswer)


def test_signature_fields():
    assert list(MetaPlan.input_fields) == ["question"]
    assert list(MetaPlan.output_fields) == ["strategy", "sub_questions"]
    assert MetaPlan.output_fields["strategy"].annotation == list[str]
    assert list(DirectPlan.output_fields) == ["sub_questions"]
    assert list(Supervise.input_fields) == ["question", "progress", "sub_question", "failed_queries"]
    assert list(Supervise.output_fields) == ["action", "query"]
    assert ACTIONS == typing.get_args(Action) and Supervise.output_fields["action"].annotation is str
    assert list(ExtractFacts.input_fields) == ["query", "passages"]
    assert ExtractFacts.output_fields["facts"].annotation is str
    assert list(ReasonAnswer.input_fields) == ["sub_question", "facts"] and list(ReasonAnswer.output_fields) == [
        "answer"
    ]
    assert list(FallbackAnswer.input_fields) == ["question", "plan", "facts", "passages"]
    for signature in SIGNATURES:
        assert 0 < len(signature.instructions) < 400  # short: the default model has 135M parameters
    assert "strategy" not in DirectPlan.instructions.lower() and "type" in MetaPlan.instructions


def test_chat_adapter_parses_the_outputs():
    adapter = dspy.ChatAdapter()
    blueprint = adapter.parse(
        MetaPlan,
        '[[ ## strategy ## ]]\n["Find the director of the film", "Find where the person was born"]\n\n'
        '[[ ## sub_questions ## ]]\n["Who directed X?", "Where was [person from step 1] born?"]\n\n'
        "[[ ## completed ## ]]",
    )
    assert blueprint["sub_questions"][1] == "Where was [person from step 1] born?" and len(blueprint["strategy"]) == 2
    directive = adapter.parse(Supervise, "[[ ## action ## ]]\nrewrite\n\n[[ ## query ## ]]\nAda Quell\n\n")
    assert directive == {"action": "rewrite", "query": "Ada Quell"}
    with pytest.raises(AdapterParseError):  # a missing field is still a parse failure
        adapter.parse(Supervise, "[[ ## action ## ]]\nrewrite\n\n")
    facts = adapter.parse(ExtractFacts, "[[ ## facts ## ]]\n- Ada was born in Varn.\n- Ada wrote X.\n\n")["facts"]
    assert parse_facts(facts) == ["Ada was born in Varn.", "Ada wrote X."]


def test_read_action_and_parse_facts():
    assert [read_action(t) for t in ("retrieve", " Rewrite.", "answer: compare", "search", "", None)] == [
        "retrieve",
        "rewrite",
        "answer",
        None,
        None,
        None,
    ]
    assert parse_facts("1. A is B.\n[2] C is D.\n* A is B.\n\nNone") == ["A is B.", "C is D."]
    assert parse_facts("none") == [] and parse_facts(None) == []
