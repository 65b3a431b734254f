"""How a program-in-the-loop RL optimizer updates its policy from one step's samples: the learning-rate schedule within
a stage and PPO epochs with a pi_old the trainer computes itself. Shared by MAPGRPO, SPlanRL, Search-R1 GRPO and OPD.

The options are a dataclass mixin an optimizer's config inherits next to
:class:`~rolecall.optimizers.core.run_config.RunConfig` (``class SPlanRLConfig(PolicyUpdateOptions, RunConfig)``);
the optimizer hands them to its :class:`~rolecall.optimizers.core.config.TrainerConfig` and runs its update through
:func:`policy_passes`.

Example:
    >>> from rolecall.optimizers.splanrl import SPlanRLConfig
    >>> cfg = SPlanRLConfig(num_iterations=2, lr_schedule="linear", lr_warmup_steps=2)
    >>> (cfg.num_iterations, cfg.lr_schedule, cfg.lr_warmup_steps)
    (2, 'linear', 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rolecall.optimizers.core.config import LRSchedule
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.programs.core.options import option

__all__ = ["PolicyUpdateOptions", "policy_passes"]


@dataclass(kw_only=True)
class PolicyUpdateOptions:
    """The policy-update settings of a GRPO-style optimizer: learning-rate schedule and PPO epochs."""

    lr_schedule: LRSchedule = "constant"
    """``constant``: every step at the learning rate; ``linear``: it decays to 0 over the stage's steps (or its share
    of the time budget)."""
    lr_warmup_steps: int = option(0, low=0)
    """Optimizer steps over which the learning rate rises linearly from ``lr / (lr_warmup_steps + 1)`` to ``lr``, at the
    start of each stage (0: none)."""
    num_iterations: int = option(1, low=1)
    """Optimizer passes over one step's samples (PPO epochs; TRL's ``num_iterations``). With 1, pi_old in the ratio is
    the detached current policy (exactly on-policy, ratio 1); above 1, pi_old is the trainer's own forward before the
    first pass, so the later passes are clipped against the policy that sampled (never the sampler's log-probs)."""

    def trainer_fields(self) -> dict[str, Any]:
        """The :class:`~rolecall.optimizers.core.config.TrainerConfig` fields these settings set."""
        return {"lr_schedule": self.lr_schedule, "lr_warmup_steps": self.lr_warmup_steps}


def policy_passes(trainer: Any, samples: Sequence[TrainingSample], iterations: int) -> dict[str, float]:
    """``iterations`` optimizer steps of ``trainer`` over one step's ``samples``; the last step's metrics, with
    ``train/optimizer_steps`` summed over the passes.

    With more than one pass, pi_old is the trainer's own forward before the first (``trainer.policy_logps``, stored as
    each sample's ``old_logps``), at the trainer's temperature, so the first pass's ratios are exactly 1 and the later
    ones clip against the policy that sampled. The trainer is called even with no samples (under several processes
    every process must step as often; the main process's samples decide).

    Args:
        trainer: the stage's :class:`~rolecall.optimizers.core.trainer.AdapterTrainer`.
        samples: the step's training samples (empty when every group was skipped).
        iterations: passes (``num_iterations``), at least 1.
    """
    batch = list(samples)
    if iterations > 1 and batch:
        olds = trainer.policy_logps(batch)
        batch = [dataclasses.replace(s, old_logps=old) if s.completion_ids else s
                 for s, old in zip(batch, olds, strict=True)]  # fmt: skip
    results = [trainer.step(batch) for _ in range(max(1, iterations))]
    merged = dict(results[-1])
    merged["train/optimizer_steps"] = sum(r.get("train/optimizer_steps", 0.0) for r in results)
    return merged
