"""The plan graph: one reference grammar for #j, #A_j and [type from step j], filling, renumbering, the ready set."""

from __future__ import annotations

import pytest

from rolecall.programs.core.plan import (
    PlanGraph,
    dependencies,
    drop_repeats,
    fill_references,
    find_placeholders,
    find_references,
    hash_refs_to_placeholders,
    renumber_references,
    to_answer_refs,
)


def test_every_dialect_is_read_in_position_order():
    text = "Is #A_2 older than #1, [person from step 3], #a4 or #A 5?"
    assert [(r.step, r.type) for r in find_references(text)] == [
        (2, "entity"),
        (1, "entity"),
        (3, "person"),
        (4, "entity"),
        (5, "entity"),
    ]
    assert find_references("no refs, step 0: #0") == []
    assert dependencies("#2 and #A_2 and #1") == [2, 1]
    assert [p.step for p in find_placeholders("Who directed [film from step 1] with #2?")] == [1, 2]


def test_fill_respects_null_answers_and_before():
    answers = {1: "Ada Quell", 2: "unknown", 3: "Varn"}
    filled, left = fill_references("#1 met [person from step 2] in #A_3", answers, before=3)
    assert filled == "Ada Quell met [person from step 2] in #A_3"
    assert left == ["[person from step 2]", "#A_3"]


def test_renumber_keeps_each_form_or_writes_one():
    text = "Where was #3 born, after [year from step 2], near #A_3?"
    assert renumber_references(text, {3: 1, 2: 2}) == "Where was #1 born, after [year from step 2], near #A_1?"
    assert renumber_references(text, {3: 1}, style="hash") == "Where was #1 born, after #2, near #1?"
    assert to_answer_refs("the city of #2") == "the city of #A_2"
    assert hash_refs_to_placeholders("born in #1", {1: "1901"}) == "born in [year from step 1]"


def test_drop_repeats_renumbers_later_references():
    items = ["Who is X?", "Who is X?", "Where was #2 born?", "Who married #3?"]
    assert drop_repeats(items) == ["Who is X?", "Where was #1 born?", "Who married #2?"]
    assert drop_repeats(["a", "b"]) == ["a", "b"]


def test_plan_graph_ready_set_filling_and_invalid_references():
    plan, dropped = PlanGraph.from_texts(["Who directed X?", "Where was #1 born?", "Is #3 or #4 older?", "When?"])
    assert dropped == ["3->3", "3->4"]
    assert [s.depends_on for s in plan.steps] == [(), (1,), (), ()]
    assert plan.ready() == [1, 3, 4]
    plan.resolve(1, " Ada Quell ")
    assert plan.ready() == [2, 3, 4] and plan.filled(2) == "Where was Ada Quell born?"
    for step_id in (2, 3, 4):
        plan.resolve(step_id, "x")
    assert plan.finished and plan.pending == []
    with pytest.raises(ValueError, match="null answer"):
        plan.resolve(1, "unknown")
