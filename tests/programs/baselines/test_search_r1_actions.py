"""Search-R1's action tags: the parser (strict and lenient), recovery from a failed call's raw completions, and how a
finished turn is written into the interaction."""

from __future__ import annotations

import pytest

from rolecall.programs.baselines.search_r1_actions import (
    INVALID_ACTION_NOTE,
    SearchR1Action,
    parse_action,
    recover_action,
    render_turn,
)
from rolecall.programs.core.trajectory import Step


@pytest.mark.parametrize(
    ("text", "kind", "content", "valid"),
    [
        ("<search>Varn river</search>", "search", "Varn river", True),
        ("  <answer> Ostrian </answer>\n", "answer", "Ostrian", True),
        ("<SEARCH>Varn</SEARCH>", "search", "Varn", True),
        ("I will search. <search>Varn</search>", "search", "Varn", False),
        ("<search>a</search><search>b</search>", "search", "a", False),
        ("<search></search><answer>X</answer>", "answer", "X", False),
        ("<answer>Ostrian", "answer", "Ostrian", False),
        ("<search>Varn\n[[ ## completed", "search", "Varn", False),
        ("<answer></answer>", "invalid", "", False),
        ("<search>   </search>", "invalid", "", False),
        ("Ostrian", "invalid", "", False),
        ("", "invalid", "", False),
    ],
)
def test_parse_action(text, kind, content, valid):
    action = parse_action(text)
    assert (action.kind, action.content, action.valid) == (kind, content, valid)
    assert (action.error is None) == valid


def test_parse_action_strict_rejects_sloppy_actions():
    assert parse_action("I will search. <search>Varn</search>", lenient=False).kind == "invalid"
    assert parse_action("<answer>Ostrian", lenient=False).error == "unclosed action tag"
    assert parse_action("<search>Varn</search>", lenient=False).valid


def test_recover_action_reads_every_attempt_first_one_first():
    step = Step(kind="role", role="agent", completion="no json")
    step.meta["attempts"] = [{"completions": ["Sure. <search>gamma</search>"]}, {"completions": ["no json"]}]
    action = recover_action(step, "output did not parse")
    assert (action.kind, action.content, action.valid) == ("search", "gamma", False)
    assert action.error == "output did not parse; recovered from the completion"
    assert recover_action(Step(kind="role", role="agent", completion="nothing"), "bad") == SearchR1Action(
        kind="invalid", error="bad"
    )


def test_recover_action_prefers_the_salvaged_action_field():
    """A stray tag before the ``action`` section no longer wins over the action the model wrote there."""
    completion = "I could <search>wrong</search>\n\n[[ ## action ## ]]\n<answer>X</answer>\n\n[[ ## completed ## ]]"
    step = Step(kind="role", role="agent", completion=completion, meta={"salvaged": {"action": "<answer>X</answer>"}})
    assert recover_action(step, "bad").content == "X"


def test_render_turn():
    search = SearchR1Action(kind="search", content="Varn", valid=True)
    assert render_turn("Find it.", search, "[1] Varn | A city.", show_reasoning=False) == (
        "<search>Varn</search>\n<information>[1] Varn | A city.</information>"
    )
    assert render_turn("", SearchR1Action(kind="answer", content="A", valid=True), "") == "<answer>A</answer>"
    assert render_turn("hm", SearchR1Action(kind="invalid"), "") == f"<think>hm</think>\n{INVALID_ACTION_NOTE}"
