"""Gold-path targets for SFT (``source="gold"``): each role's gold output from an example's gold decomposition, for
every role of the five systems, the two direct baselines and the Search-R1 agent."""

from rolecall.optimizers.gold.d2plan import d2plan_gold, d2plan_gold_plan
from rolecall.optimizers.gold.direct import direct_gold
from rolecall.optimizers.gold.opera import gold_sub_goals, opera_gold, shown_passage_ids
from rolecall.optimizers.gold.reap import reap_gold
from rolecall.optimizers.gold.runner import gold_steps, gold_trajectories
from rolecall.optimizers.gold.search_r1 import search_r1_gold
from rolecall.optimizers.gold.stride import stride_gold
from rolecall.optimizers.gold.team import team_gold

__all__ = [
    "d2plan_gold",
    "d2plan_gold_plan",
    "direct_gold",
    "gold_steps",
    "gold_sub_goals",
    "gold_trajectories",
    "opera_gold",
    "reap_gold",
    "search_r1_gold",
    "shown_passage_ids",
    "stride_gold",
    "team_gold",
]
