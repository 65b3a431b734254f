"""D2Plan's ``#A_j`` answer placeholders through :mod:`rolecall.programs.core.plan` (the dialect D2Plan's plans use,
and the ``#j`` / ``[type from step j]`` forms small models write instead)."""

from __future__ import annotations

from rolecall.programs.core.plan import (
    PlanGraph,
    dependencies,
    drop_repeats,
    fill_references,
    find_references,
    renumber_references,
    to_answer_refs,
)


def test_references_read_the_paper_form_and_what_small_models_write():
    assert dependencies("Is #A_2 older than #a1 or [person from step 3]?") == [2, 1, 3]
    assert dependencies("Where was #A 1 born, and #A_1 again, and #2?") == [1, 2]
    assert dependencies("Who directed #A_12?") == [12]
    assert dependencies("No references here, #A_0 or #0 neither.") == []
    assert find_references("Where was #A_1 born?") and not find_references("Where was Ada born?")


def test_fill_references():
    answers = {1: "Staekys Granuvell", 2: "unknown", 12: "Twelve"}
    assert fill_references("In which city was #A_1 born?", answers) == ("In which city was Staekys Granuvell born?", [])
    assert fill_references("#A_12 and #A_1", answers) == ("Twelve and Staekys Granuvell", [])
    filled, unresolved = fill_references("Is #A_2 near #1?", answers)
    assert filled == "Is #A_2 near Staekys Granuvell?" and unresolved == ["#A_2"]
    # a reference to the current or a later sub-question is never filled
    assert fill_references("Who is #A_1?", answers, before=1) == ("Who is #A_1?", ["#A_1"])


def test_to_answer_refs():
    assert to_answer_refs("What is the population of the city of #2?") == "What is the population of the city of #A_2?"
    assert to_answer_refs("Both #1 and #12") == "Both #A_1 and #A_12"


def test_renumber_references_as_answer_refs():
    text = "Is #A_3 near #a2 or [city from step 3]?"
    assert renumber_references(text, {3: 2, 2: 1}, style="answer_ref") == "Is #A_2 near #A_1 or #A_2?"
    assert renumber_references("No refs", {1: 2}, style="answer_ref") == "No refs"


def test_drop_repeats_renumbers_references():
    assert drop_repeats(["a?", "b #A_1?", "b #A_1?"], style="answer_ref") == ["a?", "b #A_1?"]
    assert drop_repeats(
        ["Who is X?", "Who is X?", "Where was #A_2 born?", "Where was #A_2 bo"], style="answer_ref"
    ) == ["Who is X?", "Where was #A_1 born?"]
    # a revised plan starts at the failed position: earlier references stay, its own move
    assert drop_repeats(["b?", "b?", "c #A_1 #A_3?"], offset=1, style="answer_ref") == ["b?", "c #A_1 #A_2?"]
    assert drop_repeats(["Where?", "Where"], style="answer_ref") == ["Where?", "Where"]  # short: never a cut repeat
    assert drop_repeats(["x #1?", "x #1?", "y [city from step 3]?"], style="answer_ref") == ["x #A_1?", "y #A_2?"]


def test_plan_graph_gives_d2plans_skip_rule():
    """A sub-question runs when it is in the ready set: each ``#A_j`` it needs (j before it) is solved; a reference
    to itself or a later position is no dependency (it stays unfilled)."""
    plan, dropped = PlanGraph.from_texts(["Who directed X?", "Where was #A_1 born?", "Is #A_3 near #A_1?"])
    assert dropped == ["3->3"] and [s.depends_on for s in plan.steps] == [(), (1,), (1,)]
    assert plan.ready() == [1]
    plan.resolve(1, "Ada Quell")
    assert plan.ready() == [2, 3] and plan.filled(3) == "Is #A_3 near Ada Quell?"
