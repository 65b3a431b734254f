"""Role rewards of the trained programs, each a pure formula over numbers plus an adapter that reads a trajectory:
OPERA (:mod:`~rolecall.optimizers.rewards.opera`), MultiAgent-OPD (:mod:`~rolecall.optimizers.rewards.team`), D2Plan's
SPlanRL (:mod:`~rolecall.optimizers.rewards.d2plan`) and the Search-R1 baseline
(:mod:`~rolecall.optimizers.rewards.search_r1`)."""

from rolecall.optimizers.rewards.d2plan import (
    TIMELY_TRIGGER,
    SPlanRLWeights,
    generated_sub_questions,
    initial_plan_reward,
    plan_adaptation_reward,
    plan_revise_reward,
    splanrl_reward,
    splanrl_rewards,
)
from rolecall.optimizers.rewards.opera import (
    AnalysisRewardWeights,
    PlanRewardWeights,
    RewriteRewardWeights,
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
from rolecall.optimizers.rewards.search_r1 import (
    DEFAULT_FORMAT_PENALTY,
    final_answer,
    search_r1_reward,
    search_r1_rewards,
)
from rolecall.optimizers.rewards.team import (
    KLEstimator,
    TeamRewards,
    TeamRewardWeights,
    answerer_candidates,
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

__all__ = [
    # OPERA
    "PlanRewardWeights",
    "AnalysisRewardWeights",
    "RewriteRewardWeights",
    "plan_logic",
    "plan_structure",
    "plan_efficiency",
    "plan_placeholder_score",
    "plan_reward",
    "analysis_gold",
    "gold_step_index",
    "analysis_reward",
    "rewrite_reward",
    # MultiAgent-OPD
    "KLEstimator",
    "TeamRewardWeights",
    "TeamRewards",
    "candidate_scores",
    "team_outcome",
    "search_bonus",
    "searcher_reward",
    "answerer_reward",
    "leader_reward",
    "role_advantages",
    "searcher_token_advantages",
    "kl_penalized_reward",
    "answerer_candidates",
    "cascaded_team_rewards",
    "hierarchical_team_rewards",
    # D2Plan SPlanRL
    "TIMELY_TRIGGER",
    "SPlanRLWeights",
    "initial_plan_reward",
    "plan_revise_reward",
    "plan_adaptation_reward",
    "splanrl_reward",
    "generated_sub_questions",
    "splanrl_rewards",
    # Search-R1
    "DEFAULT_FORMAT_PENALTY",
    "search_r1_reward",
    "final_answer",
    "search_r1_rewards",
]
