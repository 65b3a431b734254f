"""MultiAgent-OPD's role rewards and advantages on hand-worked cases (arXiv 2610.23234, Eq. 1, 2, 5, 6 and the KL
toward the Teacher), read from trajectories recorded the way the teams record them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.optimizers.rewards.team import (
    TeamRewardWeights,
    answerer_reward,
    candidate_scores,
    cascaded_team_rewards,
    hierarchical_team_rewards,
    kl_penalized_reward,
    leader_reward,
    role_advantages,
    search_bonus,
    searcher_reward,
    searcher_token_advantages,
    team_outcome,
)
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam
from rolecall.retrievers.base import Passage, Retriever

QUESTION = "Where was the director of Film X born?"


# ---------------------------------------------------------------------------------------------- trajectory builders
def searcher_turn(
    t: Trajectory, *, turn: int, env_step: int, action: str, content: str, valid: bool = True, searcher: int = 1
) -> None:
    """One Searcher turn as ``Searcher._act`` records it, and the retrieval its search runs."""
    meta = {"searcher": searcher, "turn": turn, "wave": 1, "env_step": env_step, "action": action, "valid": valid}
    meta["query" if action == "search" else "report"] = content
    outputs = {"action": action, "content": content} if valid else {}
    t.add(Step("role", "searcher", inputs={"subtask": QUESTION, "notes": "none yet"}, outputs=outputs, meta=meta))
    if not valid:
        t.event("fallback", role="searcher", reason="unknown action", replaced_by=action, searcher=searcher)
    if action == "search":
        where = {"searcher": searcher, "wave": 1, "env_step": env_step, "turn": turn, "fallback": not valid}
        ids = {"passage_ids": ["p0"]}
        t.add(Step("retrieval", "retrieve", inputs={"query": content, "k": 3}, outputs=ids, meta=where))


def answerer_call(t: Trajectory, candidates: Sequence[str | None], reports: Sequence[int] = (1,)) -> None:
    """The Answerer's call as ``TeamProgram._answer`` records it."""
    t.add(
        Step(
            "role",
            "answerer",
            inputs={"question": QUESTION, "reports": "[1] ..."},
            outputs={"answer": next((c for c in candidates if c), "")},
            meta={"reports": list(reports), "candidates": list(candidates)},
        )
    )


def leader_turn(t: Trajectory, *, round_: int, env_step: int, action: str, subtasks=(), selected=(), valid=True):
    """One Leader turn as ``HierarchicalTeam._lead`` records it."""
    meta = {"round": round_, "env_step": env_step, "action": action, "subtasks": list(subtasks)}
    meta.update(selected=list(selected), valid=valid)
    t.add(Step("role", "leader", inputs={"question": QUESTION, "reports": "none yet"}, meta=meta))


# ---------------------------------------------------------------------------------------------- formulas
def test_candidate_scores_and_team_outcome():
    """c_ij is normalized EM (articles and punctuation dropped), None scores 0; R_EM = max_j c_ij = 1."""
    scores = candidate_scores(["Varn", "Lyon", None, "the varn."], ["Varn"])
    assert scores == [1.0, 0.0, 0.0, 1.0] and team_outcome(scores) == 1.0
    assert team_outcome([0.0, 0.0]) == 0.0 and team_outcome([]) == 0.0


def test_search_bonus_counts_search_steps_before_the_report():
    """b_S: no search 0, one 0.5, two or more 1; no report of its own (budget forced one) 0."""
    assert [search_bonus(n) for n in range(5)] == [0.0, 0.5, 1.0, 1.0, 1.0]
    assert search_bonus(2, reported=False) == 0.0


