"""MultiAgent-OPD team signatures: fields and types, role prompts, and ChatAdapter parsing of the typed outputs."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from rolecall.signatures.team import ROLE_PROMPTS, AnswerFromReports, DelegateOrAnswer, SearchOrReport

SIGNATURES = {"leader": DelegateOrAnswer, "searcher": SearchOrReport, "answerer": AnswerFromReports}


def test_signature_fields_and_types():
    assert list(DelegateOrAnswer.input_fields) == ["question", "reports"]
    assert list(DelegateOrAnswer.output_fields) == ["action", "selected", "subtasks"]  # lists of questions last
    assert typing.get_args(DelegateOrAnswer.output_fields["action"].annotation) == ("delegate", "answer")
    assert DelegateOrAnswer.output_fields["subtasks"].annotation == list[str]
    assert DelegateOrAnswer.output_fields["selected"].annotation == list[int]
    assert list(SearchOrReport.input_fields) == ["subtask", "notes"]
    assert list(SearchOrReport.output_fields) == ["action", "content"]
    assert typing.get_args(SearchOrReport.output_fields["action"].annotation) == ("search", "report")
    assert list(AnswerFromReports.input_fields) == ["question", "reports"]
    assert list(AnswerFromReports.output_fields) == ["answer"]


@pytest.mark.parametrize("role", sorted(SIGNATURES))
def test_instructions_open_with_the_role_prompt(role):
    instructions = SIGNATURES[role].instructions
    assert instructions.startswith(ROLE_PROMPTS[role])
    assert len(instructions) < 400  # short: the default model has 135M parameters
    others = [p for r, p in ROLE_PROMPTS.items() if r != role]
    assert not any(p in instructions for p in others)


def test_chat_adapter_parses_leader_outputs():
    adapter = dspy.ChatAdapter()
    text = (
        "[[ ## action ## ]]\ndelegate\n\n[[ ## selected ## ]]\n[]\n\n"
        '[[ ## subtasks ## ]]\n["Who directed X?", "Who directed Y?"]\n\n[[ ## completed ## ]]'
    )
    assert adapter.parse(DelegateOrAnswer, text) == {
        "action": "delegate",
        "subtasks": ["Who directed X?", "Who directed Y?"],
        "selected": [],
    }
    answer = "[[ ## action ## ]]\nanswer\n\n[[ ## selected ## ]]\n[1, 3]\n\n[[ ## subtasks ## ]]\n[]"
    assert adapter.parse(DelegateOrAnswer, answer)["selected"] == [1, 3]
    with pytest.raises(AdapterParseError):
        adapter.parse(DelegateOrAnswer, answer.replace("\nanswer\n", "\nstop\n"))
    with pytest.raises(AdapterParseError):
        adapter.parse(DelegateOrAnswer, answer.replace("[1, 3]", '["one"]'))


def test_chat_adapter_parses_searcher_outputs():
    adapter = dspy.ChatAdapter()
    text = "[[ ## action ## ]]\nreport\n\n[[ ## content ## ]]\nVarn (from Ada Quell)\n\n[[ ## completed ## ]]"
    assert adapter.parse(SearchOrReport, text) == {"action": "report", "content": "Varn (from Ada Quell)"}
    with pytest.raises(AdapterParseError):
        adapter.parse(SearchOrReport, text.replace("\nreport\n", "\nanswer\n"))
