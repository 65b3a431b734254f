"""Configuration of :class:`~rolecall.optimizers.mapgrpo.MAPGRPO` (one typed, documented field per setting)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from rolecall.errors import ConfigError
from rolecall.optimizers.rewards.opera import AnalysisRewardWeights, PlanRewardWeights, RewriteRewardWeights

__all__ = ["MAPGRPOConfig", "ExpertSource", "Reference", "SkipGroups", "OPERA_ROLES"]

ExpertSource = Literal["gold", "best_of_n", "none"]
Reference = Literal["start", "base"]
SkipGroups = Literal["on_policy", "with_expert"]
OPERA_ROLES = ("plan", "analysis", "rewrite")


@dataclass(kw_only=True)
class MAPGRPOConfig:
    """Settings of Multi-Agents Progressive GRPO (OPERA, arXiv 2508.16438, Sec. 4)."""

    stages: tuple[str, ...] = OPERA_ROLES
    """Roles trained one after another; each stage's inputs come from running the program with the earlier stages
    already trained (Eq. 5-6). Paper order: plan -> analysis -> rewrite."""
    progressive: bool = True
    """True: MAPGRPO, stage after stage, each collecting its inputs with the earlier agents trained. False: the
    single-stage GRPO baseline (the paper's "GRPO" row): every role's inputs are collected from the starting program
    and the roles' steps interleave over one shared budget."""
    reference: Reference = "start"
    """pi_ref of the KL term (Eq. 4): ``"start"`` is each role's adapter as it is when this optimizer starts (the SFT
    warm start; the base model for an untrained adapter); ``"base"`` is the base model (adapters disabled)."""
    group_size: int = 8
    """G: completions per input, including the expert c_best when there is one (paper YAML: 8; reference code: 12)."""
    steps: dict[str, int] = field(default_factory=lambda: {"plan": 4, "analysis": 8, "rewrite": 3})
    """Optimizer steps per stage. The paper trains 3/2/2 epochs on 7B GPUs; the CPU default is a small budget."""
    inputs_per_step: int = 4
    """Role inputs (groups) per optimizer step."""
    collect_questions: int = 12
    """Training questions the program runs at the start of a stage to collect that role's inputs."""
    learning_rate: dict[str, float] = field(default_factory=lambda: {"plan": 2e-4, "analysis": 3e-4, "rewrite": 3e-4})
    """AdamW learning rate per role. The paper's 5e-6 / 1e-5 / 2e-5 are for full fine-tuning of a 7B model; LoRA on a
    small model needs a rate one to two orders of magnitude larger."""
    beta: dict[str, float] = field(default_factory=lambda: {"plan": 0.05, "analysis": 0.05, "rewrite": 0.04})
    """KL coefficient per role toward pi_ref = the initial model (Eq. 4; paper YAML 0.05 / 0.05 / 0.04)."""
    epsilon: float = 0.2
    """PPO clipping range (reference code: 0.2)."""
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "grpo"
    """Loss aggregation; see :func:`rolecall.optimizers.core.grpo.grpo_loss`."""
    temperature: float = 1.0
    """Sampling temperature of the G-1 policy candidates."""
    top_p: float = 1.0
    """Nucleus mass of the policy candidates."""
    max_completion_length: int = 160
    """Token budget of one role completion."""
    expert: ExpertSource = "gold"
    """Where c_best comes from: ``"gold"`` (the dataset's gold decomposition / sub-answers / supporting documents),
    ``"best_of_n"`` (the best of ``expert_samples`` extra policy samples by reward) or ``"none"`` (plain GRPO)."""
    expert_gradient: bool = False
    """Off-policy guidance: whether c_best also receives gradient, an SFT-like term on the expert (as in LUFFY,
    arXiv 2504.14945). This is *not* the paper's Eq. 11, where c_best only enters the group baseline and gets no
    gradient (False, the default). Tables label a run with it "MAPGRPO + off-policy guidance"."""
    skip_groups: SkipGroups = "on_policy"
    """Which groups carry no signal and are skipped (counted in ``groups/skipped``, no forward pass): ``"on_policy"``
    (default) when the G-1 policy samples all score the same; ``"with_expert"`` only when c_best scores the same as
    well. Eq. 2's baseline holds c_best, so samples that all score below it each get A = r - mean < 0: the second mode
    keeps that push-down of a (near-deterministic) wrong output, which the first drops to save the forward pass. Such
    groups are counted either way (``groups/flat_below_expert``)."""
    num_iterations: int = 1
    """Optimizer passes over one step's samples (PPO epochs; TRL's ``num_iterations``). With 1, pi_old in the ratio is
    the detached current policy (exactly on-policy, ratio 1); above 1, pi_old is the trainer's own forward before the
    first pass, so the later passes are clipped against the policy that sampled (never the sampler's log-probs: see
    ``tis_cap``)."""
    tis_cap: float | None = 2.0
    """Truncated importance sampling of the sampler/trainer mismatch (see
    :attr:`rolecall.optimizers.core.config.TrainerConfig.tis_cap`): each token's advantage is weighted by
    ``min(exp(log pi_old - log pi_sampler), tis_cap)``; None disables it."""
    expert_samples: int = 4
    """Extra samples drawn to pick c_best when ``expert="best_of_n"``."""
    execute_plans: bool = True
    """f_exec: execute every candidate plan downstream with the current analysis/rewrite agents (expensive but what
    Eq. 7 asks); False scores execution as 0 for all candidates."""
    share_sub_goals: bool = True
    """While executing the plan stage's candidates, solve each distinct filled-in sub-goal once and reuse its answer
    in every plan that shares it (the downstream agents are frozen in that stage, so the answer is the same); False
    runs every plan's sub-goals afresh."""
    plan_weights: PlanRewardWeights = field(default_factory=PlanRewardWeights)
    """Plan Agent reward weights (Eq. 7)."""
    analysis_weights: AnalysisRewardWeights = field(default_factory=AnalysisRewardWeights)
    """Analysis-Answer Agent reward weights (Eq. 9)."""
    rewrite_weights: RewriteRewardWeights = field(default_factory=RewriteRewardWeights)
    """Rewrite Agent reward weights (Eq. 10)."""
    time_budget_s: float | None = None
    """Wall-clock budget of the whole compile; each stage gets a share proportional to its steps and stops when it is
    spent (the checkpoint then holds what was trained)."""
    micro_batch_size: int = 2
    """Completions per forward/backward pass (gradients accumulate over a step). Prompts carry demos and passages
    (~1.3k tokens), so each completion costs about 2 GB of activations on CPU: keep this small."""
    num_threads: int = 16
    """Threads for program runs (LM calls from them are batched together)."""
    output_dir: str | Path | None = None
    """Where the training log (``train_log.jsonl``) and checkpoints go; None keeps nothing on disk (no resume)."""
    resume: bool = False
    """Continue a killed run from the last checkpoint in ``output_dir``."""
    seed: int = 0
    """Seeds input sampling and the policy samplers."""
    show_progress: bool = True
    """tqdm progress bars."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("stages must name at least one role, e.g. ('plan', 'analysis', 'rewrite')")
        if self.group_size < 2:
            raise ConfigError(f"group_size must be >= 2 (a group needs a baseline), got {self.group_size}")
        if self.inputs_per_step < 1 or self.collect_questions < 1:
            raise ConfigError("inputs_per_step and collect_questions must be >= 1")
        if self.reference not in get_args(Reference):
            raise ConfigError(f"reference must be one of {get_args(Reference)}, got {self.reference!r}")
        if self.expert not in get_args(ExpertSource):
            raise ConfigError(f"expert must be one of {get_args(ExpertSource)}, got {self.expert!r}")
        if self.skip_groups not in get_args(SkipGroups):
            raise ConfigError(f"skip_groups must be one of {get_args(SkipGroups)}, got {self.skip_groups!r}")
        if not 0.0 < self.epsilon < 1.0:
            raise ConfigError(f"epsilon must be in (0, 1), got {self.epsilon}")
        if not isinstance(self.num_iterations, int) or self.num_iterations < 1:
            raise ConfigError(f"num_iterations must be an integer >= 1, got {self.num_iterations!r}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 for GRPO sampling, got {self.temperature}")
        if self.tis_cap is not None and not (isinstance(self.tis_cap, (int, float)) and 0 < self.tis_cap < math.inf):
            raise ConfigError(f"tis_cap must be a finite number > 0 (2.0 is usual) or None (no correction), got "
                              f"{self.tis_cap!r}")  # fmt: skip
        if self.resume and self.output_dir is None:
            raise ConfigError("resume=True needs output_dir (where the checkpoint of the killed run lives)")
        for name in ("steps", "learning_rate", "beta"):
            table = getattr(self, name)
            missing = [s for s in self.stages if s not in table]
            if missing:
                raise ConfigError(f"{name} has no entry for stage(s) {missing}; it has {sorted(table)}")

    @property
    def policy_samples(self) -> int:
        """G - 1 when an expert fills the last slot, else G."""
        return self.group_size - 1 if self.expert != "none" else self.group_size

    def stage_budget_s(self, stage: str) -> float | None:
        """This stage's share of :attr:`time_budget_s`."""
        if self.time_budget_s is None:
            return None
        total = sum(self.steps[s] for s in self.stages) or 1
        return self.time_budget_s * self.steps[stage] / total
