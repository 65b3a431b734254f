"""Search-R1 trained with plain GRPO (Jin et al., arXiv 2503.09516, Sec. 3; GRPO: Shao et al., arXiv 2402.03300).

The ``search_r1`` baseline's one policy π_θ (the ``agent`` role's LoRA adapter) is trained on whole rollouts. For each
training question q, G rollouts y_1..y_G run the program with the agent sampled at temperature T; each is scored
with the outcome reward plus the per-turn format penalty (:mod:`rolecall.optimizers.rewards.search_r1`):

    r_i = EM(a_i, a*) - λ_f · 1[some turn of y_i was malformed]
    A_i = (r_i - mean_j r_j) / (std_j r_j + eps)                                   (GRPO, within q's G rollouts)
    L   = -(1/Σ|o|) Σ_i Σ_t I(o_i,t) min(ρ_i,t A_i, clip(ρ_i,t, 1-ε, 1+ε) A_i) + β KL(π_θ || π_ref)

Every token the agent wrote in rollout i carries A_i. I(o_t) masks retrieved tokens: in the paper the rollout is one
completion with ``<information>`` blocks inserted, and those tokens get no loss. Here each turn is a *separate* role
call whose prompt holds the question and the interaction so far (earlier turns and their ``<information>``
passages, an input field), and whose completion holds only what the model wrote (reasoning and the action tag). So
retrieved text is always prompt, never completion, and every completion token is the model's own (loss mask 1);
a program that did splice passages into a completion would record ``meta["masked_spans"]`` and the core's
:func:`~rolecall.optimizers.core.samples.samples_from_trajectory` would mask them. Each LM call of a turn (DSPy's
ChatAdapter attempt and, when that failed to parse, its JSON fallback) becomes one
:class:`~rolecall.optimizers.core.sample.TrainingSample` with exactly the messages it saw.

The loss aggregation is ``"dapo"`` (a token mean over the step's loss tokens) with symmetric clipping ε = 0.2:
Search-R1's veRL loss is a masked token mean over the batch, so splitting a rollout into its turns does not change
any token's weight (``"grpo"``, a per-sequence mean, would weigh a short turn's tokens more). β = 0 by default
(the reference pass is skipped; Search-R1 used 0.001 for full fine-tuning).

The loop is :class:`~rolecall.optimizers.core.base.WeightOptimizer`'s (one stage, a time budget, a checkpoint every
step, resume, ``metrics.jsonl``). A step: ``collect`` (``questions_per_step`` questions) -> ``generate`` (their G
rollouts each, all concurrent, so their LM calls batch together) -> ``score`` (rewards, advantages; groups whose
rewards are all equal carry no signal and are skipped: ``groups/skipped``) -> ``update`` (one optimizer step).
``program.compile(optimizer=[SFT(...), SearchR1GRPO(...)])`` starts from a warm-started agent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core.base import WeightOptimizer
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.grpo.advantages import AdvantageScale, all_equal, group_advantages
from rolecall.optimizers.core.grpo.loss import LossType
from rolecall.optimizers.core.policy_update import PolicyUpdateOptions, policy_passes
from rolecall.optimizers.core.role_sampling import role_lm_overrides
from rolecall.optimizers.core.run_config import RunConfig
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.samples import samples_from_trajectory
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.mapgrpo_roles import GoldRecord, as_gold_record
from rolecall.optimizers.rewards.search_r1 import DEFAULT_FORMAT_PENALTY, search_r1_rewards
from rolecall.programs.core.options import option
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.trajectory import Step, Trajectory

__all__ = ["AgentRollouts", "SearchR1GRPO", "SearchR1GRPOConfig", "agent_calls", "group_samples", "rollout_samples"]

logger = logging.getLogger(__name__)

ROLE = "agent"
"""The Search-R1 program's one trained role."""


