"""GRPO core: group advantages, the clipped policy loss and per-token log-probs (pure torch).

The trainer that uses them is :class:`rolecall.optimizers.core.trainer.AdapterTrainer`.
"""

from rolecall.optimizers.core.grpo.advantages import (
    AdvantageScale,
    gradient_mask,
    group_advantages,
    role_normalized_advantages,
    teacher_token_advantages,
)
from rolecall.optimizers.core.grpo.logprobs import build_completion_batch, ref_logprobs, sequence_logprobs
from rolecall.optimizers.core.grpo.loss import LossType, grpo_loss, per_token_kl_k3, selective_log_softmax

__all__ = [
    "AdvantageScale",
    "LossType",
    "build_completion_batch",
    "gradient_mask",
    "group_advantages",
    "grpo_loss",
    "per_token_kl_k3",
    "ref_logprobs",
    "role_normalized_advantages",
    "selective_log_softmax",
    "sequence_logprobs",
    "teacher_token_advantages",
]
