"""The iterative baselines' text helpers: IRCoT's answer cue and first sentence, the Self-Ask history."""

from __future__ import annotations

from rolecall.programs.baselines.chains import answer_after_cue, first_sentence, format_history, has_answer_cue


def test_answer_cue_helpers():
    assert has_answer_cue("Thus the answer is 1870.") and not has_answer_cue("Ada answered the door.")
    assert answer_after_cue('X is in Y. So the answer is "Y".') == "Y"
    assert answer_after_cue("No cue here.") == ""


def test_first_sentence_keeps_a_following_answer_cue():
    assert first_sentence("Ada directed X. She was born in 1900.") == "Ada directed X."
    assert first_sentence("Ada was born in Varn. So the answer is Varn. More.") == (
        "Ada was born in Varn. So the answer is Varn."
    )
    assert first_sentence("  So the answer is Varn.  Then more.") == "So the answer is Varn."


def test_format_history():
    assert format_history([]) == "(none)"
    assert format_history([("a?", "A")]) == "Follow up: a?\nIntermediate answer: A"
