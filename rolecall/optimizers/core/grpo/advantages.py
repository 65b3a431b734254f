"""Group-relative advantages for GRPO-family optimizers.

Three advantage estimators, each one equation of its paper:

- OPERA / MAPGRPO (arXiv 2508.16438), Eq. 2, the mean-centred group advantage::

      A_i = r_i - (1/G) * sum_j r_j

  With an expert candidate c_best injected into the group (Eq. 11), c_best enters the baseline but gets no gradient;
  :func:`gradient_mask` marks the members that do.
- GRPO (DeepSeekMath, arXiv 2402.03300) and MultiAgent-OPD (arXiv 2610.23234), Eq. 1, the standardized advantage,
  computed per (question, role) group for role-wise normalization::

      Â_{r,i} = (R_{r,i} - mu_{x,r}) / (sigma_{x,r} + eps)

- MultiAgent-OPD, Eq. 5, the on-policy-distillation token advantage for Searcher tokens::

      Â_t = beta * M_t * (log pi_T(a_t | h_t) - log pi_old(a_t | h_t))

sigma is the Bessel-corrected sample standard deviation, as in TRL's and veRL's GRPO; a group with a single member has
sigma = 0 (its only advantage is then 0). Advantages are constants of the loss, so every function returns a detached
tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import Literal, get_args

import torch

from rolecall.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "AdvantageScale",
    "all_equal",
    "group_advantages",
    "gradient_mask",
    "role_normalized_advantages",
    "teacher_token_advantages",
]

AdvantageScale = Literal["none", "std"]
"""``"none"``: OPERA Eq. 2, r - mean. ``"std"``: GRPO / MultiAgent-OPD Eq. 1, (r - mean) / (std + eps)."""


def all_equal(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """Whether a group's rewards are all the same (within ``tol``; an empty group too): its advantages are all 0, so
    it carries no signal and RL optimizers skip it.

    Example:
        >>> all_equal([0.5, 0.5, 0.5]), all_equal([0.0, 1.0])
        (True, False)
    """
    return not rewards or max(rewards) - min(rewards) < tol


def _check_scale(scale: str) -> None:
    if scale not in get_args(AdvantageScale):
        raise ConfigError(f"Unknown advantage scale {scale!r}; valid options are {list(get_args(AdvantageScale))}.")


def group_advantages(
    rewards: torch.Tensor,
    *,
    scale: AdvantageScale = "none",
    eps: float = 1e-4,
    baseline_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Computes group-relative advantages for B groups of G candidates each.

    The baseline mean is taken over the members where ``baseline_mask`` is true (default: every member, including an
    injected expert c_best, MAPGRPO Eq. 11). Members outside the baseline still get an advantage relative to it, and
    still belong to the group's spread: ``scale="std"`` divides by the std of every member, since the baseline
    members alone have std 0 whenever they agree (an outside c_best would then get (r - mean) / eps).

    Args:
        rewards: Rewards r_i, shape (B, G).
        scale: ``"none"`` for OPERA Eq. 2, ``"std"`` for MultiAgent-OPD Eq. 1.
        eps: The epsilon added to sigma for ``scale="std"``.
        baseline_mask: Optional boolean (B, G) mask of the members that enter the group baseline.

    Returns:
        Advantages A_i, shape (B, G), detached.

    Raises:
        ValueError: If ``rewards`` is not 2-D, or ``baseline_mask`` has another shape or leaves a group empty.
        ConfigError: If ``scale`` is not one of ``"none"``, ``"std"``.

    Example:
        >>> group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]])).tolist()
        [[0.5, -0.5, -0.5, 0.5]]
    """
    _check_scale(scale)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (B, G); got shape {tuple(rewards.shape)}.")
    rewards = rewards.detach().to(torch.float32) if not rewards.is_floating_point() else rewards.detach()
    if baseline_mask is None:
        weights = torch.ones_like(rewards)
    else:
        if baseline_mask.shape != rewards.shape:
            raise ValueError(
                f"baseline_mask shape {tuple(baseline_mask.shape)} differs from rewards shape {tuple(rewards.shape)}."
            )
        weights = baseline_mask.to(rewards.dtype)
    count = weights.sum(dim=1, keepdim=True)  # (B, 1)
    if bool((count == 0).any()):
        raise ValueError("baseline_mask leaves a group with no member in its baseline; keep at least one per row.")
    mu = (weights * rewards).sum(dim=1, keepdim=True) / count  # (B, 1)
    advantages = rewards - mu  # Eq. 2: A_i = r_i - mean_j r_j
    if scale == "std":
        sigma = _sample_std(rewards)  # (B, 1), the whole group
        advantages = advantages / (sigma + eps)  # OPD Eq. 1
    return advantages