@dataclass(kw_only=True)
class SearchR1GRPOConfig(PolicyUpdateOptions, RunConfig):
    """Settings of Search-R1's plain GRPO (arXiv 2503.09516; validated on construction). The run settings
    (``output_dir``, ``seed``, ``resume``, ``num_threads``: rollouts run concurrently, ``time_budget_minutes``,
    ``show_progress``) are :class:`~rolecall.optimizers.core.run_config.RunConfig`'s."""

    group_size: int = option(5, low=2)
    """G: rollouts per question, the group the advantage is normalized in (Search-R1: 5)."""
    questions_per_step: int = option(4, low=1)
    """Questions (groups) per optimizer step (Search-R1: 512 on GPUs; a CPU step is a few)."""
    steps: int = option(20, low=0)
    """Optimizer steps, unless ``time_budget_minutes`` runs out first."""
    advantage_scale: AdvantageScale = "std"
    """``"std"``: A_i = (r_i - mean) / (std + eps), GRPO as the paper trains; ``"none"``: A_i = r_i - mean (Dr. GRPO),
    so a group that differs only by a shaping term gets advantages as small as that term, not unit-size ones."""
    temperature: float = option(1.0, low=1e-6)
    """Sampling temperature of the agent in the rollouts, and of the trainer's log-probs (Search-R1: 1.0); > 0, GRPO
    needs sampled rollouts."""
    top_p: float = option(1.0, low=1e-6, high=1.0)
    """Nucleus mass of the rollouts (Search-R1: 1.0)."""
    format_penalty: float = option(DEFAULT_FORMAT_PENALTY, low=0.0)
    """λ_f, subtracted from a rollout's EM when any turn was malformed (0: Search-R1's outcome-only reward)."""
    graded_format: bool = False
    """Charge λ_f times the share of malformed turns instead of all of it for any (a base model that malforms most
    turns then still gets reward variance within a group)."""
    learning_rate: float = option(2e-4, low=1e-8, high=1.0)
    """AdamW learning rate of the LoRA adapter (Search-R1's 1e-6 is for full fine-tuning of a 3B-7B model)."""
    kl_beta: float = option(0.0, low=0.0)
    """β of the KL toward π_ref (Search-R1: 0.001); 0.0 skips the reference pass."""
    epsilon: float = option(0.2, low=1e-6, high=0.99)
    """PPO clip range ε, symmetric (Search-R1: 0.2)."""
    loss_type: LossType = "dapo"
    """Loss aggregation: ``"dapo"`` is the token mean over the step, Search-R1's (see the module docstring)."""
    micro_batch_size: int = option(2, low=1)
    """Agent calls per forward/backward pass (a step's gradients accumulate into one optimizer step)."""


def agent_calls(trajectory: Trajectory) -> list[Step]:
    """Every LM call of the agent's turns, in order: a turn whose ChatAdapter output failed to parse also made a JSON
    fallback call; each call becomes its own step with exactly the messages and completion of that call."""
    calls = []
    for step in trajectory.role_steps(ROLE):
        attempts = step.meta.get("attempts") or []
        if len(attempts) < 2:
            calls.append(step)
            continue
        for n, attempt in enumerate(attempts, 1):
            for completion in (attempt.get("completions") or [])[:1]:
                # masked spans index the last call's completion; an earlier attempt keeps only its own sampled ids
                meta = step.meta if n == len(attempts) else {"sampled": attempt.get("sampled")}
                calls.append(replace(step, messages=attempt["messages"], completion=completion, meta=meta))
    return calls


def rollout_samples(
    trajectory: Trajectory, tokenizer_or_lm: Any, *, adapter: str, advantage: float
) -> list[TrainingSample]:
    """One GRPO sample per agent LM call of a rollout, each carrying the rollout's advantage A_i.

    Malformed turns are kept (the format penalty must reach them); the prompt is the call's own messages, so the
    passages it was shown are prompt tokens, and the completion is what the model wrote (loss mask 1, except
    ``meta["masked_spans"]`` a program recorded).
    """
    calls = agent_calls(trajectory)
    return samples_from_trajectory(calls, tokenizer_or_lm, roles=(ROLE,), adapter_of=lambda _: adapter,
                                   include_failed=True, advantage=advantage)  # fmt: skip


