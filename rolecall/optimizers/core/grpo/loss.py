"""The clipped GRPO policy loss with a k3 KL penalty and three token aggregations.

Citations: GRPO, DeepSeekMath (arXiv 2402.03300); OPERA / MAPGRPO (arXiv 2508.16438), Eq. 4
``L = -J_GRPO + beta * D_KL[pi_theta || pi_ref]``; Dr. GRPO (arXiv 2503.20783); DAPO (arXiv 2503.14476), which also
introduced the decoupled clip range ``epsilon_low`` / ``epsilon_high``.

Per completion token t of sequence i (all tensors (B, T), masked tokens contribute nothing)::

    ratio_{i,t} = exp(log pi_theta(o_t) - log pi_old(o_t))
    l_{i,t}     = -min(ratio * A_i, clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * A_i) + beta * k3_{i,t}
    k3_{i,t}    = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1

Aggregation over the masked tokens (|o_i| = completion tokens of sequence i):

- ``"grpo"``:    (1/B) sum_i (1/|o_i|) sum_t l_{i,t}   (per-sequence mean; has a length bias)
- ``"dr_grpo"``: sum_{i,t} l_{i,t} / (B * max_completion_length)   (a constant normalizer, no length bias)
- ``"dapo"``:    sum_{i,t} l_{i,t} / sum_i |o_i|   (token-level mean)
"""

from __future__ import annotations

import logging
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from rolecall.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["LossType", "grpo_loss", "per_token_kl_k3", "selective_log_softmax"]

LossType = Literal["grpo", "dr_grpo", "dapo"]
"""How per-token losses are averaged: GRPO per-sequence mean, Dr. GRPO constant normalizer, DAPO token mean."""


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gathers the log-probability of one class per position without materializing the full log-softmax.

    Equivalent to the naive::

        torch.gather(logits.log_softmax(-1), dim=-1, index=index.unsqueeze(-1)).squeeze(-1)

    but peaks at one row's log-softmax instead of the whole (B, T, V) tensor.

    Args:
        logits: Unnormalized scores, shape (..., V).
        index: Class indices, shape (...), integer.

    Returns:
        log softmax(logits)[index], shape (...), in ``logits``' dtype.

    Example:
        >>> logits = torch.tensor([[0.0, 0.0]])
        >>> round(selective_log_softmax(logits, torch.tensor([1])).item(), 4)
        -0.6931
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)  # (...)
        # one row at a time to bound peak memory; log_softmax(x)_k = x_k - logsumexp(x)
        logsumexp = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return picked - logsumexp
    # x_k - logsumexp(x) loses precision in half precision: take the row's log_softmax instead
    rows = [F.log_softmax(row, dim=-1).gather(-1, i.unsqueeze(-1)) for row, i in zip(logits, index, strict=True)]
    return torch.stack(rows).squeeze(-1)


