"""STRIDE role signatures: fields, types, short instructions and ChatAdapter parsing of their outputs."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from rolecall.signatures.stride import (
    ACTIONS,
    Action,
    ConcretePlan,
    DirectPlan,
    ExtractFacts,
    FallbackAnswer,
    MetaPlan,
    ReasonAnswer,
    Supervise,
)

SIGNATURES = (MetaPlan, ConcretePlan, DirectPlan, Supervise, ExtractFacts, ReasonAnswer, FallbackAnswer)


def test_signature_fields():
    assert list(MetaPlan.input_fields) == ["question"] and list(MetaPlan.output_fields) == ["steps"]
    assert MetaPlan.output_fields["steps"].annotation == list[str]
    assert list(ConcretePlan.input_fields) == ["question", "strategy"]  # the plan instantiates the strategy
    assert ConcretePlan.input_fields["strategy"].annotation == list[str]
    assert list(ConcretePlan.output_fields) == ["sub_questions"]
    assert list(DirectPlan.input_fields) == ["question"] and list(DirectPlan.output_fields) == ["sub_questions"]
    assert list(Supervise.input_fields) == ["question", "progress", "sub_question", "failed_queries"]
    assert list(Supervise.output_fields) == ["action", "query"]
    assert ACTIONS == typing.get_args(Action) and Supervise.output_fields["action"].annotation is str
    assert list(ExtractFacts.input_fields) == ["query", "passages"]
    assert ExtractFacts.output_fields["facts"].annotation is str
    assert list(ReasonAnswer.input_fields) == ["sub_question", "facts"] and list(ReasonAnswer.output_fields) == [
        "answer"
    ]
    assert list(FallbackAnswer.input_fields) == ["question", "plan", "facts", "passages"]
    assert "strategy" in FallbackAnswer.input_fields["plan"].json_schema_extra["desc"]
    for signature in SIGNATURES:
        assert 0 < len(signature.instructions) < 400  # short: the default model has 135M parameters
    assert "strategy" not in DirectPlan.instructions.lower() and "type" in MetaPlan.instructions
    assert "strategy" in ConcretePlan.instructions


def test_chat_adapter_parses_the_outputs():
    adapter = dspy.ChatAdapter()
    strategy = adapter.parse(
        MetaPlan, '[[ ## steps ## ]]\n["Find the director of the film", "Find where the person was born"]\n\n'
    )
    assert len(strategy["steps"]) == 2
    plan = adapter.parse(
        ConcretePlan,
        '[[ ## sub_questions ## ]]\n["Who directed X?", "Where was [person from step 1] born?"]\n\n'
        "[[ ## completed ## ]]",
    )
    assert plan["sub_questions"][1] == "Where was [person from step 1] born?"
    directive = adapter.parse(Supervise, "[[ ## action ## ]]\nrewrite\n\n[[ ## query ## ]]\nAda Quell\n\n")
    assert directive == {"action": "rewrite", "query": "Ada Quell"}
    with pytest.raises(AdapterParseError):  # a missing field is still a parse failure
        adapter.parse(Supervise, "[[ ## action ## ]]\nrewrite\n\n")
    facts = adapter.parse(ExtractFacts, "[[ ## facts ## ]]\n- Ada was born in Varn.\n- Ada wrote X.\n\n")["facts"]
    assert facts == "- Ada was born in Varn.\n- Ada wrote X."


def test_the_strategy_is_shown_to_the_plan_step():
    messages = dspy.ChatAdapter().format(ConcretePlan, [], {"question": "q?", "strategy": ["Find the person."]})
    assert "[[ ## strategy ## ]]" in messages[-1]["content"] and "Find the person." in messages[-1]["content"]
