"""D2Plan role signatures (fields, types, ChatAdapter parsing) and the #A_j placeholder helpers."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from rolecall.programs.d2plan.refs import (
    answer_refs,
    drop_repeats,
    fill_answer_refs,
    has_answer_refs,
    renumber_answer_refs,
    to_answer_refs,
)
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
    assert list(ReasonerStep.input_fields) == ["sub_question", "notes"]
    assert list(ReasonerStep.output_fields) == ["action", "query", "answer"]
    assert typing.get_args(ReasonerStep.output_fields["action"].annotation) == ("search", "answer")
    assert list(ReasonerRefine.input_fields) == ["sub_question", "solved"]
    assert list(ReasonerRefine.output_fields) == ["refined"]
    assert list(ReasonerRevise.input_fields) == ["question", "solved", "failed", "failure"]
    assert ReasonerRevise.output_fields["plan"].annotation == list[str]
    assert list(ReasonerAnswer.input_fields) == ["question", "solved"]
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


def test_answer_refs_reads_the_paper_form_and_what_small_models_write():
    assert answer_refs("Is #A_2 older than #a1 or [person from step 3]?") == [2, 1, 3]
    assert answer_refs("Where was #A 1 born, and #A_1 again, and #2?") == [1, 2]
    assert answer_refs("Who directed #A_12?") == [12]
    assert answer_refs("No references here, #A_0 or #0 neither.") == []
    assert has_answer_refs("Where was #A_1 born?") and not has_answer_refs("Where was Ada born?")


def test_fill_answer_refs():
    answers = {1: "Staekys Granuvell", 2: "unknown", 12: "Twelve"}
    assert fill_answer_refs("In which city was #A_1 born?", answers) == (
        "In which city was Staekys Granuvell born?",
        [],
    )
    assert fill_answer_refs("#A_12 and #A_1", answers) == ("Twelve and Staekys Granuvell", [])
    filled, unresolved = fill_answer_refs("Is #A_2 near #1?", answers)
    assert filled == "Is #A_2 near Staekys Granuvell?" and unresolved == ["#A_2"]
    # a reference to the current or a later sub-question is never filled
    assert fill_answer_refs("Who is #A_1?", answers, before=1) == ("Who is #A_1?", ["#A_1"])


def test_to_answer_refs():
    assert to_answer_refs("What is the population of the city of #2?") == "What is the population of the city of #A_2?"
    assert to_answer_refs("Both #1 and #12") == "Both #A_1 and #A_12"


def test_renumber_answer_refs():
    assert renumber_answer_refs("Is #A_3 near #a2 or [city from step 3]?", {3: 2, 2: 1}) == "Is #A_2 near #A_1 or #A_2?"
    assert renumber_answer_refs("No refs", {1: 2}) == "No refs"


def test_drop_repeats_renumbers_references():
    assert drop_repeats(["a?", "b #A_1?", "b #A_1?"]) == ["a?", "b #A_1?"]
    assert drop_repeats(["Who is X?", "Who is X?", "Where was #A_2 born?", "Where was #A_2 bo"]) == [
        "Who is X?",
        "Where was #A_1 born?",
    ]
    # a revised plan starts at the failed position: earlier references stay, its own move
    assert drop_repeats(["b?", "b?", "c #A_1 #A_3?"], offset=1) == ["b?", "c #A_1 #A_2?"]
    assert drop_repeats(["Where?", "Where"]) == ["Where?", "Where"]  # short texts are never taken as cut repeats