def per_token_kl_k3(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) per sampled token (http://joschu.net/blog/kl-approx.html).

    ``k3 = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1``: unbiased for tokens sampled from
    pi_theta, and never negative.

    Args:
        per_token_logps: log pi_theta(o_t), shape (B, T).
        ref_per_token_logps: log pi_ref(o_t), shape (B, T).

    Returns:
        k3 per token, shape (B, T).

    Example:
        >>> round(per_token_kl_k3(torch.tensor([0.0]), torch.tensor([1.0])).item(), 4)  # e - 1 - 1
        0.7183
    """
    delta = ref_per_token_logps - per_token_logps
    return torch.exp(delta) - delta - 1


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    ref_per_token_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: LossType = "grpo",
    max_completion_length: int | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Computes the clipped GRPO surrogate plus ``beta`` times the k3 KL, aggregated per ``loss_type``.

    Tokens where ``completion_mask`` is 0 (prompt, padding, tool outputs or retrieved passages inside a completion)
    contribute nothing to the loss and receive exactly zero gradient, whatever their log-probs hold.

    Args:
        per_token_logps: log pi_theta(o_t) with gradient, shape (B, T).
        old_per_token_logps: log pi_old(o_t) of the sampling policy, shape (B, T). With ``num_iterations == 1`` pass
            ``per_token_logps.detach()`` (the ratio is then 1 and the loss is plain policy gradient).
        advantages: A_i per sequence, shape (B,), or per token (e.g. OPD Eq. 5), shape (B, T).
        completion_mask: 1 on the tokens that enter the loss, shape (B, T).
        ref_per_token_logps: log pi_ref(o_t), shape (B, T); required when ``beta > 0``.
        beta: KL coefficient (OPERA Eq. 4).
        epsilon_low: Lower clip range: the ratio is clipped below at 1 - epsilon_low.
        epsilon_high: Upper clip range: the ratio is clipped above at 1 + epsilon_high (DAPO recommends 0.28).
        loss_type: ``"grpo"``, ``"dr_grpo"`` or ``"dapo"`` (see the module docstring).
        max_completion_length: The generation budget; the ``"dr_grpo"`` normalizer is B * max_completion_length.
        num_tokens: ``"dapo"`` only: the token count to divide by, e.g. the total over every micro-batch of one
            optimizer step under gradient accumulation. Default: this batch's masked token count.

    Returns:
        ``(loss, metrics)``: the scalar loss, and a flat dict of floats: ``loss/policy`` (surrogate part),
        ``loss/kl`` (beta times the aggregated KL), ``loss/total``, ``kl/mean`` (token mean of k3; 0.0 without
        ``ref_per_token_logps``), ``kl/approx`` (CleanRL's ``(ratio - 1) - log ratio`` between pi_old and pi_theta),
        ``clip/low_frac``, ``clip/high_frac``, ``clip/frac`` (fractions of tokens where the lower, the upper or either
        clip was active: ratio < 1 - epsilon_low with A < 0, ratio > 1 + epsilon_high with A > 0), ``ratio/mean``,
        ``ratio/min``, ``ratio/max`` and ``tokens/count``.

    Raises:
        ValueError: If the shapes disagree.
        ConfigError: If ``loss_type`` is unknown, a clip range is negative, ``beta > 0`` without reference log-probs,
            or ``"dr_grpo"`` without ``max_completion_length``.

    Example:
        >>> logps = torch.zeros(1, 2, requires_grad=True)
        >>> loss, metrics = grpo_loss(logps, logps.detach(), torch.tensor([1.0]), torch.ones(1, 2))
        >>> loss.item(), metrics["ratio/mean"]
        (-1.0, 1.0)
    """
    _validate(per_token_logps, old_per_token_logps, advantages, completion_mask, ref_per_token_logps, beta,
              epsilon_low, epsilon_high, loss_type, max_completion_length)  # fmt: skip
    mask = completion_mask.bool()  # (B, T)
    zeros = torch.zeros_like(per_token_logps)
    # Masked positions get A = 0 and log ratio 0 (ratio 1) through `where`, not a product: whatever they hold
    # (-inf log-probs of padding, NaN teacher scores), no inf/NaN can reach the loss or the gradient.
    A = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    A = torch.where(mask, A.detach().to(per_token_logps.dtype), zeros)  # (B, T)
    log_ratio = torch.where(mask, per_token_logps - old_per_token_logps.detach(), zeros)  # (B, T)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token_policy = -torch.min(ratio * A, clipped_ratio * A)  # (B, T), the clipped surrogate

    per_token_kl = zeros
    if ref_per_token_logps is not None:
        logps = torch.where(mask, per_token_logps, zeros)  # k3 = 0 on masked tokens
        per_token_kl = per_token_kl_k3(logps, torch.where(mask, ref_per_token_logps.detach(), zeros))  # (B, T)

    def aggregate(per_token: torch.Tensor) -> torch.Tensor:
        return _aggregate(per_token, mask, loss_type, max_completion_length, num_tokens)

    policy_loss = aggregate(per_token_policy)
    kl_loss = beta * aggregate(per_token_kl) if beta != 0.0 else policy_loss.new_zeros(())
    loss = policy_loss + kl_loss  # L = -J + beta * KL (OPERA Eq. 4)

    metrics = _metrics(policy_loss, kl_loss, loss, per_token_kl, log_ratio, ratio, A, mask, epsilon_low, epsilon_high)
    return loss, metrics


def _aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: LossType,
    max_completion_length: int | None,
    num_tokens: float | None,
) -> torch.Tensor:
    """Reduces a (B, T) per-token loss to a scalar over the masked tokens."""
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))  # (B, T)
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()  # (1/B) sum_i (1/|o_i|) sum_t l_{i,t}
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token.size(0) * max_completion_length)  # sum / (B * L_max)
    denominator = float(num_tokens) if num_tokens is not None else mask.sum().clamp(min=1)
    return masked.sum() / denominator  # dapo: sum / sum_i |o_i|


