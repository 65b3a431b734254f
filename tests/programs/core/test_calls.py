"""Reading a raw completion back into fields: ChatAdapter sections, JSON objects, list fields, salvaged steps."""

from __future__ import annotations

from rolecall.programs.core.calls import completion_texts, default_lm_kwargs, read_list, read_sections, salvage_fields
from rolecall.programs.core.trajectory import Step


def test_read_sections_reads_chat_headers_and_json_objects():
    text = "[[ ## plan ## ]]\n1. a?\n2. b #1?\n\n[[ ## level ## ]]\ndirect\n\n[[ ## completed ## ]]"
    assert read_sections(text, ["plan", "level", "answer"]) == {"plan": "1. a?\n2. b #1?", "level": "direct"}
    assert read_sections('{"action": "edit", "sub_questions": ["x?"]}', ["action", "sub_questions"]) == {
        "action": "edit",
        "sub_questions": '["x?"]',
    }
    assert read_sections("", ["a"]) == {} and read_sections("no headers", ["a"]) == {}


def test_read_list_reads_json_lines_and_cut_off_lists():
    assert read_list('["a", "b"]') == ["a", "b"]
    assert read_list("1. a?\n\n2. b?") == ["1. a?", "2. b?"]
    assert read_list('["a",\n"b"') == ["a", "b"]


def test_salvage_prefers_the_first_attempt_and_reads_every_candidate():
    step = Step(kind="role", role="x", completion="[[ ## answer ## ]]\nlate")
    step.meta["attempts"] = [{"completions": ["[[ ## answer ## ]]\nearly"]}, {"completions": ['{"level": "low"}']}]
    step.meta["completions"] = ["[[ ## answer ## ]]\nlate", "[[ ## note ## ]]\nn"]
    assert completion_texts(step) == [
        "[[ ## answer ## ]]\nearly",
        '{"level": "low"}',
        "[[ ## answer ## ]]\nlate",
        "[[ ## note ## ]]\nn",
    ]
    assert salvage_fields(step, ["answer", "level", "note"]) == {"answer": "early", "level": "low", "note": "n"}
    assert salvage_fields(Step(kind="role", role="x"), ["answer"]) == {}


def test_default_lm_kwargs():
    assert default_lm_kwargs({"plan": 128}) == {"*": {"stop": ["[[ ## completed ## ]]"]}, "plan": {"max_tokens": 128}}
