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
    gold_step_index,
    plan_efficiency,
    plan_logic,
    plan_placeholder_score,
    plan_reward,
    plan_structure,
    rewrite_reward,
)
from rolecall.retrievers.base import Passage

COMPARISON = [  # synthetic seed 0: "Which band was formed earlier, Yaebroria or Traveilt Archives?"
    {"question": "In which year was the band Yaebroria formed?", "answer": "1961",
     "supporting_ids": ["band/yaebroria"]},
    {"question": "In which year was the band Traveilt Archives formed?", "answer": "2010",
     "supporting_ids": ["band/traveilt-archives"]},
]  # fmt: skip
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


def test_analysis_gold_labels_the_step_the_sub_goal_is():
    """ "year Yaebroria formed" is gold step 1 (1961, passage band/yaebroria). Shown only the Traveilt Archives passage
    it is not answerable: the label is no, never yes / "2010" (step 2's answer, whose passage was shown)."""
    assert analysis_gold("year Yaebroria formed", ["band/traveilt-archives"], COMPARISON, []) == (False, [])
    assert analysis_gold("year Yaebroria formed", ["band/yaebroria"], COMPARISON, []) == (True, ["1961"])
    shown_both = ["band/traveilt-archives", "band/yaebroria"]
    assert analysis_gold("In which year was the band Traveilt Archives formed?", shown_both, COMPARISON, []) == (
        True,
        ["2010"],
    )
    assert analysis_gold("Who painted the moon?", shown_both, COMPARISON, []) == (False, [])  # no gold step


def test_gold_step_index_exact_then_f1_then_position():
    assert gold_step_index("in which year was the band traveilt archives formed", COMPARISON) == 2  # exact
    assert gold_step_index("year Yaebroria formed", COMPARISON) == 1  # best F1
    # "Who founded the company?" ties both steps: the sub-goal's place in its plan decides
    twins = [{"question": "Who founded the company Alpha?", "answer": "A"},
             {"question": "Who founded the company Beta?", "answer": "B"}]  # fmt: skip
    assert gold_step_index("Who founded the company?", twins, position=2) == 2
    assert gold_step_index("Who founded the company?", twins, position=1) == 1
    # placeholders are filled with the gold answers before matching: step 2 of GOLD is "Where was Orlen Vask born?"
    assert gold_step_index("Where was Orlen Vask born?", GOLD) == 2
    assert gold_step_index("anything", []) is None


def test_comparison_gold_plan_is_logically_coherent():
    """A comparison's look-ups are combined by the final synthesis: with the gold decomposition, the gold plan scores
    logic 1 (it used to score 2/3 for "step 1 is not used by a later step"); without gold the rule stays strict."""
    plan = [s["question"] for s in COMPARISON]
    assert plan_logic(plan, COMPARISON) == 1.0
    assert plan_logic(plan) == pytest.approx(2 / 3)
    # a compositional plan that forgets its placeholder still fails the check against its gold
    assert plan_logic(["Who directed the film Zopor Orchard?", "Where was he born?"], GOLD) == pytest.approx(2 / 3)
    question = "Which band was formed earlier, Yaebroria or Traveilt Archives?"
    r, parts = plan_reward(plan, question=question, gold_answers=["Yaebroria"], executed_answer="Yaebroria",
                           gold_decomposition=COMPARISON)  # fmt: skip
    assert parts["logic"] == 1.0 and r == pytest.approx(1.0)


def test_rewrite_reward_scores_at_the_programs_depth():
    """OPERA retrieves a rewritten query with k=10: a gold passage at rank 7 counts there, not in NDCG@5."""
    asked = []

    def retrieve(q, k):
        asked.append(k)
        return [Passage(f"d{i}", "", "") for i in range(6)] + [Passage("gold", "", "")] + [Passage("z", "", "")] * 3

    assert rewrite_reward("q", gold_ids=["gold"], retrieve=lambda q, k: retrieve(q, k)[:k])[1]["ndcg"] == 0.0
    r, parts = rewrite_reward("q", gold_ids=["gold"], retrieve=lambda q, k: retrieve(q, k)[:k], k=10)
    assert parts["ndcg"] == pytest.approx(1 / math.log2(8)) and asked == [5, 10]
