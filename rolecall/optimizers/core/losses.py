"""The losses an adapter trainer minimises, as small pure functions chosen by name.

Every function takes (B, T) per-token log-probs (0 outside the mask, see :mod:`rolecall.optimizers.core.logprobs`)
or (B,) sequence log-probs and returns ``(loss, metrics)``: a scalar tensor and a flat dict of floats.

- ``"nll"``: completion-only supervised fine-tuning (TRL ``SFTTrainer`` with ``completion_only_loss``):
  ``L = -sum_{i,t} m_{i,t} log pi(o_{i,t}) / sum_{i,t} m_{i,t}``, the mean over every target token of the batch.
- ``"grpo"``: the clipped GRPO surrogate with its three aggregations
  (:func:`rolecall.optimizers.core.grpo.loss.grpo_loss`).
- ``"dpo"``: sigmoid DPO (Rafailov et al., arXiv 2305.18290, Eq. 7) on summed sequence log-probs:
  ``L = -log sigmoid(beta * ((log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))))``.
- ``"token_advantage"``: PPO's clipped surrogate with a per-token advantage A_t, the objective MultiAgent-OPD
  (arXiv 2610.23234) optimises with its Eq. 5 advantages ``A_t = beta * M_t * log(pi_T(a_t|h_t) / pi_old(a_t|h_t))``
  (build them with :func:`rolecall.optimizers.core.grpo.advantages.teacher_token_advantages`), as a token mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo.loss import grpo_loss

__all__ = ["LOSSES", "dpo_loss", "get_loss", "nll_loss", "token_advantage_loss"]


def nll_loss(
    per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Computes the completion-only SFT loss: the mean negative log-likelihood over the masked target tokens.

    ``L = sum_{i,t} w_i * m_{i,t} * (-log pi(o_{i,t})) / N`` with N = ``num_tokens`` or ``sum m``. With all weights
    1 and N the token count of the whole optimizer step this is TRL SFTTrainer's loss (``num_items_in_batch``):
    a long completion counts more than a short one, unlike a mean of per-sequence means.

    Worked example: logps ``[[-1, -2, 0], [-3, 0, 0]]`` with mask ``[[1, 1, 0], [1, 0, 0]]``:
    ``(1 + 2 + 3) / 3 = 2.0``; with ``weights=[1, 0]``: ``(1 + 2) / 3 = 1.0``.

    Args:
        per_token_logps: log pi(o_t), shape (B, T).
        mask: 1 on the target tokens, shape (B, T).
        weights: Per-sequence weights, shape (B,); default all 1.
        num_tokens: The normalizer N, e.g. the target tokens of every micro-batch of one optimizer step under
            gradient accumulation. Default: this batch's masked token count (at least 1).

    Returns:
        ``(loss, metrics)``; metrics: ``loss/nll`` (the loss), ``logps/mean`` (unweighted token mean of log pi over
        this batch's masked tokens) and ``tokens/count``.

    Raises:
        ValueError: If the shapes disagree.

    Example:
        >>> nll_loss(torch.tensor([[-1.0, -2.0]]), torch.tensor([[1, 1]]))[0].item()
        1.5
    """
    if per_token_logps.shape != mask.shape or per_token_logps.dim() != 2:
        raise ValueError(f"per_token_logps {tuple(per_token_logps.shape)} and mask {tuple(mask.shape)} must be (B, T).")
    keep = mask.bool()
    w = torch.ones(keep.size(0), dtype=per_token_logps.dtype, device=keep.device) if weights is None else weights
    if w.shape != (keep.size(0),):
        raise ValueError(f"weights must have shape ({keep.size(0)},); got {tuple(w.shape)}.")
    count = keep.sum()
    nll = torch.where(keep, -per_token_logps, torch.zeros_like(per_token_logps))  # (B, T), 0 off the mask
    denominator = float(num_tokens) if num_tokens is not None else count.clamp(min=1)
    loss = (nll * w.to(nll.dtype)[:, None]).sum() / denominator
    with torch.no_grad():
        mean_logp = float(-nll.sum() / count.clamp(min=1))
    return loss, {"loss/nll": float(loss.detach()), "logps/mean": mean_logp, "tokens/count": float(count)}


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    *,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Computes the sigmoid DPO loss on summed sequence log-probs, and TRL's reward diagnostics.

    Per pair i: ``r_w = beta * (log pi(y_w) - log pi_ref(y_w))``, ``r_l = beta * (log pi(y_l) - log pi_ref(y_l))``,
    ``l_i = -log sigmoid(r_w - r_l)``; ``L = (1/B) sum_i w_i l_i``.

    Worked example: pi(y_w) = -1, pi(y_l) = -3, pi_ref(y_w) = -2, pi_ref(y_l) = -2, beta = 0.5:
    ``r_w = 0.5``, ``r_l = -0.5``, margin 1, ``l = -log sigmoid(1) = log(1 + e^-1) = 0.31326``.

    Args:
        policy_chosen_logps: sum_t log pi(y_w,t), shape (B,).
        policy_rejected_logps: sum_t log pi(y_l,t), shape (B,).
        ref_chosen_logps: sum_t log pi_ref(y_w,t), shape (B,).
        ref_rejected_logps: sum_t log pi_ref(y_l,t), shape (B,).
        beta: The DPO temperature of the implicit reward (0.1 in the paper and TRL).
        weights: Per-pair weights, shape (B,); default all 1.

    Returns:
        ``(loss, metrics)``; metrics: ``loss/dpo``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``
        (batch means of r_w, r_l, r_w - r_l), ``rewards/accuracies`` (fraction with r_w > r_l), ``logps/chosen``
        and ``logps/rejected`` (batch means of the policy's summed log-probs).

    Raises:
        ValueError: If the shapes disagree.
        ConfigError: If ``beta`` is not positive.

    Example:
        >>> t = torch.tensor
        >>> round(dpo_loss(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.0]), beta=0.5)[0].item(), 5)
        0.31326
    """
    shape = tuple(policy_chosen_logps.shape)
    for name, x in (("policy_rejected_logps", policy_rejected_logps), ("ref_chosen_logps", ref_chosen_logps),
                    ("ref_rejected_logps", ref_rejected_logps)):  # fmt: skip
        if tuple(x.shape) != shape or len(shape) != 1:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; every DPO input must be (B,) like {shape}.")
    if not beta > 0:
        raise ConfigError(f"DPO beta must be > 0 (0.1 is usual); got {beta}.")
    chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps.detach())  # (B,)
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps.detach())  # (B,)
    losses = -F.logsigmoid(chosen_rewards - rejected_rewards)  # (B,)
    if weights is not None:
        if tuple(weights.shape) != shape:
            raise ValueError(f"weights must have shape {shape}; got {tuple(weights.shape)}.")
        losses = losses * weights.to(losses.dtype)
    loss = losses.mean()
    with torch.no_grad():
        metrics = {
            "loss/dpo": float(loss.detach()),
            "rewards/chosen": float(chosen_rewards.mean()),
            "rewards/rejected": float(rejected_rewards.mean()),
            "rewards/margins": float((chosen_rewards - rejected_rewards).mean()),
            "rewards/accuracies": float((chosen_rewards > rejected_rewards).float().mean()),
            "logps/chosen": float(policy_chosen_logps.mean()),
            "logps/rejected": float(policy_rejected_logps.mean()),
        }
    return loss, metrics


def token_advantage_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    token_advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float = 0.2,
    *,
    epsilon_high: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Computes PPO's clipped surrogate with per-token advantages, averaged over the masked tokens.

    Per masked token: ``ratio = exp(log pi_theta - log pi_old)``,
    ``l_t = -min(ratio * A_t, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A_t)``; ``L = sum l_t / N`` with
    N = ``num_tokens`` or the masked token count. MultiAgent-OPD feeds its Eq. 5 advantages here (no KL term for
    the Searchers). This is :func:`grpo_loss` with (B, T) advantages, ``beta=0`` and the ``"dapo"`` token mean.

    Worked example, epsilon = 0.2, one sequence, mask all 1, A = [1, -1], ratios exp([0.5, 0]) = [1.6487, 1]:
    token 1 ``-min(1.6487, 1.2) = -1.2``; token 2 ``-min(-1, -1) = 1``; ``L = (-1.2 + 1) / 2 = -0.1``.

    Args:
        per_token_logps: log pi_theta(a_t), shape (B, T), with gradient.
        old_per_token_logps: log pi_old(a_t) of the sampling policy, shape (B, T).
        token_advantages: A_t, shape (B, T).
        mask: M_t, 1 on the tokens the role generated, shape (B, T).
        epsilon: The clip range (lower, and upper unless ``epsilon_high`` is given).
        epsilon_high: The upper clip range (DAPO's clip-higher); default ``epsilon``.
        num_tokens: The normalizer, e.g. the masked tokens of a whole optimizer step.

    Returns:
        ``(loss, metrics)`` with :func:`grpo_loss`'s metrics (``loss/policy``, ``clip/frac``, ``ratio/mean``, ...).

    Example:
        >>> logps = torch.zeros(1, 2, requires_grad=True)
        >>> token_advantage_loss(logps, logps.detach(), torch.tensor([[1.0, 3.0]]), torch.ones(1, 2))[0].item()
        -2.0
    """
    if tuple(token_advantages.shape) != tuple(per_token_logps.shape):
        raise ValueError(f"token_advantages must have shape {tuple(per_token_logps.shape)}; got "
                         f"{tuple(token_advantages.shape)}.")  # fmt: skip
    return grpo_loss(
        per_token_logps,
        old_per_token_logps,
        token_advantages,
        mask,
        epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        loss_type="dapo",
        num_tokens=num_tokens,
    )


LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {
    "nll": nll_loss,
    "grpo": grpo_loss,
    "dpo": dpo_loss,
    "token_advantage": token_advantage_loss,
}
"""The losses by name; :class:`~rolecall.optimizers.core.config.TrainerConfig.loss` picks one."""


def get_loss(name: str) -> Callable[..., Any]:
    """Returns the loss function registered as ``name``.

    Raises:
        ConfigError: If ``name`` is not in :data:`LOSSES` (the message lists the names).

    Example:
        >>> get_loss("nll") is nll_loss
        True
    """
    if name not in LOSSES:
        raise ConfigError(f"Unknown loss {name!r}; valid losses are {sorted(LOSSES)}.")
    return LOSSES[name]
