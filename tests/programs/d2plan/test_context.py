"""What D2Plan's Reasoner reads: the global context C, a sub-question's notes, its evidence, the fallback query."""

from __future__ import annotations

from rolecall.programs.d2plan.context import NO_NOTES, SubQuestion, entity_query, format_context, format_notes


def test_format_context_writes_the_plan_with_answers_and_evidence():
    entries = [
        (1, "Who directed X?", "Ada Quell", "X was directed by Ada Quell."),
        (2, "Where was Ada Quell born?", "", "ignored without an answer"),
        (3, "Is #A_2 large?", None, ""),
        (4, "Who is Y?", "Bo", ""),
    ]
    assert format_context(entries) == (
        "1. Who directed X? -> Ada Quell (X was directed by Ada Quell.)\n"
        "2. Where was Ada Quell born? -> unknown\n"
        "3. Is #A_2 large?\n"
        "4. Who is Y? -> Bo"
    )
    assert format_context([]) == "(no plan)"


def test_evidence_is_the_relevant_notes_else_the_latest_unjudged_one():
    sub = SubQuestion(1, "q", "q", relevant=[False, True, True], notes=["a band", "Ada is 40.", "Ada lives in Varn."])
    assert sub.evidence(300) == "Ada is 40.; Ada lives in Varn."
    assert sub.evidence(16) == "Ada is 40.;..."
    raw = SubQuestion(1, "q", "q", relevant=[None, None], notes=["[1] old", "[1] Ada  Quell\n[2] Varn"])
    assert raw.evidence(300) == "[1] Ada Quell [2] Varn"  # without the Purifier: the latest search, folded
    assert SubQuestion(1, "q", "q", relevant=[False], notes=["a band"]).evidence(300) == ""
    assert SubQuestion(1, "q", "q").evidence(300) == ""  # answered without a search


def test_format_notes():
    sub = SubQuestion(1, "q", "q")
    assert format_notes(sub, purified=True, max_chars=100) == NO_NOTES
    sub.relevant, sub.notes = [False, None, True], ["a band", "passages about X", "Ada Quell."]
    assert format_notes(sub, purified=True, max_chars=100) == (
        "[1] not relevant: a band\n[2] passages about X\n[3] relevant: Ada Quell."
    )
    raw = SubQuestion(1, "q", "q", relevant=[None, None], notes=["x" * 30, "y" * 30])
    assert format_notes(raw, purified=False, max_chars=100) == f"Search 1:\n{'x' * 30}\nSearch 2:\n{'y' * 30}"
    assert format_notes(raw, purified=False, max_chars=50) == f"Search 2:\n{'y' * 30}"  # the latest that fit


def test_entity_query():
    assert entity_query("In which city was Staekys Granuvell born?") == "Staekys Granuvell"
    assert entity_query("What happened in 1922?") == "1922"
    assert entity_query("who?") == ""
