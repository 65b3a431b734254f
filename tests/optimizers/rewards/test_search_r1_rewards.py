"""The Search-R1 baseline's reward on hand-worked cases: R = EM(final <answer>) - 0.2 · 1[some turn malformed], read
from trajectories recorded the way ``SearchR1Agent`` records them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.optimizers.rewards.search_r1 import final_answer, search_r1_reward, search_r1_rewards
from rolecall.programs.baselines.search_r1 import SearchR1Agent
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.base import Passage, Retriever

QUESTION = "Where was the director of Film X born?"


def turn(t: Trajectory, n: int, action: str, content: str = "", *, valid: bool = True, forced: bool = False) -> None:
    """One agent turn as ``SearchR1Agent._act`` records it (and the retrieval a search runs)."""
    error = None if valid else ("no <search> or <answer> tag" if action == "invalid" else "text outside the action tag")
    meta = {"turn": n, "action": action, "valid_action": valid, "format_error": error, "forced": forced}
    if action in ("search", "answer"):
        meta["query" if action == "search" else "answer"] = content
    t.add(Step("role", "agent", inputs={"question": QUESTION, "interaction": "..."}, meta=meta,
               outputs={"reasoning": "...", "action": f"<{action}>{content}</{action}>"}))  # fmt: skip
    if action == "search":
        t.add(Step("retrieval", "retrieve", inputs={"query": content, "k": 3}, outputs={"passage_ids": ["p0"]},
                   meta={"turn": n}))  # fmt: skip


def test_reward_formula():
    """EM 1 / 0 with every turn valid: 1 / 0; with a malformed turn: 1 - 0.2 = 0.8 / 0 - 0.2 = -0.2. λ_f = 0 is the
    outcome-only reward of Search-R1."""
    assert search_r1_reward(1.0, True) == 1.0 and search_r1_reward(0.0, True) == 0.0
    assert search_r1_reward(1.0, False) == pytest.approx(0.8) and search_r1_reward(0.0, False) == pytest.approx(-0.2)
    assert search_r1_reward(1.0, False, format_penalty=0.0) == 1.0
    assert search_r1_reward(1.0, False, format_penalty=0.5) == 0.5
    with pytest.raises(ConfigError, match="format_penalty"):
        search_r1_reward(1.0, True, format_penalty=-0.1)


def test_search_then_answer_all_valid():
    """One search, then <answer>the Varn</answer> (normalized EM against "Varn" = 1), both turns valid: R = 1."""
    t = Trajectory(question=QUESTION)
    turn(t, 0, "search", "Film X director")
    turn(t, 1, "answer", "the Varn")
    assert search_r1_rewards(t, ["Varn"]) == {
        "reward/total": 1.0, "reward/answer": 1.0, "reward/format": 1.0,
        "search_r1/turns": 2.0, "search_r1/invalid_turns": 0.0, "search_r1/searches": 1.0,
    }  # fmt: skip


@pytest.mark.parametrize(("answer", "expected"), [("Varn", 1.0), ("Lyon", 0.0)])
def test_no_search_is_not_penalized(answer, expected):
    """Answering at once, in a valid tag: R = EM (no search term in the reward)."""
    t = Trajectory(question=QUESTION)
    turn(t, 0, "answer", answer)
    r = search_r1_rewards(t, "Varn")
    assert r["reward/total"] == expected and r["search_r1/searches"] == 0.0


def test_an_invalid_turn_costs_the_format_penalty():
    """Turn 0 had no tag (the program told the agent so), then a valid search and a right answer:
    R = 1 - 0.2 = 0.8, one invalid turn."""
    t = Trajectory(question=QUESTION)
    turn(t, 0, "invalid", valid=False)
    turn(t, 1, "search", "Film X director")
    turn(t, 2, "answer", "Varn")
    r = search_r1_rewards(t, "Varn")
    assert r["reward/total"] == pytest.approx(0.8) and r["reward/format"] == 0.0 and r["search_r1/invalid_turns"] == 1
    assert search_r1_rewards(t, "Varn", format_penalty=0.0)["reward/total"] == 1.0


def test_a_sloppy_answer_tag_counts_as_the_answer_but_is_invalid():
    """``I think <answer>Varn`` was executed (lenient parsing) but is not exactly one tag: EM 1, R = 0.8."""
    t = Trajectory(question=QUESTION)
    turn(t, 0, "answer", "Varn", valid=False)
    assert final_answer(t) == "Varn" and search_r1_rewards(t, "Varn")["reward/total"] == pytest.approx(0.8)


def test_forced_turn_without_an_answer():
    """Four searches spend the budget; the forced turn writes no <answer> (invalid): answer "", EM 0, R = -0.2."""
    t = Trajectory(question=QUESTION)
    for n in range(4):
        turn(t, n, "search", f"query {n}")
    turn(t, 4, "invalid", valid=False, forced=True)
    t.event("no_answer", action="invalid").error = "the forced turn gave no <answer>"
    r = search_r1_rewards(t, "Varn")
    assert final_answer(t) == "" and r["reward/total"] == pytest.approx(-0.2) and r["search_r1/searches"] == 4.0


def test_a_run_without_agent_turns_is_not_format_valid():
    r = search_r1_rewards(Trajectory(question=QUESTION), "Varn")
    assert r["reward/format"] == 0.0 and r["reward/total"] == pytest.approx(-0.2)


class _Passages(Retriever):
    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        return [[Passage("person/ada-quell", "Ada Quell", "Ada Quell was born in Varn.")] for _ in queries]

    def save(self, path) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    @classmethod
    def load(cls, path) -> _Passages:  # pragma: no cover - not used
        raise NotImplementedError


def test_reward_of_a_real_search_r1_run():
    """A scripted run: a valid search, then a valid answer "Varn": R = 1; the same run ending in ``I think
    <answer>Varn`` (executed, but malformed): R = 0.8."""
    for action, expected in [("<answer>Varn</answer>", 1.0), ("I think <answer>Varn", 0.8)]:
        lm = DummyLM([{"reasoning": "Find the director.", "action": "<search>Film X director</search>"},
                      {"reasoning": "Ada Quell was born in Varn.", "action": action}])  # fmt: skip
        pred = SearchR1Agent(_Passages(), lm=lm, demos=None)(question=QUESTION)
        r = search_r1_rewards(pred.trajectory, "Varn")
        assert pred.answer == "Varn" and r["reward/total"] == pytest.approx(expected)
        assert r["reward/format"] == float(pred.format_valid)


def test_graded_format_penalty_charges_each_malformed_turn_its_share():
    """Graded: R = EM - 0.2 · invalid/turns. One malformed turn of three before a right answer: 1 - 0.2/3; all four
    turns malformed and no answer: -0.2 (the same ends as the indicator); a clean run: EM. Two all-but-one malformed
    runs now differ from an all-malformed one, which the indicator could not tell apart."""
    t = Trajectory(question=QUESTION)
    turn(t, 0, "invalid", valid=False)
    turn(t, 1, "search", "Film X director")
    turn(t, 2, "answer", "Varn")
    assert search_r1_rewards(t, "Varn", graded_format=True)["reward/total"] == pytest.approx(1 - 0.2 / 3)
    assert search_r1_rewards(t, "Varn")["reward/total"] == pytest.approx(0.8)
    bad = Trajectory(question=QUESTION)
    for n in range(4):
        turn(bad, n, "invalid", valid=False)
    assert search_r1_rewards(bad, "Varn", graded_format=True)["reward/total"] == pytest.approx(-0.2)
    one_good = Trajectory(question=QUESTION)
    turn(one_good, 0, "search", "Film X director")
    for n in range(1, 4):
        turn(one_good, n, "invalid", valid=False)
    assert search_r1_rewards(one_good, "Varn", graded_format=True)["reward/total"] == pytest.approx(-0.15)
    assert search_r1_rewards(Trajectory(question=QUESTION), "Varn", graded_format=True)["reward/total"] == -0.2
    assert search_r1_reward(0.0, False, invalid_fraction=0.5, format_penalty=0.0) == 0.0
    with pytest.raises(ConfigError, match="invalid_fraction"):
        search_r1_reward(1.0, False, invalid_fraction=1.5)
