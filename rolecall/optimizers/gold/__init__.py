"""Gold-path targets for SFT (``source="gold"``): each role's gold output from an example's gold decomposition."""

from rolecall.optimizers.gold.opera import gold_sub_goals, opera_gold, shown_passage_ids
from rolecall.optimizers.gold.runner import gold_steps, gold_trajectories

__all__ = ["gold_steps", "gold_sub_goals", "gold_trajectories", "opera_gold", "shown_passage_ids"]
