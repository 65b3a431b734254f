"""Settings of one adapter trainer: the optimizer, batching, clipping and the loss with its coefficients."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo.loss import LossType
from rolecall.optimizers.core.losses import LOSSES

__all__ = ["LORA_LEARNING_RATE", "LRSchedule", "LossName", "TrainerConfig"]

LORA_LEARNING_RATE = 2e-3
"""The AdamW learning rate supervised LoRA training uses by default (SFT's, a cold start's): measured for the default
LoRA (r=8, alpha=32, top half of the layers) on the 135M model (see ``SFTConfig.learning_rate``)."""

LossName = Literal["nll", "grpo", "dpo", "token_advantage"]
"""The losses of :data:`rolecall.optimizers.core.losses.LOSSES`."""

LRSchedule = Literal["constant", "linear"]
"""``constant``: ``learning_rate`` throughout; ``linear``: from ``learning_rate`` down to 0 over the stage."""


@dataclass(kw_only=True)
class TrainerConfig:
    """How an :class:`~rolecall.optimizers.core.trainer.AdapterTrainer` updates its adapter.

    One optimizer step covers ``micro_batch_size * gradient_accumulation_steps`` samples; a call to
    ``AdapterTrainer.step(samples)`` runs as many optimizer steps as that takes (the last may be partial).

    Example:
        >>> TrainerConfig(loss="dpo", beta=0.1).samples_per_step
        8
    """

    loss: LossName = "nll"
    """The loss, by name: ``nll`` (completion-only SFT), ``grpo``, ``dpo`` (sigmoid), ``token_advantage`` (OPD)."""
    learning_rate: float = LORA_LEARNING_RATE
    """AdamW learning rate (each optimizer passes its own; the RL optimizers use ~1e-4 on this LoRA)."""
    lr_schedule: LRSchedule = "constant"
    """``linear`` scales the learning rate by ``1 - progress``, where progress is the larger of the stage's fraction
    of planned steps done and of its time budget spent (so a budget that runs out first still ends near 0), as TRL's
    ``lr_scheduler_type="linear"`` does over its steps (without warm-up)."""
    lr_warmup_steps: int = 0
    """Optimizer steps over which the learning rate rises linearly to its scheduled value: the n-th step (from 0) runs
    at ``(n + 1) / (lr_warmup_steps + 1)`` of it (0: no warm-up)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay on the LoRA parameters (0.0: LoRA is already a small update)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2); PyTorch's defaults."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon; PyTorch's default."""
    micro_batch_size: int = 4
    """Samples per forward/backward pass; lower it to bound memory (a DPO sample is two sequences)."""
    gradient_accumulation_steps: int = 2
    """Micro-batches whose gradients are summed before one optimizer step (the loss is normalized over all of them)."""
    max_grad_norm: float | None = 1.0
    """Clip the adapter's global gradient L2 norm to this before each step (TRL's default 1.0); None: no clipping."""
    beta: float = 0.1
    """DPO: the temperature beta of the implicit reward (Rafailov et al. and TRL use 0.1)."""
    dpo_length_normalize: bool = False
    """DPO: compare per-token mean log-probs instead of sums, so a pair is not won by the shorter completion's smaller
    summed log-prob (the length control of SimPO / R-DPO; it needs a larger ``beta``, SimPO uses 2). Off: the
    sigmoid DPO of Rafailov et al. and TRL."""
    kl_beta: float = 0.0
    """GRPO: the KL coefficient beta toward pi_ref (OPERA Eq. 4; DeepSeekMath 0.04; 0.0 skips the reference pass)."""
    epsilon: float = 0.2
    """GRPO and token_advantage: the lower clip range (the ratio is clipped at 1 - epsilon); PPO's 0.2."""
    epsilon_high: float | None = None
    """GRPO and token_advantage: the upper clip range; None uses ``epsilon`` (DAPO recommends 0.28)."""
    loss_type: LossType = "dapo"
    """GRPO aggregation: ``"grpo"`` per-sequence mean, ``"dr_grpo"`` constant normalizer, ``"dapo"`` token mean."""
    max_completion_length: int | None = None
    """``"dr_grpo"`` only: the generation budget in the normalizer B * max_completion_length."""
    temperature: float = 1.0
    """Logits are divided by it before the log-softmax; set it to the sampling temperature for GRPO/OPD ratios."""
    tis_cap: float | None = 2.0
    """GRPO and token_advantage: truncated importance sampling (TIS) of the sampler/trainer mismatch, as verl's
    ``tis_imp_ratio_cap`` and TRL's ``vllm_importance_sampling_cap`` do. Each token whose sample has
    ``sampler_logps`` weighs its advantage by ``min(exp(log pi_old - log pi_sampler), tis_cap)`` (detached; pi_old is
    the trainer's own forward): the samples were drawn by an engine (vLLM, the KV-cache decoder) whose numerics differ
    from the trainer's, and the weight corrects for it, truncated so that one token cannot dominate. None disables
    the correction (the mismatch metrics are still logged); must be > 0."""
    share_prompt_prefix: bool = True
    """GRPO / token_advantage: micro-batches hold the completions of one prompt together, and a micro-batch whose
    rows share their prompt encodes it once (its KV cache repeated over the rows) instead of once per row."""
    ref_adapter: str | None = None
    """The reference policy of DPO and the GRPO KL: None is the base model (adapters disabled), else this adapter."""

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"loss={self.loss!r} is unknown; valid losses are {sorted(LOSSES)}.")
        if self.lr_schedule not in get_args(LRSchedule):
            raise ConfigError(f"lr_schedule={self.lr_schedule!r}; valid options are {list(get_args(LRSchedule))}.")
        if self.loss_type not in get_args(LossType):
            raise ConfigError(f"loss_type={self.loss_type!r}; valid options are {list(get_args(LossType))}.")
        _positive("learning_rate", self.learning_rate)
        _positive("adam_epsilon", self.adam_epsilon)
        _positive("temperature", self.temperature)
        _positive("beta", self.beta)
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"weight_decay must be >= 0; got {self.weight_decay}.")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"adam_betas must be two values in [0, 1); got {self.adam_betas}.")
        if not isinstance(self.lr_warmup_steps, int) or self.lr_warmup_steps < 0:
            raise ConfigError(f"lr_warmup_steps must be an integer >= 0; got {self.lr_warmup_steps!r}.")
        for name in ("micro_batch_size", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1; got {value!r}.")
        if self.max_grad_norm is not None:
            _positive("max_grad_norm", self.max_grad_norm)
        if self.tis_cap is not None:
            _positive("tis_cap", self.tis_cap, " (2.0 is usual) or None (no correction)")
        if not (math.isfinite(self.kl_beta) and self.kl_beta >= 0):
            raise ConfigError(f"kl_beta must be >= 0 (0.0 disables the KL term); got {self.kl_beta}.")
        if not 0 <= self.epsilon < 1:
            raise ConfigError(f"epsilon must be in [0, 1) (PPO uses 0.2); got {self.epsilon}.")
        if self.epsilon_high is not None and not (math.isfinite(self.epsilon_high) and self.epsilon_high >= 0):
            raise ConfigError(f"epsilon_high must be >= 0 (DAPO uses 0.28) or None; got {self.epsilon_high}.")
        if self.loss == "grpo" and self.loss_type == "dr_grpo" and not (self.max_completion_length or 0) >= 1:
            raise ConfigError(
                f"loss_type='dr_grpo' needs max_completion_length >= 1 (the generation budget); got "
                f"{self.max_completion_length}."
            )

    @property
    def samples_per_step(self) -> int:
        """Samples per optimizer step: ``micro_batch_size * gradient_accumulation_steps``."""
        return self.micro_batch_size * self.gradient_accumulation_steps

    @property
    def clip_high(self) -> float:
        """The upper clip range actually used: ``epsilon_high``, else ``epsilon``."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def _positive(name: str, value: float, hint: str = "") -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number > 0{hint}; got {value!r}.")
