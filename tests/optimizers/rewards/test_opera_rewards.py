"""OPERA's role rewards on hand-worked examples (Eq. 7, 9, 10 with the reference code's weights)."""

from __future__ import annotations

import math

import pytest

from rolecall.errors import ConfigError
from rolecall.optimizers.rewards.opera import (
    AnalysisRewardWeights,
    PlanRewardWeights,
    analysis_gold,
    analysis_reward,
    plan_efficiency,
    plan_logic,
    plan_placeholder_score,
    plan_reward,
    plan_structure,
    rewrite_reward,
)
from rolecall.retrievers.base import Passage

GOLD = [
    {"question": "Who directed the film Zopor Orchard?", "answer": "Orlen Vask", "supporting_ids": ["film/zopor"]},
    {"question": "Where was #1 born?", "answer": "Tavrimo", "supporting_ids": ["person/orlen-vask"]},
]


def test_plan_logic_rules():
    good = ["Who directed the film Zopor Orchard?", "Where was [person from step 1] born?"]
    assert plan_logic(good) == 1.0
    forward_ref = ["Where was [person from step 2] born?", "Who directed Zopor Orchard?"]
    # backwards fails, unique passes, "step 1 used later" fails -> 1/3
    assert plan_logic(forward_ref) == pytest.approx(1 / 3)
    assert plan_logic(["a b c", "a b c"]) == pytest.approx(1 / 3)  # duplicate and unused step 1
    assert plan_logic([]) == 0.0


def test_efficiency_table():
    assert [plan_efficiency(n) for n in range(0, 8)] == [0.0, 0.3, 1.0, 1.0, 0.8, 0.8, 0.5, 0.5]


def test_placeholder_score_against_gold():
    """Gold dependencies [no, yes]. Plan [no, yes] -> 2/2; plan [no, no] -> 1/2; 3-step plan [no, yes, no] -> 2/3."""
    assert plan_placeholder_score(["Who directed X?", "Where was [person from step 1] born?"], GOLD) == 1.0
    assert plan_placeholder_score(["Who directed X?", "Where was he born?"], GOLD) == 0.5
    assert plan_placeholder_score(["q one x", "q [a from step 1]", "q three x"], GOLD) == pytest.approx(2 / 3)


def test_plan_reward_weighted_sum():
    """Perfect 2-step plan whose execution answered right:
    0.25*1 (logic) + 0.25*1 (struct) + 0.30*1 (EM) + 0.10*1 (2 steps) + 0.10*1 (placeholders) = 1.0.
    The same plan executed to a wrong answer loses the 0.30."""
    plan = ["Who directed the film Zopor Orchard?", "Where was [person from step 1] born?"]
    r, parts = plan_reward(
        plan, question="q", gold_answers=["Tavrimo"], executed_answer="Tavrimo", gold_decomposition=GOLD
    )
    assert r == pytest.approx(1.0) and parts["execution"] == 1.0
    r_wrong, _ = plan_reward(
        plan, question="q", gold_answers=["Tavrimo"], executed_answer="Paris", gold_decomposition=GOLD
    )
    assert r_wrong == pytest.approx(0.70)
    assert plan_reward(None, question="q", gold_answers=["x"], executed_answer=None)[0] == 0.0
    assert plan_structure(["one two three"] * 7, max_steps=5) == 0.5


def test_plan_reward_custom_judge():
    plan = ["Who directed the film Zopor Orchard?", "Where was [person from step 1] born?"]
    r, parts = plan_reward(
        plan,
        question="q",
        gold_answers=["Tavrimo"],
        executed_answer="Tavrimo",
        gold_decomposition=GOLD,
        judge=lambda q, p: 0.0,
    )
    assert parts["logic"] == 0.0 and r == pytest.approx(0.75)


def test_analysis_reward_cases():
    """Gold yes: 0.25 judgement + 0.65 EM + 0.10 format. Gold no: 0.9 judgement + 0.1 format."""
    yes_right = {"sufficient": "yes", "answer": "Orlen Vask"}
    assert analysis_reward(yes_right, gold_sufficient=True, gold_answers=["Orlen Vask"])[0] == pytest.approx(1.0)
    yes_wrong = {"sufficient": "yes", "answer": "Tavrimo"}
    assert analysis_reward(yes_wrong, gold_sufficient=True, gold_answers=["Orlen Vask"])[0] == pytest.approx(0.35)
    said_no = {"sufficient": "no", "answer": "unknown"}
    assert analysis_reward(said_no, gold_sufficient=True, gold_answers=["Orlen Vask"])[0] == pytest.approx(0.10)
    assert analysis_reward(said_no, gold_sufficient=False, gold_answers=[])[0] == pytest.approx(1.0)
    assert analysis_reward(yes_wrong, gold_sufficient=False, gold_answers=[])[0] == pytest.approx(0.10)
    assert analysis_reward(None, gold_sufficient=True, gold_answers=["x"])[0] == 0.0


def test_analysis_gold_from_decomposition():
    # the passages show step 2's document, and the sub-goal (with #1 filled) matches step 2
    ok, answers = analysis_gold("Where was Orlen Vask born?", ["person/orlen-vask", "city/x"], GOLD, [])
    assert ok and answers == ["Tavrimo"]
    assert analysis_gold("Where was Orlen Vask born?", ["city/x"], GOLD, []) == (False, [])
    assert analysis_gold("anything", ["a"], None, ["a"]) == (True, [])


def test_rewrite_reward_ndcg():
    """Gold doc at rank 2 of k=5: NDCG = (1/log2 3) / 1 = 0.6309; reward = 0.9 sqrt(0.6309) + 0.1."""

    def retrieve(q, k):
        return [Passage("x", "", ""), Passage("gold", "", ""), Passage("y", "", "")][:k]

    r, parts = rewrite_reward("who directed zopor", gold_ids=["gold"], retrieve=retrieve)
    assert parts["ndcg"] == pytest.approx(1 / math.log2(3))
    assert r == pytest.approx(0.9 * math.sqrt(1 / math.log2(3)) + 0.1)
    assert rewrite_reward("", gold_ids=["gold"], retrieve=retrieve)[0] == 0.0


def test_weights_validated():
    with pytest.raises(ConfigError):
        PlanRewardWeights(logic=1.5)
    with pytest.raises(ConfigError):
        AnalysisRewardWeights(format_if_insufficient=-0.1)
