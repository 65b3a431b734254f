"""MultiAgent-OPD's role rewards and advantages (Zhao et al., arXiv 2610.23234, Sec. 3; PAPERS.md section 3).

With c_ij the normalized exact match of Answerer candidate j in trajectory τ_i and R_EM,i = max_j c_ij:

- Stage I (cascaded Searcher -> Answerer, the Teacher), Eq. 2::

      R_A,i,j = c_ij
      R_S,i   = 0.9 R_EM,i + 0.1 b_S,i        b_S = 0.5 after one search step, 1 after two or more, else 0

  and a total reward of -1 for an output with an invalid action format.
- Stage II (Leader -> Searchers -> Answerer, the student): R_A,i,j = c_ij as in Stage I, and the Leader, Eq. 6::

      R_L,i = 0.9 R_EM,i + 0.1 min(C_tool,i, 6) / 6

  A KL penalty of 1e-3 toward the Teacher π_T enters the Leader and Answerer rewards before the advantages
  (:func:`kl_penalized_reward`; KL̂ the paper's sum over the role's tokens, or their mean, :func:`teacher_kl`).
- Role-wise normalization, Eq. 1: ``Â_r,i = (R_r,i - μ_x,r) / (σ_x,r + ε)`` over the G trajectories of question x
  (for the Answerer, over the candidates of one request): :func:`role_advantages` (``scale="none"``: R - μ, Dr. GRPO).
- Searcher tokens, Eq. 5: ``Â_t = β M_t (log π_T(a_t|h_t) - log π_old(a_t|h_t))``, β = 0.01:
  :func:`searcher_token_advantages`.

Reading of "a total reward of -1 to any output with an invalid action format": the -1 replaces the reward of the role
whose output was invalid, and only that role's. A Searcher is invalid when any of its turns was (``meta["valid"]``
False: unparseable, unknown action or empty content), an Answerer candidate when it did not parse (None), the Leader
when any of its turns was. The paper states the rule in Stage I; here it applies in both stages
(``TeamRewardWeights.invalid_reward=None`` switches it off).

The formulas are pure functions of numbers; :func:`cascaded_team_rewards` and :func:`hierarchical_team_rewards` read
their inputs from a :class:`~rolecall.programs.team.program.CascadedTeam` / ``HierarchicalTeam`` trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import exact_match
from rolecall.optimizers.core.grpo.advantages import AdvantageScale, group_advantages, teacher_token_advantages
from rolecall.optimizers.core.grpo.loss import per_token_kl_k3
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.team.program import tool_steps

__all__ = [
    "KLEstimator",
    "TeamRewardWeights",
    "TeamRewards",
    "candidate_scores",
    "team_outcome",
    "search_bonus",
    "searcher_reward",
    "answerer_reward",
    "leader_reward",
    "role_advantages",
    "searcher_token_advantages",
    "kl_penalized_reward",
    "teacher_kl",
    "KLReduction",
    "answerer_candidates",
    "cascaded_team_rewards",
    "hierarchical_team_rewards",
]

KLEstimator = Literal["k1", "k3"]
"""``"k1"``: log π - log π_T per token (veRL's in-reward ``kl``); ``"k3"``: Schulman's exp(Δ) - Δ - 1, Δ = log π_T -
log π (never negative)."""

KLReduction = Literal["mean", "sum"]
"""How KL̂ reduces the per-token estimates over a role's generated tokens: ``"sum"``, Σ_t kl_t (the paper, veRL: a
sequence KL, growing with the response's length); ``"mean"``, Σ_t kl_t / |{t : M_t = 1}| (per token, length-free)."""


@dataclass(kw_only=True)
class TeamRewardWeights:
    """Weights of MultiAgent-OPD's Searcher (Eq. 2) and Leader (Eq. 6) rewards (the paper's values)."""

    outcome: float = 0.9
    """Weight of the team outcome R_EM in R_S (Stage I) and R_L (Stage II)."""
    bonus: float = 0.1
    """Weight of the behaviour bonus b_S in R_S and of R_assign = min(C_tool, tool_cap) / tool_cap in R_L."""
    tool_cap: int = 6
    """C_tool saturates here: environment steps with a Searcher search beyond this earn nothing more (paper: 6)."""
    invalid_reward: float | None = -1.0
    """Total reward of a role whose output had an invalid action format (paper: -1); None: no format rule."""

    def __post_init__(self) -> None:
        for name in ("outcome", "bonus"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"TeamRewardWeights.{name} must be in [0, 1], got {value}")
        if self.tool_cap < 1:
            raise ConfigError(f"TeamRewardWeights.tool_cap must be >= 1, got {self.tool_cap}")


# ---------------------------------------------------------------------------------------------- reward formulas
def candidate_scores(candidates: Sequence[str | None], gold_answers: str | Sequence[str]) -> list[float]:
    """c_ij: the normalized exact match of each Answerer candidate (0 for a candidate that did not parse).

    Example:
        >>> candidate_scores(["Varn", "Lyon", None, "the varn."], ["Varn"])
        [1.0, 0.0, 0.0, 1.0]
    """
    return [exact_match(c, gold_answers) if c is not None else 0.0 for c in candidates]


def team_outcome(scores: Sequence[float]) -> float:
    """R_EM,i = max_j c_ij: 1 when any candidate is right (0 without candidates)."""
    return max(scores, default=0.0)


def search_bonus(searches: int, *, reported: bool = True) -> float:
    """b_S: 0.5 when the Searcher reported after one search step, 1 after two or more, 0 otherwise.

    "Otherwise" includes a Searcher that never wrote its own report (the program forced one when the step budget ran
    out): the paper grants the bonus "if the Searcher produces a summary after" its searches.

    Example:
        >>> [search_bonus(n) for n in range(4)], search_bonus(3, reported=False)
        ([0.0, 0.5, 1.0, 1.0], 0.0)
    """
    if not reported or searches <= 0:
        return 0.0
    return 0.5 if searches == 1 else 1.0


def searcher_reward(r_em: float, b_s: float, *, valid: bool = True, weights: TeamRewardWeights | None = None) -> float:
    """R_S = 0.9 R_EM + 0.1 b_S (Stage I, Eq. 2); ``invalid_reward`` (-1) when a turn had an invalid format."""
    w = weights or TeamRewardWeights()
    if not valid and w.invalid_reward is not None:
        return w.invalid_reward
    return w.outcome * r_em + w.bonus * b_s


def answerer_reward(c: float, *, valid: bool = True, weights: TeamRewardWeights | None = None) -> float:
    """R_A,i,j = c_ij (Eq. 2, both stages); ``invalid_reward`` (-1) for a candidate that did not parse."""
    w = weights or TeamRewardWeights()
    if not valid and w.invalid_reward is not None:
        return w.invalid_reward
    return c


def leader_reward(r_em: float, c_tool: int, *, valid: bool = True, weights: TeamRewardWeights | None = None) -> float:
    """R_L = 0.9 R_EM + 0.1 R_assign, R_assign = min(C_tool, 6) / 6 (Stage II, Eq. 6); ``invalid_reward`` (-1) when a
    Leader turn had an invalid format.

    Example:
        >>> round(leader_reward(1.0, 3), 4), leader_reward(0.0, 0), leader_reward(0.0, 9)
        (0.95, 0.0, 0.1)
    """
    w = weights or TeamRewardWeights()
    if not valid and w.invalid_reward is not None:
        return w.invalid_reward
    r_assign = min(c_tool, w.tool_cap) / w.tool_cap
    return w.outcome * r_em + w.bonus * r_assign


# ---------------------------------------------------------------------------------------------- advantages
def role_advantages(
    rewards: Sequence[float] | torch.Tensor, *, eps: float = 1e-4, scale: AdvantageScale = "std"
) -> torch.Tensor:
    """Role-wise normalization (Eq. 1): Â_r,i = (R_r,i - μ_x,r) / (σ_x,r + ε) over one group; with
    ``scale="none"``, Â_r,i = R_r,i - μ_x,r (Dr. GRPO's unscaled form).

    A group is the G rewards of one role on one question (Leader), or the J candidate rewards of one Answerer request
    (its parent workflow). σ is the Bessel-corrected sample std (veRL's GRPO); a group whose rewards are all equal
    (or has one member) gets advantage 0. Naive equivalent for a (G,) group:
    ``(r - r.mean()) / (r.std() + eps)`` with ``r.std()`` read as 0 for G = 1.

    Args:
        rewards: R_r,i of one group, shape (G,), or B groups, shape (B, G).
        eps: ε, > 0, so an all-equal group divides 0 by ε instead of by 0.
        scale: ``"std"`` (Eq. 1) or ``"none"`` (R - μ).

    Returns:
        Advantages of the same shape, detached.

    Raises:
        ConfigError: If ``eps`` is not positive, or ``scale`` is unknown.
        ValueError: If ``rewards`` is neither (G,) nor (B, G).

    Example:
        >>> role_advantages([1.0, 1.0, 1.0]).tolist()
        [0.0, 0.0, 0.0]
        >>> role_advantages([1.0, 0.0, 0.5], scale="none").tolist()
        [0.5, -0.5, 0.0]
    """
    if not eps > 0:
        raise ConfigError(f"eps must be > 0 so an all-equal group cannot divide by zero, got {eps}")
    r = torch.as_tensor(rewards, dtype=torch.float32) if not isinstance(rewards, torch.Tensor) else rewards
    if r.dim() not in (1, 2):
        raise ValueError(f"rewards must have shape (G,) or (B, G); got shape {tuple(r.shape)}.")
    advantages = group_advantages(r.reshape(-1, r.shape[-1]), scale=scale, eps=eps)  # (B, G): Eq. 1
    return advantages.reshape(r.shape)


def searcher_token_advantages(
    teacher_per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 0.01,
) -> torch.Tensor:
    """On-policy-distillation advantages of Searcher tokens (Eq. 5): Â_t = β M_t (log π_T(a_t|h_t) - log π_old).

    The Teacher scores the student's own tokens under the same role prompt, subtask and passages. M_t is 1 on the
    tokens the Searcher generated and 0 on retrieved passages, prompt and padding, which get exactly 0 (also where a
    masked log-prob is -inf). Naive equivalent: ``beta * mask * (teacher_per_token_logps - old_per_token_logps)``.

    Args:
        teacher_per_token_logps: log π_T(a_t | h_t), shape (T,) or (B, T).
        old_per_token_logps: log π_old(a_t | h_t) of the sampling policy, same shape.
        mask: M_t, same shape (bool or 0/1).
        beta: β (paper: 0.01).

    Returns:
        Â_t, same shape, detached.

    Example:
        >>> searcher_token_advantages(torch.tensor([-1.0, -2.0, -5.0]), torch.tensor([-3.0, -1.0, -1.0]),
        ...                           torch.tensor([1, 1, 0]), beta=0.5).tolist()
        [1.0, -0.5, 0.0]
    """
    return teacher_token_advantages(teacher_per_token_logps, old_per_token_logps, mask, beta=beta)


def teacher_kl(
    per_token_logps: torch.Tensor,
    teacher_per_token_logps: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    estimator: KLEstimator = "k1",
    reduction: KLReduction = "sum",
) -> torch.Tensor:
    """KL̂(π ‖ π_T) of a role's response: the per-token estimates kl_t reduced over its generated tokens (``mask``).

    ``"k1"``: ``kl_t = log π(a_t|h_t) - log π_T(a_t|h_t)``, whose sum is log π(y)/π_T(y), an unbiased single-sample
    estimate of the sequence KL (a token can be negative). ``"k3"``: ``exp(Δ) - Δ - 1`` with Δ = log π_T - log π, never
    negative (:func:`~rolecall.optimizers.core.grpo.loss.per_token_kl_k3`). ``reduction="sum"``: KL̂ = Σ_t M_t kl_t;
    ``"mean"``: KL̂ = Σ_t M_t kl_t / max(Σ_t M_t, 1) (0 for a response without a generated token).

    Args:
        per_token_logps: log π(a_t | h_t) of the policy that sampled the response, shape (T,) or (B, T).
        teacher_per_token_logps: log π_T(a_t | h_t) on the same tokens, same shape.
        mask: 1 on the role's generated tokens (default: all), same shape.
        estimator: ``"k1"`` or ``"k3"``.
        reduction: ``"sum"`` or ``"mean"`` over the masked tokens.

    Returns:
        KL̂, shape () or (B,), detached.

    Raises:
        ConfigError: If ``estimator`` or ``reduction`` is unknown.
        ValueError: If the shapes differ.

    Example:
        >>> logps, teacher = torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-2.0, -2.5, -9.0])
        >>> teacher_kl(logps, teacher, torch.tensor([1, 1, 0])).item()  # (-1 + 2) + (-2 + 2.5)
        1.5
        >>> teacher_kl(logps, teacher, torch.tensor([1, 1, 0]), reduction="mean").item()  # 1.5 / 2 tokens
        0.75
    """
    if estimator not in get_args(KLEstimator):
        raise ConfigError(f"Unknown KL estimator {estimator!r}; valid options are {list(get_args(KLEstimator))}.")
    if reduction not in get_args(KLReduction):
        raise ConfigError(f"Unknown KL reduction {reduction!r}; valid options are {list(get_args(KLReduction))}.")
    shapes = {per_token_logps.shape, teacher_per_token_logps.shape} | ({mask.shape} if mask is not None else set())
    if len(shapes) > 1:
        raise ValueError(
            f"per_token_logps {tuple(per_token_logps.shape)}, teacher_per_token_logps "
            f"{tuple(teacher_per_token_logps.shape)} and mask {None if mask is None else tuple(mask.shape)} must have "
            "one shape."
        )
    if estimator == "k1":
        kl = per_token_logps - teacher_per_token_logps  # (B, T)
    else:
        kl = per_token_kl_k3(per_token_logps, teacher_per_token_logps)  # (B, T)
    keep = mask.bool() if mask is not None else torch.ones_like(kl, dtype=torch.bool)
    kl = torch.where(keep, kl, torch.zeros_like(kl))  # where, so a -inf masked log-prob cannot give NaN
    total = kl.sum(dim=-1)  # () or (B,): Σ_t M_t kl_t
    if reduction == "mean":
        total = total / keep.sum(dim=-1).clamp(min=1).to(total.dtype)
    return total.detach()


def kl_penalized_reward(
    reward: float | torch.Tensor,
    per_token_logps: torch.Tensor,
    teacher_per_token_logps: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    kl_coef: float = 1e-3,
    estimator: KLEstimator = "k1",
    reduction: KLReduction = "sum",
) -> torch.Tensor:
    """A Leader / Answerer reward with the KL penalty toward the Teacher, before advantages: R - kl_coef · KL̂.

    KL̂ reduces a per-token estimate over the role's generated tokens (``mask``, :func:`teacher_kl`). ``"sum"`` (the
    default here, the paper's): as veRL adds ``-kl_coef · kl_t`` to each token's reward and GRPO sums the token rewards
    of a response, so a longer response pays more. ``"mean"``: the per-token KL, which charges a response for how far
    each of its tokens is from π_T, not for its length (what :class:`~rolecall.optimizers.opd.OPD` uses by default).
    ``"k1"`` (default, veRL's in-reward ``kl``): ``kl_t = log π(a_t|h_t) - log π_T(a_t|h_t)``; ``"k3"``: Schulman's
    non-negative estimator. The paper: coefficient 1e-3; no KL for Searchers.

    Args:
        reward: R_L,i or R_A,i,j: a float, or a (B,) tensor for B responses.
        per_token_logps: log π(a_t | h_t) of the policy that sampled the response, shape (T,) or (B, T).
        teacher_per_token_logps: log π_T(a_t | h_t) on the same tokens, same shape.
        mask: 1 on the role's generated tokens (default: all), same shape.
        kl_coef: the KL coefficient (paper: 1e-3).
        estimator: ``"k1"`` or ``"k3"``.
        reduction: ``"sum"`` (paper) or ``"mean"`` over the masked tokens.

    Returns:
        The penalized reward, shape () or (B,), detached.

    Raises:
        ConfigError: If ``estimator`` or ``reduction`` is unknown.
        ValueError: If the shapes differ.

    Example:
        >>> r = kl_penalized_reward(1.0, torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.5]), kl_coef=0.1)
        >>> round(r.item(), 4)  # 1 - 0.1 * ((-1 + 2) + (-2 + 2.5))
        0.85
        >>> r = kl_penalized_reward(1.0, torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.5]), kl_coef=0.1,
        ...                         reduction="mean")
        >>> round(r.item(), 4)  # 1 - 0.1 * 1.5 / 2
        0.925
    """
    kl = teacher_kl(per_token_logps, teacher_per_token_logps, mask, estimator=estimator, reduction=reduction)
    reward = torch.as_tensor(reward, dtype=kl.dtype, device=kl.device)
    return (reward - kl_coef * kl).detach()  # () or (B,)


# ---------------------------------------------------------------------------------------------- from a trajectory
@dataclass
class TeamRewards:
    """The role rewards of one team trajectory τ_i.

    Attributes:
        outcome: R_EM,i = max_j c_ij.
        scores: c_ij of each Answerer candidate.
        answerer: R_A,i,j of each candidate (-1 where it did not parse).
        searcher: R_S,i of the Stage-I Searcher; None in Stage II (its tokens get Eq. 5 instead).
        leader: R_L,i; None in Stage I.
        searches: the Searchers' own valid search actions (Stage I: the one Searcher's, the b_S count; Stage II: all
            Searchers' together, so training logs show whether the Searchers keep searching).
        tool_steps: C_tool,i.
    """

    outcome: float
    scores: list[float] = field(default_factory=list)
    answerer: list[float] = field(default_factory=list)
    searcher: float | None = None
    leader: float | None = None
    searches: int = 0
    tool_steps: int = 0

    def metrics(self) -> dict[str, float]:
        """A flat dict with namespaced keys (a role without a reward in this stage is left out)."""
        out = {
            "reward/outcome": self.outcome,
            "reward/answerer": sum(self.answerer) / len(self.answerer) if self.answerer else 0.0,
            "team/candidates": float(len(self.answerer)),
            "team/searches": float(self.searches),
            "team/tool_steps": float(self.tool_steps),
        }
        if self.searcher is not None:
            out["reward/searcher"] = self.searcher
        if self.leader is not None:
            out["reward/leader"] = self.leader
        return out


def answerer_candidates(trajectory: Trajectory) -> list[str | None]:
    """The candidates of the last Answerer call (``meta["candidates"]``; None for one that did not parse)."""
    calls = trajectory.role_steps("answerer")
    return list(calls[-1].meta.get("candidates", [])) if calls else []


def _valid_searches(turns: Sequence[Step]) -> int:
    """Searcher turns that were the Searcher's own valid ``search`` action (not one the program ran in its place)."""
    return sum(1 for s in turns if s.meta.get("action") == "search" and s.meta.get("valid"))


def _answerer_rewards(scores: list[float], candidates: list[str | None], w: TeamRewardWeights) -> list[float]:
    return [answerer_reward(c, valid=cand is not None, weights=w) for c, cand in zip(scores, candidates, strict=True)]


def cascaded_team_rewards(
    trajectory: Trajectory,
    gold_answers: str | Sequence[str],
    *,
    searcher: int = 1,
    weights: TeamRewardWeights | None = None,
) -> TeamRewards:
    """Stage I rewards of a :class:`~rolecall.programs.team.program.CascadedTeam` run: R_S and every R_A,i,j.

    The Searcher's search steps are its turns with ``meta["action"] == "search"`` and ``meta["valid"]`` (searches the
    program ran in place of an unusable output are not the Searcher's); it reported when a turn was a valid
    ``"report"``; it was valid when every turn was.

    Args:
        trajectory: the run's trajectory.
        gold_answers: the reference answer and its aliases.
        searcher: which Searcher (``meta["searcher"]``; the cascade has one, number 1).
        weights: the reward weights.
    """
    w = weights or TeamRewardWeights()
    candidates = answerer_candidates(trajectory)
    scores = candidate_scores(candidates, gold_answers)
    r_em = team_outcome(scores)
    turns = [s for s in trajectory.role_steps("searcher") if s.meta.get("searcher") == searcher]
    searches = _valid_searches(turns)
    reported = any(s.meta.get("action") == "report" and s.meta.get("valid") for s in turns)
    valid = all(s.meta.get("valid", False) for s in turns)
    b_s = search_bonus(searches, reported=reported)
    return TeamRewards(
        outcome=r_em,
        scores=scores,
        answerer=_answerer_rewards(scores, candidates, w),
        searcher=searcher_reward(r_em, b_s, valid=valid, weights=w),
        searches=searches,
        tool_steps=tool_steps(trajectory),
    )


def hierarchical_team_rewards(
    trajectory: Trajectory, gold_answers: str | Sequence[str], *, weights: TeamRewardWeights | None = None
) -> TeamRewards:
    """Stage II rewards of a :class:`~rolecall.programs.team.program.HierarchicalTeam` run: R_L and every R_A,i,j.

    C_tool is :func:`~rolecall.programs.team.program.tool_steps`. The Leader was valid when every one of its turns was
    (``meta["valid"]``: a parsed delegation with subtasks, or an answer with a usable selection). A Leader that
    delegates nothing (answers at once) is valid with C_tool = 0. ``searches`` counts every Searcher's valid search
    turns (no reward uses it; it is the search count the ablation is about). The KL toward the Teacher needs log-probs,
    so it is applied afterwards with :func:`kl_penalized_reward`.
    """
    w = weights or TeamRewardWeights()
    candidates = answerer_candidates(trajectory)
    scores = candidate_scores(candidates, gold_answers)
    r_em = team_outcome(scores)
    c_tool = tool_steps(trajectory)
    valid = all(s.meta.get("valid", False) for s in trajectory.role_steps("leader"))
    return TeamRewards(
        outcome=r_em,
        scores=scores,
        answerer=_answerer_rewards(scores, candidates, w),
        leader=leader_reward(r_em, c_tool, valid=valid, weights=w),
        searches=_valid_searches(trajectory.role_steps("searcher")),
        tool_steps=c_tool,
    )