def test_searcher_reward_hand_cases():
    """R_S = 0.9 R_EM + 0.1 b_S: right after one search 0.9 + 0.05 = 0.95; wrong after two 0 + 0.1 = 0.1; right
    without a search 0.9 (b_S = 0); an invalid turn -1 whatever the outcome."""
    assert searcher_reward(1.0, 0.5) == pytest.approx(0.95)
    assert searcher_reward(0.0, 1.0) == pytest.approx(0.1)
    assert searcher_reward(1.0, 0.0) == pytest.approx(0.9)
    assert searcher_reward(1.0, 1.0, valid=False) == -1.0
    assert searcher_reward(1.0, 1.0, valid=False, weights=TeamRewardWeights(invalid_reward=None)) == pytest.approx(1.0)


def test_answerer_reward_is_the_candidates_em_or_minus_one():
    assert answerer_reward(1.0) == 1.0 and answerer_reward(0.0) == 0.0
    assert answerer_reward(0.0, valid=False) == -1.0


def test_leader_reward_hand_cases():
    """R_L = 0.9 R_EM + 0.1 min(C_tool, 6)/6: right with C_tool 3: 0.9 + 0.1 * 3/6 = 0.95; wrong with C_tool 9
    (capped at 6): 0 + 0.1 = 0.1; a Leader that delegates nothing has C_tool 0: right 0.9, wrong 0."""
    assert leader_reward(1.0, 3) == pytest.approx(0.95)
    assert leader_reward(0.0, 9) == pytest.approx(0.1)
    assert leader_reward(1.0, 0) == pytest.approx(0.9) and leader_reward(0.0, 0) == 0.0
    assert leader_reward(1.0, 3, valid=False) == -1.0


def test_weights_are_validated():
    with pytest.raises(ConfigError, match="tool_cap"):
        TeamRewardWeights(tool_cap=0)
    with pytest.raises(ConfigError, match="outcome"):
        TeamRewardWeights(outcome=1.5)


# ------------------------------------------------------------------------------------- Stage I from a trajectory
def test_stage_one_rewards_from_a_cascaded_trajectory():
    """Two valid searches (env steps 1, 2), then a report; candidates ["Varn", None, "Lyon"], gold "Varn".
    c = [1, 0, 0], R_EM = 1; R_A = [1, -1 (did not parse), 0]; b_S = 1 (two searches) -> R_S = 0.9 + 0.1 = 1.0."""
    t = Trajectory(question=QUESTION)
    searcher_turn(t, turn=0, env_step=1, action="search", content="Film X director")
    searcher_turn(t, turn=1, env_step=2, action="search", content="Ada Quell")
    searcher_turn(t, turn=2, env_step=3, action="report", content="Varn (from Ada Quell)")
    answerer_call(t, ["Varn", None, "Lyon"])
    rewards = cascaded_team_rewards(t, "Varn")
    assert rewards.scores == [1.0, 0.0, 0.0] and rewards.outcome == 1.0
    assert rewards.answerer == [1.0, -1.0, 0.0]
    assert rewards.searches == 2 and rewards.searcher == pytest.approx(1.0) and rewards.tool_steps == 2
    assert rewards.leader is None
    metrics = rewards.metrics()
    assert metrics["reward/searcher"] == pytest.approx(1.0) and metrics["reward/answerer"] == pytest.approx(0.0)
    assert "reward/leader" not in metrics and metrics["team/tool_steps"] == 2.0


def test_stage_one_no_search_gets_no_bonus():
    """The Searcher reports at once: b_S = 0, so R_S = 0.9 * R_EM = 0.9 (right) and C_tool = 0."""
    t = Trajectory(question=QUESTION)
    searcher_turn(t, turn=0, env_step=1, action="report", content="Varn, I think")
    answerer_call(t, ["Varn"])
    rewards = cascaded_team_rewards(t, ["Varn"])
    assert rewards.searches == 0 and rewards.tool_steps == 0 and rewards.searcher == pytest.approx(0.9)


def test_stage_one_one_search_then_wrong_answer():
    """One search then a report, wrong answer: R_S = 0.9 * 0 + 0.1 * 0.5 = 0.05; R_A = [0]."""
    t = Trajectory(question=QUESTION)
    searcher_turn(t, turn=0, env_step=1, action="search", content="Film X")
    searcher_turn(t, turn=1, env_step=2, action="report", content="Lyon")
    answerer_call(t, ["Lyon"])
    rewards = cascaded_team_rewards(t, "Varn")
    assert rewards.searcher == pytest.approx(0.05) and rewards.answerer == [0.0] and rewards.outcome == 0.0