@torch.no_grad()
def _metrics(
    policy_loss: torch.Tensor,
    kl_loss: torch.Tensor,
    loss: torch.Tensor,
    per_token_kl: torch.Tensor,
    log_ratio: torch.Tensor,
    ratio: torch.Tensor,
    A: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> dict[str, float]:
    """CleanRL-style diagnostics, token means over the masked tokens."""
    weights = mask.to(ratio.dtype)
    count = weights.sum()

    def token_mean(x: torch.Tensor) -> float:
        return float((x.to(ratio.dtype) * weights).sum() / count.clamp(min=1))

    is_low_clipped = (ratio < 1 - epsilon_low) & (A < 0)  # the min picked the clipped branch, from below
    is_high_clipped = (ratio > 1 + epsilon_high) & (A > 0)  # ... from above
    masked_ratio = ratio[mask]
    return {
        "loss/policy": float(policy_loss),
        "loss/kl": float(kl_loss),
        "loss/total": float(loss),
        "kl/mean": token_mean(per_token_kl),
        "kl/approx": token_mean((ratio - 1) - log_ratio),
        "clip/low_frac": token_mean(is_low_clipped),
        "clip/high_frac": token_mean(is_high_clipped),
        "clip/frac": token_mean(is_low_clipped | is_high_clipped),
        "ratio/mean": token_mean(ratio),
        "ratio/min": float(masked_ratio.min()) if masked_ratio.numel() else 1.0,
        "ratio/max": float(masked_ratio.max()) if masked_ratio.numel() else 1.0,
        "tokens/count": float(count),
    }


def _validate(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    ref_per_token_logps: torch.Tensor | None,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
    loss_type: str,
    max_completion_length: int | None,
) -> None:
    if loss_type not in get_args(LossType):
        raise ConfigError(f"Unknown loss_type {loss_type!r}; valid options are {list(get_args(LossType))}.")
    shape = tuple(per_token_logps.shape)
    if per_token_logps.dim() != 2:
        raise ValueError(f"per_token_logps must have shape (B, T); got {shape}.")
    others = {"old_per_token_logps": old_per_token_logps, "completion_mask": completion_mask}
    if ref_per_token_logps is not None:
        others["ref_per_token_logps"] = ref_per_token_logps
    for name, tensor in others.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape} like per_token_logps.")
    if tuple(advantages.shape) not in {shape[:1], shape}:
        raise ValueError(f"advantages must have shape ({shape[0]},) or {shape}; got {tuple(advantages.shape)}.")
    if epsilon_low < 0 or epsilon_high < 0:
        raise ConfigError(f"Clip ranges must be >= 0; got epsilon_low={epsilon_low}, epsilon_high={epsilon_high}.")
    if beta != 0.0 and ref_per_token_logps is None:
        raise ConfigError(f"beta={beta} needs ref_per_token_logps; pass them (see ref_logprobs) or set beta=0.0.")
    if loss_type == "dr_grpo" and (max_completion_length is None or max_completion_length < 1):
        raise ConfigError(
            f"loss_type='dr_grpo' divides by B * max_completion_length; got max_completion_length="
            f"{max_completion_length}. Pass the generation budget (GRPOConfig.max_completion_length)."
        )
