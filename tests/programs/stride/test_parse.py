"""Reading STRIDE's role outputs: the Supervisor's action, the Extractor's facts, and demos fitted to a signature."""

from __future__ import annotations

import dspy

from rolecall.programs.stride.parse import fit_demo, parse_facts, read_action
from rolecall.signatures.stride import ConcretePlan, DirectPlan, ExtractFacts


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


def test_parse_facts_reads_what_the_chat_adapter_parsed():
    text = dspy.ChatAdapter().parse(ExtractFacts, "[[ ## facts ## ]]\n- Ada was born in Varn.\n- Ada wrote X.\n\n")
    assert parse_facts(text["facts"]) == ["Ada was born in Varn.", "Ada wrote X."]


def test_fit_demo_keeps_the_signature_fields_and_marks_its_inputs():
    demo = dspy.Example(question="q", strategy=["s"], sub_questions=["a"]).with_inputs("question")
    direct = fit_demo(demo, DirectPlan)
    assert direct.toDict() == {"question": "q", "sub_questions": ["a"]} and set(direct.inputs().keys()) == {"question"}
    concrete = fit_demo(demo, ConcretePlan)
    assert set(concrete.inputs().keys()) == {"question", "strategy"} and concrete.sub_questions == ["a"]
    assert fit_demo({"question": "q"}, DirectPlan).toDict() == {"question": "q"}