def test_stage_one_invalid_searcher_turn_scores_minus_one_for_the_searcher_only():
    """Turn 0 was unusable (the program searched the question in its place), turn 1 a valid report; the answer is
    right. The Searcher's total is -1; the Answerer keeps c = 1. The replaced search is not the Searcher's: C_tool 0."""
    t = Trajectory(question=QUESTION)
    searcher_turn(t, turn=0, env_step=1, action="search", content=QUESTION, valid=False)
    searcher_turn(t, turn=1, env_step=2, action="report", content="Varn")
    answerer_call(t, ["Varn"])
    rewards = cascaded_team_rewards(t, "Varn")
    assert rewards.searcher == -1.0 and rewards.answerer == [1.0] and rewards.outcome == 1.0
    assert rewards.searches == 0 and rewards.tool_steps == 0


def test_stage_one_budget_forced_report_earns_no_bonus():
    """Five searches fill the 5-step budget and the program writes the report: no summary of its own, b_S = 0;
    right answer -> R_S = 0.9. Not a format failure."""
    t = Trajectory(question=QUESTION)
    for turn in range(5):
        searcher_turn(t, turn=turn, env_step=turn + 1, action="search", content=f"query {turn}")
    t.event("budget_exhausted", wave=1, turn=5, searchers=[1], max_steps=5).error = "step budget of 5 spent"
    answerer_call(t, ["Varn"])
    rewards = cascaded_team_rewards(t, "Varn")
    assert rewards.searches == 5 and rewards.tool_steps == 5 and rewards.searcher == pytest.approx(0.9)


# ------------------------------------------------------------------------------------ Stage II from a trajectory
def test_stage_two_leader_reward_counts_environment_steps_with_a_search():
    """Round 1 (env 1) delegates two subtasks; env 2: both Searchers search; env 3: Searcher 1 reports, Searcher 2
    searches; env 4: Searcher 2 reports; round 2 (env 5) answers with reports [1, 2]. C_tool = |{2, 3}| = 2;
    right answer: R_L = 0.9 + 0.1 * 2/6 = 0.93333."""
    t = Trajectory(question=QUESTION)
    leader_turn(t, round_=1, env_step=1, action="delegate", subtasks=["Who directed Film X?", "Where is Film X?"])
    searcher_turn(t, turn=0, env_step=2, action="search", content="Film X director", searcher=1)
    searcher_turn(t, turn=0, env_step=2, action="search", content="Film X", searcher=2)
    searcher_turn(t, turn=1, env_step=3, action="report", content="Ada Quell", searcher=1)
    searcher_turn(t, turn=1, env_step=3, action="search", content="Film X studio", searcher=2)
    searcher_turn(t, turn=2, env_step=4, action="report", content="Varn", searcher=2)
    leader_turn(t, round_=2, env_step=5, action="answer", selected=[1, 2])
    answerer_call(t, ["Varn", "Varn", "Lyon"], reports=[1, 2])
    rewards = hierarchical_team_rewards(t, "Varn")
    assert rewards.tool_steps == 2 and rewards.leader == pytest.approx(0.9 + 0.1 * 2 / 6)
    assert rewards.answerer == [1.0, 1.0, 0.0] and rewards.searcher is None
    assert rewards.searches == 3 and rewards.metrics()["team/searches"] == 3.0  # both Searchers' searches
    assert rewards.metrics()["reward/leader"] == pytest.approx(0.933333, abs=1e-6)