def _sample_std(values: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected std along the last dim, keeping it; 0 for a group of one."""
    if values.shape[-1] < 2:
        return torch.zeros_like(values[..., :1])
    return values.std(dim=-1, keepdim=True, correction=1)


def gradient_mask(is_expert: torch.Tensor) -> torch.Tensor:
    """Marks the group members that receive a policy gradient (MAPGRPO Eq. 11).

    The expert candidate c_best is not sampled from the current policy, so it shapes the baseline of
    :func:`group_advantages` but contributes no gradient. Select the on-policy rows before the loss, e.g.
    ``keep = gradient_mask(is_expert).bool(); grpo_loss(..., advantages=advantages[keep], ...)``, or multiply the mask
    into the completion mask.

    Args:
        is_expert: Boolean tensor (any shape, usually (B, G)), true where the member is an injected expert.

    Returns:
        A float tensor of the same shape: 1.0 for on-policy members, 0.0 for experts.

    Example:
        >>> gradient_mask(torch.tensor([[False, False, True]])).tolist()
        [[1.0, 1.0, 0.0]]
    """
    return (~is_expert.bool()).to(torch.float32)


def role_normalized_advantages(
    rewards: torch.Tensor,
    groups: Sequence[Hashable] | torch.Tensor,
    *,
    scale: AdvantageScale = "std",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Normalizes flat rewards within arbitrary groups, e.g. by (question, role) key (MultiAgent-OPD Eq. 1).

    Role-wise normalization compares a role's reward only with the same role's rewards on the same question (or, for
    Answerer candidates, within the parent workflow), so roles with different reward scales do not mix.

    Args:
        rewards: Flat rewards R_{r,i}, shape (N,).
        groups: One group key per reward: an integer tensor of group ids (N,), or any hashable keys such as
            ``(question_id, role)`` tuples.
        scale: ``"std"`` (default, Eq. 1) or ``"none"`` (mean-centring only, OPERA Eq. 2).
        eps: The epsilon added to sigma.

    Returns:
        Advantages, shape (N,), detached.

    Raises:
        ValueError: If ``rewards`` is not 1-D or ``groups`` has another length.
        ConfigError: If ``scale`` is unknown.

    Example:
        >>> role_normalized_advantages(torch.tensor([1.0, 0.0, 3.0, 5.0]), [("q", "L"), ("q", "L"), "A", "A"],
        ...                            scale="none").tolist()
        [0.5, -0.5, -1.0, 1.0]
    """
    _check_scale(scale)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be flat with shape (N,); got shape {tuple(rewards.shape)}.")
    group_ids = _group_ids(groups, rewards.device)
    if group_ids.shape != rewards.shape:
        raise ValueError(f"groups has {group_ids.numel()} keys but rewards has {rewards.numel()} values.")
    rewards = rewards.detach().to(torch.float32) if not rewards.is_floating_point() else rewards.detach()
    num_groups = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    ones = torch.ones_like(rewards)
    count = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, group_ids, ones)
    total = torch.zeros_like(count).index_add_(0, group_ids, rewards)
    mu = (total / count.clamp(min=1))[group_ids]  # (N,) mu_{x,r} of each reward's group
    advantages = rewards - mu
    if scale == "std":
        squared = torch.zeros_like(count).index_add_(0, group_ids, advantages**2)
        sigma = torch.where(count > 1, (squared / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(squared))
        advantages = advantages / (sigma[group_ids] + eps)  # Eq. 1
    return advantages


def _group_ids(groups: Sequence[Hashable] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Maps group keys to dense integer ids 0..K-1 in order of first appearance."""
    if isinstance(groups, torch.Tensor):
        if groups.is_floating_point() or groups.dim() != 1:
            raise ValueError(f"groups as a tensor must hold 1-D integer ids; got {groups.dtype} {tuple(groups.shape)}.")
        _, dense = torch.unique(groups, return_inverse=True)
        return dense.to(device)
    index: dict[Hashable, int] = {}
    ids = [index.setdefault(key, len(index)) for key in groups]
    return torch.tensor(ids, dtype=torch.long, device=device)


def teacher_token_advantages(
    teacher_logps: torch.Tensor,
    old_logps: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.01,
) -> torch.Tensor:
    """Computes on-policy-distillation token advantages (MultiAgent-OPD Eq. 5).

    The Teacher scores the student's own sampled tokens under the same prefix; tokens the student finds less likely
    than the Teacher get a positive advantage. Masked tokens (prompt, retrieved passages, padding) get 0.

    Args:
        teacher_logps: log pi_T(a_t | h_t), shape (B, T).
        old_logps: log pi_old(a_t | h_t) of the sampling policy, shape (B, T).
        mask: M_t, 1 on the tokens the student generated, shape (B, T).
        beta: The distillation coefficient beta; the paper uses 0.01.

    Returns:
        Token advantages Â_t, shape (B, T), detached; pass them to ``grpo_loss`` as (B, T) advantages.

    Example:
        >>> teacher_token_advantages(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-3.0, -1.0]]),
        ...                          torch.tensor([[1, 1]]), beta=0.5).tolist()
        [[1.0, -0.5]]
    """
    if not (teacher_logps.shape == old_logps.shape == mask.shape):
        raise ValueError(
            f"teacher_logps {tuple(teacher_logps.shape)}, old_logps {tuple(old_logps.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape."
        )
    log_ratio = (teacher_logps - old_logps).detach()  # log pi_T / pi_old
    # where, not a product, so a -inf teacher score on a masked (e.g. padding) token cannot turn into NaN
    return torch.where(mask.bool(), beta * log_ratio, torch.zeros_like(log_ratio))  # Eq. 5: beta * M_t * log ratio
