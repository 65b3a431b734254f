"""REAP role signatures (fields, types, ChatAdapter parsing) and the parsers of their flat outputs."""

from __future__ import annotations

import typing

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError
from pydantic import ValidationError

from rolecall.programs.reap.parse import (
    normalize_action,
    normalize_level,
    parse_plan,
    read_list,
    read_sections,
    renumber_refs,
    split_answers,
)
from rolecall.signatures.reap import (
    FACT_LEVELS,
    REPLAN_ACTIONS,
    DecomposeTaskPlan,
    ExtractStructuredFact,
    FactTuple,
    RepairPlan,
    SubTask,
    SynthesizeFromFacts,
)


def test_signature_fields():
    assert list(DecomposeTaskPlan.input_fields) == ["question"]
    assert list(DecomposeTaskPlan.output_fields) == ["plan"]
    assert DecomposeTaskPlan.output_fields["plan"].annotation == list[str]
    assert list(ExtractStructuredFact.input_fields) == ["sub_question", "known_facts", "passages"]
    assert list(ExtractStructuredFact.output_fields) == ["statement", "answer", "level", "evidence", "reasoning"]
    assert typing.get_args(ExtractStructuredFact.output_fields["level"].annotation) == FACT_LEVELS
    assert list(RepairPlan.input_fields) == ["question", "sub_question", "fact", "known_facts", "later_steps"]
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


def test_parse_plan_clean_lines():
    tasks, notes = parse_plan(["1. Who directed Film X? (deps: none)", "2. Where was #1 born? (deps: 1)"])
    assert [(t.id, t.question, t.deps) for t in tasks] == [
        (1, "Who directed Film X?", []),
        (2, "Where was #1 born?", [1]),
    ]
    assert notes == []
    assert [t.line() for t in tasks] == ["1. Who directed Film X? (deps: none)", "2. Where was #1 born? (deps: 1)"]


def test_parse_plan_reads_deps_from_references_and_loose_formats():
    tasks, notes = parse_plan(["Step 1: Who is X?", "Step 2: What of #1? deps: 1", "- 3) Compare [year from step 2]"])
    assert [(t.id, t.question, t.deps) for t in tasks] == [
        (1, "Who is X?", []),
        (2, "What of #1?", [1]),
        (3, "Compare [year from step 2]", [2]),
    ]
    # one item holding several lines, unnumbered lines, no deps clause: deps come from the #k references
    tasks, notes = parse_plan(["Who is X?\nWhere was #1 born?"])
    assert [(t.id, t.deps) for t in tasks] == [(1, []), (2, [1])] and notes == []
    assert [t.id for t in parse_plan("1. a\n2. b #1")[0]] == [1, 2]


def test_parse_plan_renumbers_and_rewrites_references():
    tasks, _ = parse_plan(["3. a?", "5. b of #3? (deps: 3)", "7. c after [year from step 5]"])
    assert [(t.id, t.question, t.deps) for t in tasks] == [
        (1, "a?", []),
        (2, "b of #1?", [1]),
        (3, "c after [year from step 2]", [2]),
    ]
    tasks, notes = parse_plan(["1. a?", "1. b of #1?"])  # repeated ids: positions win
    assert [(t.id, t.deps) for t in tasks] == [(1, []), (2, [1])] and "ids renumbered by position" in notes


def test_parse_plan_keeps_the_plan_acyclic_and_drops_repeats():
    tasks, notes = parse_plan(["1. a? (deps: 2)", "2. b #2 (deps: 1)", "3. a?", "4. c #3 (deps: 3)", "", "none"])
    assert [(t.id, t.question, t.deps) for t in tasks] == [(1, "a?", []), (2, "b #2", [1]), (3, "c #1", [1])]
    assert any("repeated" in n for n in notes)
    assert any("sub-task 1: dependencies [2] dropped" in n for n in notes)
    assert any("sub-task 2: dependencies [2] dropped" in n for n in notes)
    assert parse_plan([]) == ([], []) and parse_plan(["", "unknown"]) == ([], [])


def test_sub_task_validation():
    with pytest.raises(ValidationError):
        SubTask(id=0, question="q")
    with pytest.raises(ValidationError):
        SubTask(id=1, question="")


def test_answers_levels_and_actions():
    assert split_answers("Varn; Dellin ; varn; unknown") == ["Varn", "Dellin"]
    assert split_answers("A, B and C") == ["A, B and C"] and split_answers(None) == [] and split_answers("none") == []
    fact = FactTuple(statement="unknown", answer="Varn; Dellin", level="DirectAnswer")
    assert fact.answers == ["Varn", "Dellin"] and fact.brief() == "Varn; Dellin"
    assert FactTuple(statement="Ada was born in Varn.").brief() == "Ada was born in Varn."
    assert FactTuple().brief() == "" and FactTuple().level == "Failed"
    assert [normalize_level(x) for x in ("DirectAnswer", "direct answer.", "Partial clue", "clue", "", None)] == [
        "DirectAnswer",
        "DirectAnswer",
        "PartialClue",
        "PartialClue",
        "Failed",
        "Failed",
    ]
    assert [normalize_action(x) for x in ("Sufficient.", "edit", "REPLACE it", "retry", None)] == [
        "sufficient",
        "edit",
        "replace",
        None,
        None,
    ]


def test_read_sections_and_lists():
    text = "[[ ## plan ## ]]\n1. a?\n2. b #1?\n\n[[ ## level ## ]]\ndirect\n\n[[ ## completed ## ]]"
    assert read_sections(text, ["plan", "level", "answer"]) == {"plan": "1. a?\n2. b #1?", "level": "direct"}
    assert read_sections('{"action": "edit", "sub_questions": ["x?"]}', ["action", "sub_questions"]) == {
        "action": "edit",
        "sub_questions": '["x?"]',
    }
    assert read_sections("", ["a"]) == {} and read_sections("no headers", ["a"]) == {}
    assert read_list('["a", "b"]') == ["a", "b"]
    assert read_list("1. a?\n\n2. b?") == ["1. a?", "2. b?"]
    assert read_list('["a",\n"b"') == ["a", "b"]  # a cut-off JSON list still gives its items


def test_renumber_refs():
    assert renumber_refs("Where was #1 born, after [year from step 2]? #9", {1: 4, 2: 5}) == (
        "Where was #4 born, after [year from step 5]? #9"
    )