def group_samples(
    trajectories: Sequence[Trajectory],
    rewards: Sequence[float],
    tokenizer_or_lm: Any,
    *,
    adapter: str,
    scale: AdvantageScale = "std",
) -> list[TrainingSample] | None:
    """The samples of one question's G rollouts with A_i = (r_i - mean r) / (std r + eps); None when all r_i are
    equal (no signal: the group is skipped)."""
    if all_equal(rewards):
        return None
    advantages = group_advantages(torch.tensor([list(rewards)]), scale=scale)[0]  # (G,)
    return [s for traj, a in zip(trajectories, advantages.tolist(), strict=True)
            for s in rollout_samples(traj, tokenizer_or_lm, adapter=adapter, advantage=a)]  # fmt: skip


@dataclass(kw_only=True)
class AgentRollouts:
    """What :meth:`SearchR1GRPO.generate` ran for one step: G rollouts per question, in ``batch`` order."""

    batch: list[GoldRecord]
    """The step's training questions (from ``collect``)."""
    trajectories: list[list[Trajectory]]
    """Each question's G rollout trajectories (``group_size``), the agent sampled at ``temperature``."""


class SearchR1GRPO(WeightOptimizer[list[GoldRecord], AgentRollouts, AgentRollouts]):
    """Trains the ``search_r1`` program's agent with GRPO over whole rollouts (a ``dspy.Teleprompter``).

    Jin et al., arXiv 2503.09516 (see the module docstring for the objective and the masking).

    Args:
        config: a :class:`SearchR1GRPOConfig`; keyword arguments override its fields (``SearchR1GRPO(group_size=4)``).

    Example:
        >>> program = SearchR1Agent(BM25(world.corpus), lm=LocalLM())                        # doctest: +SKIP
        >>> program.compile(optimizer=SearchR1GRPO(group_size=5, steps=10), trainset=world.train)  # doctest: +SKIP
    """

    def __init__(self, config: SearchR1GRPOConfig | None = None, **overrides: Any) -> None:
        self.grpo_config = cfg = SearchR1GRPOConfig.merged(config, overrides)
        super().__init__(cfg.loop_config("sequential"))

    # ------------------------------------------------------------------ the weight-optimizer contract
    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **kw: Any) -> Any:
        """Train ``student``'s agent adapter in place and return it.

        Raises:
            ConfigError: when the trainset is empty, or the program has no ``agent`` role on a LocalLM adapter view.
        """
        self.records = [as_gold_record(e) for e in trainset]
        if not self.records:
            raise ConfigError("SearchR1GRPO needs a non-empty trainset")
        roles = getattr(student, "roles", {})
        lm = roles[ROLE].lm if ROLE in roles else None
        if lm is None or getattr(lm, "adapter", None) is None or not hasattr(lm, "backend"):
            raise ConfigError(
                f"SearchR1GRPO trains the {ROLE!r} role of the search_r1 program (SearchR1Agent) on a rolecall LocalLM "
                f"adapter view; got {type(student).__name__} with roles {sorted(roles)}. Build it with lm=LocalLM()."
            )
        self.program, self.view = student, lm
        return super().compile(student, trainset=trainset, valset=valset, **kw)

    def backend(self, student: Any) -> Any:
        """The model backend of the agent's LocalLM view."""
        return self.view.backend

    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """One GRPO stage for the agent's adapter, one optimizer step per step (every agent call of the step's
        rollouts fits one step's gradient accumulation)."""
        cfg, adapter, backend = self.grpo_config, self.view.adapter, self.view.backend
        ref_adapter = None  # the base model: right for an untrained adapter (it is the identity)
        if cfg.kl_beta > 0 and not backend.is_identity_adapter(adapter):
            ref_adapter = f"{adapter}_ref"  # a frozen copy of the warm-started agent
            backend.copy_adapter(adapter, ref_adapter)
        calls = 2 * (int(getattr(student, "max_turns", 4)) + 1)  # turns + forced answer, each maybe a JSON fallback
        per_step = cfg.questions_per_step * cfg.group_size * calls
        trainer = TrainerConfig(
            loss="grpo",
            learning_rate=cfg.learning_rate,
            micro_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=max(1, math.ceil(per_step / cfg.micro_batch_size)),
            kl_beta=cfg.kl_beta,
            epsilon=cfg.epsilon,
            epsilon_high=cfg.epsilon,
            loss_type=cfg.loss_type,
            max_completion_length=self._max_tokens(),
            temperature=cfg.temperature,
            ref_adapter=ref_adapter,
            **cfg.trainer_fields(),
        )
        return [Stage(name=ROLE, adapter=adapter, steps=cfg.steps, trainer=trainer, roles=(ROLE,))]

    def collect(self, ctx: StepContext) -> list[GoldRecord]:
        """The step's ``questions_per_step`` training questions."""
        return ctx.take(self.records, min(self.grpo_config.questions_per_step, len(self.records)))

    def generate(self, ctx: StepContext, batch: list[GoldRecord]) -> AgentRollouts:
        """G sampled rollouts of the whole program per question, all concurrently."""
        cfg = self.grpo_config
        jobs = [record for record in batch for _ in range(cfg.group_size)]
        with role_lm_overrides(self.program, {ROLE: {"temperature": cfg.temperature, "top_p": cfg.top_p}}):
            predictions = parallel_map(lambda r: self.program(question=r.question), jobs, max_workers=cfg.num_threads)
        groups = [predictions[i : i + cfg.group_size] for i in range(0, len(jobs), cfg.group_size)]
        return AgentRollouts(batch=batch, trajectories=[[p.trajectory for p in g] for g in groups])

    def score(self, ctx: StepContext, rollouts: AgentRollouts) -> tuple[list[TrainingSample], dict[str, float]]:
        """Rewards of every rollout, advantages within each question's group, one sample per agent call; groups whose
        rewards are all equal are skipped (``groups/skipped``)."""
        samples: list[TrainingSample] = []
        terms: dict[str, list[float]] = {}
        skipped = 0
        for record, trajectories in zip(rollouts.batch, rollouts.trajectories, strict=True):
            scored = [self.reward(t, record) for t in trajectories]
            for parts in scored:
                for key, value in parts.items():
                    terms.setdefault(key, []).append(float(value))
            rewards = [parts["reward/total"] for parts in scored]
            group = group_samples(trajectories, rewards, self.view, adapter=ctx.stage.adapter,
                                  scale=self.grpo_config.advantage_scale)  # fmt: skip
            if group is None:
                skipped += 1
            else:
                samples += group
        total = terms.pop("reward/total", [])
        metrics = {
            "reward/mean": _mean(total),
            "reward/std": float(torch.tensor(total).std()) if len(total) > 1 else 0.0,
            "reward/max": max(total, default=0.0),
            **{key: _mean(values) for key, values in terms.items()},
            "groups/skipped": float(skipped),
            "groups/total": float(len(rollouts.batch)),
            "rollouts/count": float(len(total)),
        }
        return samples, metrics

    def update(self, ctx: StepContext, samples: list[TrainingSample], trainer: Any) -> dict[str, float]:
        """``num_iterations`` optimizer passes over the step's samples (:func:`policy_passes`)."""
        return policy_passes(trainer, samples, self.grpo_config.num_iterations)

    def reward(self, trajectory: Trajectory, record: GoldRecord) -> dict[str, float]:
        """The reward terms of one rollout (``reward/total`` is r_i): EM of the final answer minus the format
        penalty (:func:`~rolecall.optimizers.rewards.search_r1.search_r1_rewards`)."""
        config = self.grpo_config
        return search_r1_rewards(trajectory, record.answers, format_penalty=config.format_penalty,
                                 graded_format=config.graded_format)  # fmt: skip

    # ------------------------------------------------------------------ helpers

    def _max_tokens(self) -> int:
        """The agent's token budget (the ``"dr_grpo"`` normalizer)."""
        lm_kwargs = getattr(self.program, "lm_kwargs", {})
        role_kwargs = {**lm_kwargs.get("*", {}), **lm_kwargs.get(ROLE, {})}
        return int(role_kwargs.get("max_tokens") or 96)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
