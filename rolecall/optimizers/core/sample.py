"""The unit every weight optimizer trains on: one role call as token ids, with its loss mask and learning signal.

A :class:`TrainingSample` holds a prompt and a completion exactly as the role saw them (chat template and DSPy
adapter formatting applied; see :func:`rolecall.optimizers.core.samples.samples_from_trajectory`), a per-token loss
mask (text the model did not write, such as retrieved passages inserted into a multi-turn completion, carries 0), and
what the chosen loss needs: nothing for ``nll``, a scalar ``advantage`` for ``grpo``, per-token
``token_advantages`` for ``token_advantage`` (MultiAgent-OPD Eq. 5), a rejected completion for ``dpo``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TrainingSample"]


@dataclass(kw_only=True)
class TrainingSample:
    """One prompt and completion of one role, with its per-token loss mask and learning signal.

    Raises ``ValueError`` on construction when a per-token list does not match its completion's length, a mask holds
    values other than 0/1, the prompt is empty, or ``weight`` is negative or not finite.

    Example:
        >>> s = TrainingSample(role="plan", adapter="plan", prompt_ids=[1, 2], completion_ids=[3, 4], loss_mask=[1, 0])
        >>> s.num_loss_tokens, s.per_token_advantages()
        (1, [0.0, 0.0])
    """

    role: str
    """The role that made the call (``"plan"``, ``"analysis"``, ...)."""
    adapter: str
    """The LoRA adapter trained on this sample; several roles may share one (an adapter group)."""
    prompt_ids: list[int]
    """The prompt tokens: the chat template applied to the role's messages, with the generation prompt."""
    completion_ids: list[int]
    """The target tokens the model writes after the prompt (EOS included where the model would stop on it)."""
    loss_mask: list[int] | None = None
    """Per completion token: 1 gets gradient, 0 does not (inserted passages, tool outputs). None means all ones."""
    advantage: float | None = None
    """The scalar advantage A_i of the whole completion (GRPO); None when the loss needs none."""
    token_advantages: list[float] | None = None
    """Per completion token advantages A_t (MultiAgent-OPD Eq. 5); exclusive with ``advantage``."""
    rejected_ids: list[int] | None = None
    """DPO: the dispreferred completion of the same prompt (``completion_ids`` is then the chosen one)."""
    rejected_loss_mask: list[int] | None = None
    """DPO: the loss mask of ``rejected_ids``; None means all ones."""
    old_logps: list[float] | None = None
    """Per completion token log pi_old: the trainer's own log-probs before this batch's first update (see
    ``AdapterTrainer.policy_logps``), for a batch trained on more than once; None uses the current forward's, detached
    (on-policy: the ratio is exactly 1). Never the sampler's values: those go to ``sampler_logps``."""
    sampler_logps: list[float] | None = None
    """Per completion token log-prob the sampling engine reported for the token it drew (under the distribution it
    drew from: logits over the sampling temperature). The trainer compares them with pi_old to correct the
    sampler/trainer mismatch by truncated importance sampling (``TrainerConfig.tis_cap``); None: no correction."""
    ref_logps: list[float] | None = None
    """Per completion token log pi_ref; None lets the trainer compute them (adapter disabled)."""
    rejected_ref_logps: list[float] | None = None
    """DPO: per token log pi_ref of ``rejected_ids``; None lets the trainer compute them."""
    weight: float = 1.0
    """Scales this sample's share of the loss (>= 0; 0 keeps it in the batch without gradient)."""

    def __post_init__(self) -> None:
        self.prompt_ids = [int(t) for t in self.prompt_ids]
        self.completion_ids = [int(t) for t in self.completion_ids]
        if not self.prompt_ids:
            raise ValueError(f"TrainingSample of role {self.role!r} has an empty prompt; a completion needs a prefix.")
        n = len(self.completion_ids)
        self.loss_mask = _mask("loss_mask", self.loss_mask, n)
        if self.advantage is not None and self.token_advantages is not None:
            raise ValueError("Give either advantage (per completion) or token_advantages (per token), not both.")
        if self.advantage is not None:
            self.advantage = float(self.advantage)
        _check_length("token_advantages", self.token_advantages, n)
        _check_length("old_logps", self.old_logps, n)
        _check_length("sampler_logps", self.sampler_logps, n)
        _check_length("ref_logps", self.ref_logps, n)
        if self.rejected_ids is None:
            for name in ("rejected_loss_mask", "rejected_ref_logps"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is set but rejected_ids is None; give the rejected completion too.")
        else:
            self.rejected_ids = [int(t) for t in self.rejected_ids]
            self.rejected_loss_mask = _mask("rejected_loss_mask", self.rejected_loss_mask, len(self.rejected_ids))
            _check_length("rejected_ref_logps", self.rejected_ref_logps, len(self.rejected_ids))
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"weight must be a finite number >= 0; got {self.weight}.")

    @property
    def num_loss_tokens(self) -> int:
        """Completion tokens that receive gradient (the ones in ``loss_mask``)."""
        return sum(self.loss_mask or ())

    @property
    def num_tokens(self) -> int:
        """Prompt plus completion tokens (plus the rejected completion for DPO): the forward-pass cost."""
        return len(self.prompt_ids) + len(self.completion_ids) + len(self.rejected_ids or ())

    def per_token_advantages(self) -> list[float]:
        """The advantage of each completion token: ``token_advantages``, else ``advantage`` repeated, else zeros."""
        if self.token_advantages is not None:
            return [float(a) for a in self.token_advantages]
        return [self.advantage if self.advantage is not None else 0.0] * len(self.completion_ids)


def _mask(name: str, mask: Sequence[int] | None, n: int) -> list[int]:
    if mask is None:
        return [1] * n
    values = [int(v) for v in mask]
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} values for {n} completion tokens; give one 0/1 per token.")
    if any(v not in (0, 1) for v in values):
        raise ValueError(f"{name} must hold only 0 and 1; got {sorted(set(values))}.")
    return values


def _check_length(name: str, values: Sequence[float] | None, n: int) -> None:
    if values is not None and len(values) != n:
        raise ValueError(f"{name} has {len(values)} values for {n} completion tokens; give one per token.")