@pytest.mark.parametrize(("answer", "expected"), [("Varn", 0.9), ("Lyon", 0.0)])
def test_stage_two_leader_that_delegates_nothing(answer, expected):
    """The Leader answers in round 1 with no reports: C_tool = 0, so R_L = 0.9 R_EM (+ 0.1 * 0)."""
    t = Trajectory(question=QUESTION)
    leader_turn(t, round_=1, env_step=1, action="answer", selected=[])
    answerer_call(t, [answer], reports=[])
    rewards = hierarchical_team_rewards(t, "Varn")
    assert rewards.tool_steps == 0 and rewards.leader == pytest.approx(expected)


def test_stage_two_invalid_leader_turn_scores_minus_one():
    """An unusable first Leader turn (the program delegated the question itself) makes the Leader's total -1."""
    t = Trajectory(question=QUESTION)
    leader_turn(t, round_=1, env_step=1, action="delegate", subtasks=[QUESTION], valid=False)
    searcher_turn(t, turn=0, env_step=2, action="report", content="Varn")
    leader_turn(t, round_=2, env_step=3, action="answer", selected=[1])
    answerer_call(t, ["Varn"])
    assert hierarchical_team_rewards(t, "Varn").leader == -1.0
    assert hierarchical_team_rewards(t, "Varn").searches == 0  # a report is not a search
    no_rule = hierarchical_team_rewards(t, "Varn", weights=TeamRewardWeights(invalid_reward=None))
    assert no_rule.leader == pytest.approx(0.9)


# ---------------------------------------------------------------------------------------------- Eq. 1
def test_role_advantages_hand_case():
    """R = [1, 0, 0, 1]: μ = 0.5, σ (Bessel) = sqrt(4 * 0.25 / 3) = 0.57735, Â = ±0.5 / (0.57735 + 1e-4)."""
    sigma = math.sqrt(1 / 3)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (sigma + 1e-4)
    torch.testing.assert_close(role_advantages([1.0, 0.0, 0.0, 1.0]), expected)


def test_answerer_advantages_within_the_parent_workflow():
    """Five candidates of one request, R_A = [1, 0, -1, 1, 0]: μ = 0.2, squared deviations 0.64 + 0.04 + 1.44 + 0.64 +
    0.04 = 2.8, σ = sqrt(2.8 / 4) = 0.83666; Â = (R - 0.2) / (0.83666 + 1e-4)."""
    rewards = torch.tensor([1.0, 0.0, -1.0, 1.0, 0.0])
    expected = (rewards - 0.2) / (math.sqrt(0.7) + 1e-4)
    torch.testing.assert_close(role_advantages(rewards), expected)


def test_role_advantages_all_equal_and_single_member_are_zero():
    """All-equal rewards: R - μ = 0 and σ = 0, so Â = 0 / ε = 0 (no NaN); a group of one likewise."""
    for rewards in ([0.93, 0.93, 0.93], [1.0], [[0.0, 0.0], [1.0, 0.0]]):
        advantages = role_advantages(rewards)
        assert torch.isfinite(advantages).all()
    assert role_advantages([0.93, 0.93, 0.93]).tolist() == [0.0, 0.0, 0.0]
    assert role_advantages([1.0]).tolist() == [0.0]
    batched = role_advantages(torch.tensor([[0.0, 0.0], [1.0, 0.0]]))  # (B, G): each row its own group
    assert batched[0].tolist() == [0.0, 0.0] and batched[1, 0] > 0 > batched[1, 1]
    with pytest.raises(ConfigError, match="eps"):
        role_advantages([1.0, 0.0], eps=0.0)


# ---------------------------------------------------------------------------------------------- Eq. 5
def test_searcher_token_advantages_hand_case_and_mask():
    """β = 0.01, log π_T = [-1, -2, -0.5], log π_old = [-1.5, -1, -0.5], M = [1, 1, 0] (a passage token):
    Â = 0.01 * [0.5, -1, 0] = [0.005, -0.01, 0]. A masked -inf Teacher score stays 0, not NaN."""
    teacher = torch.tensor([-1.0, -2.0, -0.5])  # (T,)
    old = torch.tensor([-1.5, -1.0, -0.5])
    mask = torch.tensor([1, 1, 0])
    torch.testing.assert_close(searcher_token_advantages(teacher, old, mask), torch.tensor([0.005, -0.01, 0.0]))
    teacher_inf = torch.tensor([-1.0, -2.0, float("-inf")])
    torch.testing.assert_close(searcher_token_advantages(teacher_inf, old, mask), torch.tensor([0.005, -0.01, 0.0]))
    batched = searcher_token_advantages(teacher.expand(2, 3), old.expand(2, 3), torch.tensor([[1, 1, 0], [0, 0, 0]]))
    torch.testing.assert_close(batched, torch.tensor([[0.005, -0.01, 0.0], [0.0, 0.0, 0.0]]))  # (B, T)


