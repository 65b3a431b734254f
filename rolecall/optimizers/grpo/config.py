"""Settings of a GRPO policy update (GRPO, arXiv 2402.03300; OPERA / MAPGRPO, arXiv 2508.16438).

Every field's attribute docstring gives its effect, its paper and the recommended value; it is the single source of
the command line's ``--help``. Values are checked in ``__post_init__`` before any model loads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import get_args

from rolecall.errors import ConfigError
from rolecall.optimizers.grpo.advantages import AdvantageScale
from rolecall.optimizers.grpo.loss import LossType

logger = logging.getLogger(__name__)

__all__ = ["GRPOConfig"]

_INT_FIELDS = ("group_size", "gradient_accumulation_steps", "max_completion_length", "num_iterations")
_FLOAT_FIELDS = ("beta", "epsilon_low", "epsilon_high", "learning_rate", "max_grad_norm", "temperature", "top_p")


@dataclass(kw_only=True)
class GRPOConfig:
    """Hyperparameters of one GRPO-family optimizer (group sampling, clipped surrogate, KL, optimizer step).

    Example:
        >>> config = GRPOConfig(group_size=4, loss_type="dapo", epsilon_high=0.28)
        >>> config.clip_range
        (0.8, 1.28)
    """

    group_size: int = 8
    """Candidates sampled per input, G (GRPO; OPERA Eq. 2). With an injected expert c_best (MAPGRPO Eq. 11), G - 1 come
    from the policy. The OPERA reference YAML uses 8; at least 2."""

    beta: float = 0.05
    """KL coefficient toward the reference policy, the initial model (OPERA Eq. 4). 0.0 skips the reference forward
    pass. OPERA uses 0.05 (0.04 for the Rewrite agent)."""

    epsilon_low: float = 0.2
    """Lower clip range: the ratio is clipped below at 1 - epsilon_low (PPO / GRPO). Recommended 0.2."""

    epsilon_high: float = 0.2
    """Upper clip range: the ratio is clipped above at 1 + epsilon_high. 0.2 as in PPO; DAPO (arXiv 2503.14476)
    recommends 0.28 ("clip-higher") to keep exploration alive."""

    loss_type: LossType = "grpo"
    """Token aggregation: "grpo" (per-sequence mean, the OPERA / DeepSeekMath objective, biased toward short wrong
    answers), "dr_grpo" (constant normalizer, Dr. GRPO arXiv 2503.20783) or "dapo" (token mean, DAPO). "grpo" matches
    the papers reproduced here; "dr_grpo" removes the length bias."""

    advantage_scale: AdvantageScale = "none"
    """Advantage normalization: "none" is OPERA Eq. 2 (r - mean); "std" divides by the group std as in DeepSeekMath
    GRPO and MultiAgent-OPD Eq. 1. Dr. GRPO argues against the std (question-difficulty bias). "none" for MAPGRPO,
    "std" for MultiAgent-OPD."""

    learning_rate: float = 1e-5
    """AdamW learning rate of the trained adapter. OPERA: 5e-6 / 1e-5 / 2e-5 for the Plan / Analysis-Answer / Rewrite
    agents; MultiAgent-OPD: 1e-6 for full fine-tuning. Recommended 1e-5 for LoRA."""

    gradient_accumulation_steps: int = 1
    """Micro-batches accumulated per optimizer step; the effective batch grows by this factor. Recommended 1 unless
    memory forces smaller micro-batches."""

    max_grad_norm: float = 1.0
    """Global gradient-norm clip before each optimizer step (standard for PPO / GRPO). Recommended 1.0."""

    temperature: float = 1.0
    """Sampling temperature of the rollouts; log-probs are computed at the same temperature so the ratio is exact.
    Recommended 1.0 (on-policy sampling)."""

    top_p: float = 1.0
    """Nucleus-sampling threshold of the rollouts. Values below 1.0 make samples off-policy for the loss; recommended
    1.0."""

    max_completion_length: int = 256
    """Generation budget in tokens per completion; also the Dr. GRPO normalizer B * max_completion_length. 256 fits
    OPERA's plans and answers."""

    num_iterations: int = 1
    """Policy updates per batch of rollouts, mu in GRPO (DeepSeekMath Alg. 1). With 1 the ratio is always 1 and
    pi_old needs no extra forward pass; MultiAgent-OPD uses 5 PPO minibatch updates. Recommended 1."""

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"GRPOConfig.{name} must be an int; got {value!r} ({type(value).__name__}).")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"GRPOConfig.{name} must be a number; got {value!r} ({type(value).__name__}).")
        _check_menu("loss_type", self.loss_type, get_args(LossType))
        _check_menu("advantage_scale", self.advantage_scale, get_args(AdvantageScale))
        _check_range("group_size", self.group_size, self.group_size >= 2, "an integer >= 2 (a group needs a baseline)")
        _check_range("beta", self.beta, self.beta >= 0, ">= 0 (0.0 disables the KL penalty)")
        _check_range("epsilon_low", self.epsilon_low, 0 <= self.epsilon_low < 1, "in [0, 1)")
        _check_range("epsilon_high", self.epsilon_high, self.epsilon_high >= 0, ">= 0")
        _check_range("learning_rate", self.learning_rate, self.learning_rate > 0, "> 0")
        _check_range(
            "gradient_accumulation_steps", self.gradient_accumulation_steps, self.gradient_accumulation_steps >= 1,
            "an integer >= 1",
        )  # fmt: skip
        _check_range("max_grad_norm", self.max_grad_norm, self.max_grad_norm > 0, "> 0")
        _check_range("temperature", self.temperature, self.temperature > 0, "> 0")
        _check_range("top_p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]")
        _check_range(
            "max_completion_length", self.max_completion_length, self.max_completion_length >= 1, "an integer >= 1"
        )
        _check_range("num_iterations", self.num_iterations, self.num_iterations >= 1, "an integer >= 1")

    @property
    def clip_range(self) -> tuple[float, float]:
        """The interval the ratio is clipped to, (1 - epsilon_low, 1 + epsilon_high)."""
        return (1 - self.epsilon_low, 1 + self.epsilon_high)

    @property
    def uses_reference_model(self) -> bool:
        """Whether reference log-probs are needed (beta > 0)."""
        return self.beta > 0


def _check_menu(name: str, value: object, options: tuple[object, ...]) -> None:
    if value not in options:
        raise ConfigError(f"GRPOConfig.{name}={value!r} is not a valid option; choose one of {list(options)}.")


def _check_range(name: str, value: object, ok: bool, requirement: str) -> None:
    if not ok:
        raise ConfigError(f"GRPOConfig.{name}={value!r} is out of range; it must be {requirement}.")
