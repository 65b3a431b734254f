"""REAP's line grammar: plan lines (ids, deps, references, repeats), loose fact levels and re-plan actions, and the
core readers the salvage of a rejected plan relies on."""

from __future__ import annotations

from rolecall.programs.core.calls import read_list, read_sections
from rolecall.programs.reap.parse import normalize_action, normalize_level, parse_plan


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
    tasks, _ = parse_plan(["4. a?", "9. b of #4 and #7?"])  # a reference to no sub-task stays as written
    assert tasks[1].question == "b of #1 and #7?" and tasks[1].deps == [1]


def test_parse_plan_keeps_the_plan_acyclic_and_drops_repeats():
    tasks, notes = parse_plan(["1. a? (deps: 2)", "2. b #2 (deps: 1)", "3. a?", "4. c #3 (deps: 3)", "", "none"])
    assert [(t.id, t.question, t.deps) for t in tasks] == [(1, "a?", []), (2, "b #2", [1]), (3, "c #1", [1])]
    assert any("repeated" in n for n in notes)
    assert any("sub-task 1: dependencies [2] dropped" in n for n in notes)
    assert any("sub-task 2: dependencies [2] dropped" in n for n in notes)
    assert parse_plan([]) == ([], []) and parse_plan(["", "unknown"]) == ([], [])


def test_levels_and_actions():
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


def test_a_rejected_plan_is_read_back_as_lines():
    text = "[[ ## plan ## ]]\n1. a?\n2. b #1?\n\n[[ ## level ## ]]\ndirect\n\n[[ ## completed ## ]]"
    assert [t.question for t in parse_plan(read_list(read_sections(text, ["plan"])["plan"]))[0]] == ["a?", "b #1?"]