# ---------------------------------------------------------------------------------------------- KL toward the Teacher
def test_kl_penalized_reward_k1_and_mask():
    """log π = [-1, -2], log π_T = [-2, -2.5]: k1 = [1, 0.5], sum 1.5; R = 1 - 1e-3 * 1.5 = 0.9985. Masking the second
    token: 1 - 1e-3 * 1 = 0.999."""
    logps, teacher = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.5])
    torch.testing.assert_close(kl_penalized_reward(1.0, logps, teacher), torch.tensor(0.9985))
    torch.testing.assert_close(kl_penalized_reward(1.0, logps, teacher, torch.tensor([1, 0])), torch.tensor(0.999))


def test_kl_penalized_reward_k3_and_batch():
    """k3 with Δ = log π_T - log π = [-1, -0.5]: (e^-1 + 1 - 1) + (e^-0.5 + 0.5 - 1) = 0.367879 + 0.106531 = 0.474410;
    with kl_coef 0.1 on rewards [1, 0] (B = 2, same tokens): [1 - 0.047441, -0.047441]."""
    logps, teacher = torch.tensor([[-1.0, -2.0]] * 2), torch.tensor([[-2.0, -2.5]] * 2)
    kl = math.exp(-1) + math.exp(-0.5) - 0.5
    out = kl_penalized_reward(torch.tensor([1.0, 0.0]), logps, teacher, kl_coef=0.1, estimator="k3")
    torch.testing.assert_close(out, torch.tensor([1.0 - 0.1 * kl, -0.1 * kl]))
    with pytest.raises(ConfigError, match="estimator"):
        kl_penalized_reward(1.0, logps, teacher, estimator="k2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one shape"):
        kl_penalized_reward(1.0, logps, teacher[:, :1])


# ---------------------------------------------------------------------------------------------- real runs
class _Passages(Retriever):
    """Three fixed passages for every query."""

    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        return [[Passage(f"p{i}", f"Title {i}", f"Text {i}.") for i in range(k or 3)] for _ in queries]

    def save(self, path) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    @classmethod
    def load(cls, path) -> _Passages:  # pragma: no cover - not used
        raise NotImplementedError


def test_rewards_of_real_team_runs():
    """A CascadedTeam run (one search, a report, "Varn"): R_S = 0.9 + 0.1 * 0.5 = 0.95, R_A = [1]. A HierarchicalTeam
    whose Leader answers at once: C_tool = 0, R_L = 0.9."""
    lm = DummyLM(
        [{"action": "search", "content": "Ada Quell"}, {"action": "report", "content": "Varn"}, {"answer": "Varn"}]
    )
    pred = CascadedTeam(_Passages(), lm=lm, demos=None)(question=QUESTION)
    rewards = cascaded_team_rewards(pred.trajectory, "Varn")
    assert rewards.searcher == pytest.approx(0.95) and rewards.answerer == [1.0] and rewards.tool_steps == 1
    lm = DummyLM([{"action": "answer", "selected": [], "subtasks": []}, {"answer": "Varn"}])
    pred = HierarchicalTeam(_Passages(), lm=lm, demos=None)(question=QUESTION)
    rewards = hierarchical_team_rewards(pred.trajectory, "Varn")
    assert rewards.tool_steps == 0 and rewards.leader == pytest.approx(0.9) and rewards.answerer == [1.0]
