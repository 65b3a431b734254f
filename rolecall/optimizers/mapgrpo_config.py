"""Configuration of :class:`~rolecall.optimizers.mapgrpo.MAPGRPO` (one typed, documented field per setting)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo.advantages import AdvantageScale
from rolecall.optimizers.core.policy_update import PolicyUpdateOptions
from rolecall.optimizers.core.run_config import RunConfig
from rolecall.optimizers.rewards.opera import (
    AnalysisRewardWeights,
    PlanRewardWeights,
    RewriteRewardWeights,
    SynthesisRewardWeights,
)
from rolecall.programs.core.options import option

__all__ = ["MAPGRPOConfig", "ExpertSource", "Reference", "SkipGroups", "OPERA_ROLES", "STAGE_ORDER"]

ExpertSource = Literal["gold", "best_of_n", "none"]
Reference = Literal["start", "base"]
SkipGroups = Literal["on_policy", "with_expert"]
OPERA_ROLES = ("plan", "analysis", "rewrite")
STAGE_ORDER = (*OPERA_ROLES, "synthesis")
"""The roles MAPGRPO trains, in training order: the paper's three, then the synthesis role (ours)."""


@dataclass(kw_only=True)
class MAPGRPOConfig(PolicyUpdateOptions, RunConfig):
    """Settings of Multi-Agents Progressive GRPO (OPERA, arXiv 2508.16438, Sec. 4). The run settings (``output_dir``,
    ``seed``, ``resume``, ``num_threads``: program runs at once, ``time_budget_minutes``: the whole compile's budget,
    each stage getting a share proportional to its steps, ``show_progress``) are
    :class:`~rolecall.optimizers.core.run_config.RunConfig`'s."""

    stages: tuple[str, ...] | None = None
    """Roles trained one after another; each stage's inputs come from running the program with the earlier stages
    already trained (Eq. 5-6). Paper order: plan -> analysis -> rewrite. None: the roles ``steps`` names, in the order
    plan -> analysis -> rewrite -> synthesis, synthesis only where the program answers through it (OPERA's
    ``final_synthesis``; ours, the paper trains no synthesis agent)."""
    progressive: bool = True
    """True: MAPGRPO, stage after stage, each collecting its inputs with the earlier agents trained. False: the
    single-stage GRPO baseline (the paper's "GRPO" row): every role's inputs are collected from the starting program
    and the roles' steps interleave over one shared budget."""
    reference: Reference = "start"
    """pi_ref of the KL term (Eq. 4): ``"start"`` is each role's adapter as it is when this optimizer starts (the SFT
    warm start; the base model for an untrained adapter); ``"base"`` is the base model (adapters disabled)."""
    group_size: int = option(4, low=2)
    """G: completions per input, including the expert c_best when there is one (paper YAML: 8; reference code: 12;
    4 on 2 CPU cores, where a plan step executes every candidate downstream). At least 2: a group needs a baseline."""
    steps: dict[str, int] = field(default_factory=lambda: {"plan": 4, "analysis": 8, "rewrite": 3, "synthesis": 4})
    """Optimizer steps per stage. The paper trains 3/2/2 epochs on 7B GPUs; the CPU default is a small budget."""
    inputs_per_step: int = option(4, low=1)
    """Role inputs (groups) per optimizer step: questions in the plan stage, sub-questions in the analysis and
    rewrite stages."""
    collect_questions: int = option(100, low=1)
    """Training questions, drawn from the whole training set, that the program runs at the start of the analysis,
    rewrite and synthesis stages to collect those roles' inputs (their calls on them). The plan stage needs no
    collection: its inputs are every training question."""
    learning_rate: dict[str, float] = field(
        default_factory=lambda: {"plan": 2e-4, "analysis": 3e-4, "rewrite": 3e-4, "synthesis": 3e-4}
    )
    """AdamW learning rate per role. The paper's 5e-6 / 1e-5 / 2e-5 are for full fine-tuning of a 7B model; LoRA on a
    small model needs a rate one to two orders of magnitude larger."""
    kl_beta: dict[str, float] = field(
        default_factory=lambda: {"plan": 0.05, "analysis": 0.05, "rewrite": 0.04, "synthesis": 0.04}
    )
    """KL coefficient per role toward pi_ref = the initial model (Eq. 4; paper YAML 0.05 / 0.05 / 0.04)."""
    epsilon: float = option(0.2, low=1e-6, high=0.99)
    """PPO clipping range (reference code: 0.2)."""
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "grpo"
    """Loss aggregation; see :func:`rolecall.optimizers.core.grpo.grpo_loss`."""
    temperature: float = option(1.0, low=1e-6)
    """Sampling temperature of the G-1 policy candidates (> 0: GRPO needs sampled candidates)."""
    top_p: float = option(1.0, low=1e-6, high=1.0)
    """Nucleus mass of the policy candidates."""
    max_completion_length: int = option(160, low=1)
    """Token budget of one role completion."""
    expert: ExpertSource = "gold"
    """Where c_best comes from: ``"gold"`` (the dataset's gold decomposition / sub-answers / supporting documents),
    ``"best_of_n"`` (the best of ``expert_samples`` extra policy samples by reward) or ``"none"`` (plain GRPO)."""
    plan_logic: Literal["rules", "gold"] = "rules"
    """The Plan Agent's f_logic (Eq. 7, an LLM judge in the paper): ``"rules"`` (placeholders point backwards, no
    repeats, every step used; SFT plans pass it 92-97% of the time, so it carries almost no signal) or ``"gold"``
    (ours: the share of sub-goals asking the gold decomposition's sub-question at their position, where the example
    has one). On the SFT(gold) warm start's 500 held-out plans the gold judge gives 0.73 to the questions answered
    right and 0.41 to the rest; most misses there ask another relation ("mother" for "father")."""
    synthesis_expert: Literal["grounded", "always"] = "grounded"
    """Which synthesis inputs get the gold final answer as c_best: ``"grounded"`` only those whose evidence holds
    every gold sub-answer (the chain was answered right, so the gold answer follows from what the role is shown);
    ``"always"`` every input, which also trains the role to write the gold answer over evidence that contradicts it.
    With off-policy guidance at lr 1e-3 "always" taught the role to ignore its evidence: on 85 held-out questions its
    misses with every sub-answer right went from 12 to 20 (docs/opera-mapgrpo.md)."""
    expert_gradient: bool = False
    """Off-policy guidance: whether c_best also receives gradient, an SFT-like term on the expert (as in LUFFY,
    arXiv 2504.14945). This is *not* the paper's Eq. 11, where c_best only enters the group baseline and gets no
    gradient (False, the default). Tables label a run with it "MAPGRPO + off-policy guidance"."""
    expert_in_baseline: bool = True
    """Where c_best stands: True puts it in the group baseline (the paper's Eq. 11), so whenever gold wins the
    on-policy advantages sum to (G-1)/G * (mean_policy - r_expert) < 0 and every sample is pushed down; False takes
    the baseline over the on-policy samples alone (their advantages sum to 0; c_best's is measured against them)."""
    advantage_scale: AdvantageScale = "none"
    """``"none"``: A = r - mean (the paper's Eq. 2); ``"std"``: divided by the group's standard deviation (GRPO); with
    c_best outside the baseline, the whole group's (c_best included), so a group whose samples agree stays bounded."""
    skip_groups: SkipGroups = "on_policy"
    """Which groups carry no signal and are skipped (counted in ``groups/skipped``, no forward pass): ``"on_policy"``
    (default) when the G-1 policy samples all score the same; ``"with_expert"`` only when c_best scores the same as
    well. Eq. 2's baseline holds c_best, so samples that all score below it each get A = r - mean < 0: the second mode
    keeps that push-down of a (near-deterministic) wrong output, which the first drops to save the forward pass. Such
    groups are counted either way (``groups/flat_below_expert``)."""
    screen_pool: bool = False
    """Keep only the inputs that can teach (ours, dynamic sampling done once per stage, as in DAPO): after a stage
    collects its pool, each input is sampled once (G-1 samples at ``temperature``) and scored, and only those whose
    group would be informative (samples that disagree, or under off-policy guidance a c_best that scores apart from
    them) stay in the pool. A converged warm start answers most inputs the same way every time: on the OPERA SFT row
    at 0.712 EM, 9 of 10 analysis and synthesis steps had no informative group and both stages ended on
    ``stage_patience``. The screening costs one sampling pass over the pool (for the plan stage, also executing every
    screened plan); the log and ``summary.json`` say how many inputs were kept."""
    stage_patience: int = option(5, low=0)
    """A stage ends before its planned steps when its last ``stage_patience`` steps together had fewer than
    ``min_informative`` of their groups informative (a non-zero advantage): it has run out of signal, and its unspent
    share of the time budget goes to the later stages (0: every stage runs its steps). Logged in ``summary.json``'s
    ``stopped``."""
    min_informative: float = option(0.1, low=0.0, high=1.0)
    """The informative share of groups below which ``stage_patience`` ends a stage. A group is informative when it
    trains something: an on-policy sample with a non-zero advantage, or c_best under ``expert_gradient`` (a group
    whose samples all miss still teaches the expert). With the defaults a stage ends after 5 steps in which at most 1
    of 20 groups taught anything."""
    tis_cap: float | None = option(2.0, low=1e-6)
    """Truncated importance sampling of the sampler/trainer mismatch (see
    :attr:`rolecall.optimizers.core.config.TrainerConfig.tis_cap`): each token's advantage is weighted by
    ``min(exp(log pi_old - log pi_sampler), tis_cap)``; None disables it."""
    expert_samples: int = option(4, low=1)
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
    synthesis_weights: SynthesisRewardWeights = field(default_factory=SynthesisRewardWeights)
    """Synthesis stage reward weights (ours): EM and F1 of the final answer against gold."""
    micro_batch_size: int = option(2, low=1)
    """Completions per forward/backward pass (gradients accumulate over a step). Prompts carry demos and passages
    (~1.3k tokens), so each completion costs about 2 GB of activations on CPU: keep this small."""

    def __post_init__(self) -> None:
        super().__post_init__()  # types, ranges, the run settings
        wanted = self.stages if self.stages is not None else tuple(self.steps)
        if not wanted:
            raise ConfigError("option stages must name at least one role, e.g. ('plan', 'analysis', 'rewrite')")
        for name in ("steps", "learning_rate", "kl_beta"):
            table = getattr(self, name)
            missing = [s for s in wanted if s not in table]
            if missing:
                raise ConfigError(f"option {name} has no entry for stage(s) {missing}; it has {sorted(table)}")

    @property
    def policy_samples(self) -> int:
        """G - 1 when an expert fills the last slot, else G."""
        return self.group_size - 1 if self.expert != "none" else self.group_size

    def stage_order(self, answers_through_synthesis: bool) -> tuple[str, ...]:
        """The stages to train: ``stages``, else the roles ``steps`` names in paper order (plan, analysis, rewrite,
        then synthesis, only when ``answers_through_synthesis``), other roles after them."""
        if self.stages is not None:
            return tuple(self.stages)
        order = [r for r in STAGE_ORDER if r in self.steps] + [r for r in self.steps if r not in STAGE_ORDER]
        return tuple(r for r in order if r != "synthesis" or answers_through_synthesis)
