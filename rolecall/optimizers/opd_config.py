"""The settings of MultiAgent-OPD (:class:`~rolecall.optimizers.opd.OPD`): both stages' loop, rollout, reward and
update settings, checked before any model loads. Its own module so that the optimizer and its Teacher helpers
(:mod:`rolecall.optimizers.opd_teacher`) both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo.advantages import AdvantageScale
from rolecall.optimizers.core.policy_update import PolicyUpdateOptions
from rolecall.optimizers.core.run_config import RunConfig
from rolecall.optimizers.rewards.team import KLEstimator, KLReduction, TeamRewardWeights
from rolecall.programs.core.options import option

__all__ = ["OPDConfig", "KL_ROLES"]

KL_ROLES = ("leader", "answerer")
"""The roles whose reward can carry the KL toward π_T (the paper's two; Searchers get Eq. 5 instead)."""


@dataclass(kw_only=True)
class OPDConfig(PolicyUpdateOptions, RunConfig):
    """Settings of :class:`~rolecall.optimizers.opd.OPD` (the loop settings ``num_threads``,
    ``time_budget_minutes`` (Stage II), ``seed``, ``output_dir`` (Stage I writes to ``<output_dir>/teacher``),
    ``resume``, ``show_progress`` are :class:`RunConfig`)."""

    group_size: int = option(5, low=2)
    """G: team rollouts per question, the Leader's normalization group (paper: 5)."""
    questions_per_step: int = option(2, low=1)
    """Training questions per optimizer step (paper: batch 32 on GPUs)."""
    steps: int = option(8, low=0)
    """Stage II optimizer steps, unless ``time_budget_minutes`` runs out first."""
    train_teacher: bool = True
    """True runs Stage I; False uses the already loaded adapter ``teacher_adapter`` as π_T and skips it."""
    teacher_adapter: str = "opd_teacher"
    """Name of the frozen Teacher adapter (it must differ from every student adapter)."""
    teacher_steps: int = option(8, low=0)
    """Stage I optimizer steps, unless ``teacher_minutes`` runs out first."""
    teacher_minutes: float | None = None
    """Wall-clock minutes of Stage I's loop (None: ``teacher_steps`` alone decide)."""
    temperature: float = option(1.0, low=0.01, high=2.0)
    """Sampling temperature of every role in the rollouts, and of the trainer's and the scoring log-probs (1.0)."""
    answer_candidates: int = option(5, low=1)
    """J: Answerer candidates per request in training (paper: 5); their rewards are normalized within the request."""
    beta: float = option(1.0, low=0.0)
    """β of Eq. 5, the scale of the Searchers' distillation advantages Â_t = β (log π_T - log π_old). Default 1.0; the
    paper's 0.01 (still available) was for its setting: here the Leader and Answerer advantages are unit-size
    (``advantage_scale="std"``) and share one optimizer step of the adapter with the Searcher tokens, so β = 0.01 made
    distillation about 1% of the gradient (``advantage/searcher_share`` in the metrics shows the share)."""
    kl_coef: float = option(1e-3, low=0.0)
    """KL coefficient toward π_T in the rewards of the ``kl_roles`` (paper: 1e-3; 0.0 skips it); none for Searchers."""
    kl_estimator: KLEstimator = "k1"
    """``k1``: kl_t = log π - log π_T (veRL's in-reward KL); ``k3``: Schulman's non-negative estimator."""
    kl_reduction: KLReduction = "mean"
    """KL̂ over a role's generated tokens: ``"mean"`` (default), the per-token KL, a Leader's over all its tokens in the
    rollout (token-weighted across its turns), so a longer response or one more Leader turn costs nothing by itself;
    ``"sum"``, the paper's Σ_t kl_t, under which one more Leader turn cost ~0.04 reward against a +0.017 tool bonus."""
    kl_roles: tuple[str, ...] = ("answerer",)
    """The roles whose reward carries -kl_coef · KL̂(π ‖ π_T): by default only those the Teacher has played (the
    cascaded Searcher -> Answerer Teacher never played the Leader: its summed KL there measured 37-43 nats, a
    penalty on the Leader's length, not on its distance from a policy the Teacher knows); ``("leader", "answerer")``
    is the paper. ``()`` turns the KL off as ``kl_coef=0`` does."""
    advantage_scale: AdvantageScale = "std"
    """Stage II's normalization of the Leader and Answerer groups and of the outcome-only Searchers: ``"std"``, Eq. 1,
    (R - μ) / (σ + ε); ``"none"``, R - μ (Dr. GRPO), whose advantages keep the rewards' scale."""
    teacher_check_questions: int = option(50, low=0)
    """Before Stage II, the Teacher and the starting student answer this many questions greedily (the ``valset``'s
    first, else the trainset's) and are compared question by question (``teacher_check.json``; a warning when the
    Teacher is not better). 0 skips the check."""
    outcome_only: bool = False
    """The ablation: Searchers learn from the team outcome R_EM (group-normalized) instead of the Teacher (Eq. 5)."""
    invalid_reward: float | None = -1.0
    """Total reward of a role output with an invalid action format (paper: -1); None switches the rule off."""
    learning_rate: float = option(2e-4, low=1e-8, high=1.0)
    """AdamW learning rate of both stages. The paper's 1e-6 is full fine-tuning of a 4B model; LoRA on a small model
    needs about two orders of magnitude more (as SPlanRL and MAPGRPO use)."""
    epsilon: float = option(0.2, low=0.0, high=0.99)
    """PPO clip range ε of the ratio (0.2)."""
    micro_batch_size: int = option(4, low=1)
    """Role calls per forward/backward pass (a step's gradients accumulate into one optimizer step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.teacher_adapter.strip():
            raise ConfigError(f"teacher_adapter must be a non-empty adapter name; got {self.teacher_adapter!r}")
        bad = [role for role in self.kl_roles if role not in KL_ROLES]
        if bad:
            raise ConfigError(f"kl_roles has {bad[0]!r}; valid roles are {list(KL_ROLES)} (the Searchers get Eq. 5's "
                              "distillation, not a KL in the reward)")  # fmt: skip

    @property
    def weights(self) -> TeamRewardWeights:
        """The reward weights: the paper's 0.9 / 0.1 / 6 and ``invalid_reward``."""
        return TeamRewardWeights(invalid_reward=self.invalid_reward)
