"""SPlanRL: D2Plan's two-stage training of the Reasoner (Luo, Wu and Feng, arXiv 2601.08282, Sec. 2.3; PAPERS.md
section 4).

(1) Cold start: SFT (:class:`~rolecall.optimizers.SFT`) on runs kept by the paper's filter ::

        keep(τ) = EM(a_pred, a_gt) = 1  and  #searches(τ) >= 1                      (:func:`cold_start_keep`)

    written by the program itself (``cold_start="self"``, rejection sampling) or by a ``teacher`` LM playing both
    roles (the paper's setting); ``"gold"`` trains on D2Plan's gold path instead, ``"none"`` skips the cold start.

(2) GRPO on the Reasoner's adapter, the Purifier frozen (greedy, its adapter has no stage). For a question q, G = 5
    rollouts o_1..o_G of the whole program, every Reasoner call sampled at ``temperature``:

        R_i = R_f · (α R_p + β R_a + R_ans),  α = β = 0.1                 (rolecall.optimizers.rewards.d2plan)
        A_i = (R_i - mean_j R_j) / (std_j R_j + ε)                         (group-normalized, DeepSeekMath GRPO)
        L   = -1/|T| Σ_i Σ_{t ∈ o_i, M_t = 1} min(ρ_t A_i, clip(ρ_t, 1-ε, 1+ε) A_i) + β_KL KL(π_θ || π_ref)

    The paper's Reasoner is one multi-turn generation; here it is five recorded calls (plan, step, refine, revise,
    answer) sharing one adapter, and each call of rollout i is a :class:`TrainingSample` with advantage A_i on the
    exact messages that call saw (``samples_from_trajectory``). Retrieved text never enters a Reasoner completion:
    the Purifier's notes (or raw passages without it) and the global context are *inputs* of the next Reasoner call,
    so they sit in its prompt, which carries no loss; that is the paper's retrieved-token mask (M_t = 0). The
    ``dapo`` token mean over the step's loss tokens weighs every generated token once, as one multi-turn sequence
    would be. A group whose rewards are all equal has A = 0 everywhere and is skipped (``groups/skipped``).

``use_plan_reward=False`` drops α R_p from R (the "w/o R_p" over-decomposition ablation). Samples are re-tokenized from
the recorded completion text with ChatAdapter's end marker and EOS restored (the core's trajectory -> samples path),
not the sampled token ids; with one pass per batch (on-policy) the ratio is 1 either way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dspy
import torch

from rolecall.data.types import Example
from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import exact_match
from rolecall.optimizers.core.base import RunConfig, WeightOptimizer
from rolecall.optimizers.core.config import LORA_LEARNING_RATE, TrainerConfig
from rolecall.optimizers.core.grpo.advantages import AdvantageScale, all_equal, group_advantages
from rolecall.optimizers.core.policy_update import PolicyUpdateOptions, policy_passes
from rolecall.optimizers.core.role_sampling import role_lm_overrides
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.samples import samples_from_trajectory
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.rewards.d2plan import SPlanRLWeights, splanrl_rewards
from rolecall.optimizers.sft import SFT, trainable_examples
from rolecall.programs.core.options import option
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.d2plan.program import REASONER_ROLES, D2Plan

__all__ = [
    "SPlanRL",
    "SPlanRLConfig",
    "ColdStart",
    "ReasonerRollouts",
    "cold_start_keep",
    "cold_start_metric",
    "max_reasoner_calls",
    "reasoner_group_samples",
]

logger = logging.getLogger(__name__)

ColdStart = Literal["self", "gold", "none"]
"""Where the cold start's SFT targets come from: the program's (or a teacher's) filtered runs, D2Plan's gold path, or
no cold start."""


@dataclass(kw_only=True)
class SPlanRLConfig(PolicyUpdateOptions, RunConfig):
    """Settings of :class:`SPlanRL` (the loop settings ``num_threads``, ``time_budget_minutes`` (the GRPO stage),
    ``seed``, ``output_dir``, ``resume``, ``show_progress`` are :class:`RunConfig`)."""

    group_size: int = option(5, low=2)
    """G: rollouts per question (paper: 5)."""
    temperature: float = option(1.0, low=0.01, high=2.0)
    """Sampling temperature of every Reasoner call in a rollout (the Purifier stays greedy); 1.0 as in GRPO."""
    alpha: float = option(0.1, low=0.0, high=1.0)
    """α: weight of the initial planning reward R_p (paper: 0.1)."""
    beta: float = option(0.1, low=0.0, high=1.0)
    """β: weight of the plan adaptation reward R_a = R_refine + R_revise (paper: 0.1)."""
    lambda_: float = option(0.5, low=0.0, high=1.0)
    """λ: R_revise = λ (R_t + R_q) for a run that revised its plan (paper: 0.5)."""
    advantage_scale: AdvantageScale = "std"
    """``"std"``: A_i = (r_i - mean) / (std + eps), GRPO as the paper trains; ``"none"``: A_i = r_i - mean (Dr. GRPO),
    so a group that differs only by a shaping term gets advantages as small as that term, not unit-size ones."""
    use_plan_reward: bool = True
    """False drops α R_p from R: the paper's "w/o R_p" ablation, where the Reasoner over-decomposes (Table 4)."""
    steps: int = option(8, low=1)
    """GRPO optimizer steps (one per ``questions_per_step`` questions x G rollouts); the budget may stop it first."""
    questions_per_step: int = option(2, low=1)
    """Training questions (groups) per GRPO step."""
    learning_rate: float = option(2e-4, low=1e-8, high=1.0)
    """AdamW learning rate. The paper's 1e-6 is for full fine-tuning of a 7B model; LoRA on a small model needs one
    to two orders of magnitude more (MAPGRPO uses 2e-4 to 3e-4)."""
    kl_beta: float = option(0.0, low=0.0)
    """KL coefficient toward π_ref, the Reasoner adapter as the cold start left it (0.0 skips the reference pass)."""
    epsilon: float = option(0.2, low=0.0, high=0.99)
    """PPO clipping range ε of the ratio (0.2)."""
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "dapo"
    """Loss aggregation (:func:`rolecall.optimizers.core.grpo.grpo_loss`); ``dapo``'s token mean counts every Reasoner
    token of a rollout once, as the paper's single multi-turn sequence."""
    micro_batch_size: int = option(4, low=1)
    """Reasoner calls per forward/backward pass (the step's gradients accumulate into one optimizer step)."""
    cold_start: ColdStart = "self"
    """``self``: SFT on the program's (or ``teacher``'s) runs with an exactly right answer and >= 1 search (the
    paper's filter); ``gold``: SFT on D2Plan's gold path; ``none``: GRPO from the program as it is."""
    cold_start_tries: int = option(4, low=1)
    """``self``: sampled runs per training question in the cold start."""
    cold_start_temperature: float = option(0.7, low=0.0, high=2.0)
    """``self``: sampling temperature of those runs."""
    cold_start_epochs: float = option(2.0, low=0.01)
    """Passes over the cold start's samples (per adapter: the Reasoner's and the Purifier's)."""
    cold_start_learning_rate: float = option(LORA_LEARNING_RATE, low=1e-8, high=1.0)
    """AdamW learning rate of the cold start (SFT's default)."""
    cold_start_max_steps: int | None = None
    """At most this many cold-start optimizer steps per adapter (None: as many as the epochs take)."""
    cold_start_minutes: float | None = None
    """Wall-clock minutes of the cold start's training loop (None: no limit)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cold_start_max_steps is not None and self.cold_start_max_steps < 1:
            raise ConfigError(f"cold_start_max_steps must be >= 1 or None; got {self.cold_start_max_steps}")

    @property
    def weights(self) -> SPlanRLWeights:
        """α, β, λ and the R_p switch of the reward."""
        return SPlanRLWeights(alpha=self.alpha, beta=self.beta, lambda_=self.lambda_,
                              use_plan_reward=self.use_plan_reward)  # fmt: skip


# ---------------------------------------------------------------------------------------------- pure helpers
def cold_start_keep(trajectory: Trajectory, answer: str | None, gold_answers: str | Sequence[str]) -> bool:
    """The cold start's filter: the answer is exactly right and the run searched at least once.

    Equivalent to ``exact_match(answer, gold) == 1 and any(s.kind == "retrieval" for s in trajectory.steps)``.

    Example:
        >>> cold_start_keep(Trajectory(), "Paris", ["Paris"])  # right, but no search
        False
    """
    searched = any(s.kind == "retrieval" for s in trajectory.steps)
    return searched and exact_match(answer or "", gold_answers) == 1.0


def cold_start_metric(example: Example, prediction: Any) -> float:
    """:func:`cold_start_keep` as an SFT metric ``metric(example, prediction) -> 0.0 | 1.0`` (threshold 1.0)."""
    trajectory = getattr(prediction, "trajectory", None) or Trajectory()
    return float(cold_start_keep(trajectory, str(prediction.answer or ""), list(example.answers)))


def max_reasoner_calls(program: D2Plan) -> int:
    """An upper bound on one run's Reasoner calls: ``1 + (S + M)(K + 2) + M + 1``.

    Plan once; each of at most S + M sub-question runs (a revision reruns its position) refines once and takes at
    most K + 1 steps; at most M revisions; one final answer.
    """
    s, m, k = program.max_sub_questions, program.max_revisions, program.max_searches
    return 1 + (s + m) * (k + 2) + m + 1


def reasoner_group_samples(
    trajectories: Sequence[Trajectory],
    rewards: Sequence[float],
    lm: Any,
    *,
    adapter: str,
    roles: Sequence[str] = REASONER_ROLES,
    scale: AdvantageScale = "std",
) -> tuple[list[TrainingSample], list[float]]:
    """One group's GRPO samples: every Reasoner call of rollout i, as its role saw it, with advantage A_i.

    A_i = (R_i - mean_j R_j) / (std_j R_j + ε) (Bessel std, ε = 1e-4). Calls whose output did not parse are kept:
    the policy wrote them and R_f = 0 punishes them. A group whose rewards are all equal gives no samples.

    Args:
        trajectories: the G rollouts' trajectories.
        rewards: R_i of each rollout.
        lm: a ``LocalLM`` (view), ``ModelBackend`` or tokenizer: how the messages are encoded.
        adapter: the trained adapter every sample is for.
        roles: the roles whose calls are trained (the Reasoner's).

    Returns:
        ``(samples, advantages)``; both empty when the rewards are all equal.
    """
    if len(trajectories) != len(rewards):
        raise ValueError(f"{len(trajectories)} rollouts but {len(rewards)} rewards; give one reward per rollout")
    if all_equal(rewards):
        return [], []
    advantages = group_advantages(torch.tensor([list(rewards)], dtype=torch.float64), scale=scale)[0].tolist()  # (G,)
    samples = []
    for trajectory, advantage in zip(trajectories, advantages, strict=True):
        samples += samples_from_trajectory(trajectory, lm, roles=roles, adapter_of=lambda _: adapter,
                                           include_failed=True, advantage=advantage)  # fmt: skip
    return samples, advantages


# ---------------------------------------------------------------------------------------------- the optimizer
@dataclass(kw_only=True)
class ReasonerRollouts:
    """What :meth:`SPlanRL.generate` ran for one step: G whole-program rollouts per question, in ``batch`` order."""

    batch: list[Example]
    """The step's training questions (from ``collect``)."""
    groups: list[list[dspy.Prediction]]
    """Each question's G predictions (``group_size``), each with its ``trajectory`` of Reasoner and Purifier calls."""


class SPlanRL(WeightOptimizer[list[Example], ReasonerRollouts, ReasonerRollouts]):
    """D2Plan's SPlanRL: an SFT cold start, then GRPO on the Reasoner adapter with the Purifier frozen (see module).

    Args:
        config: a :class:`SPlanRLConfig`; keyword arguments override its fields (``SPlanRL(group_size=4)``).
        teacher: ``cold_start="self"``: a ``dspy.LM`` that plays both roles while the cold start collects its runs.
        warm_start: an optimizer run instead of the cold start ``config.cold_start`` describes (an ``SFT`` with
            settings of its own); ``cold_start`` is then not used.

    Example:
        >>> program = D2Plan(BM25(world.corpus), lm=LocalLM())                                        # doctest: +SKIP
        >>> program.compile(optimizer=SPlanRL(cold_start="gold", steps=20), trainset=world.train)      # doctest: +SKIP
    """

    def __init__(
        self, config: SPlanRLConfig | None = None, *, teacher: dspy.LM | None = None, warm_start: Any = None, **kw: Any
    ) -> None:
        self.splanrl_config = cfg = SPlanRLConfig.merged(config, kw)
        if teacher is not None and (cfg.cold_start != "self" or warm_start is not None):
            raise ConfigError("SPlanRL(teacher=...) writes the cold start's runs: use it with cold_start='self' and "
                              "no warm_start")  # fmt: skip
        super().__init__(cfg.loop_config("sequential"))
        self.teacher, self.warm_start = teacher, warm_start
        self.examples: list[Example] = []

    def cold_start_optimizer(self) -> Any:
        """The optimizer run before GRPO: ``warm_start``, else the SFT ``cold_start`` describes (None for "none")."""
        cfg = self.splanrl_config
        if self.warm_start is not None or cfg.cold_start == "none":
            return self.warm_start
        return SFT(
            source=cfg.cold_start,
            tries=cfg.cold_start_tries,
            temperature=cfg.cold_start_temperature,
            threshold=1.0,
            epochs=cfg.cold_start_epochs,
            max_steps=cfg.cold_start_max_steps,
            learning_rate=cfg.cold_start_learning_rate,
            time_budget_minutes=cfg.cold_start_minutes,
            num_threads=cfg.num_threads,
            seed=cfg.seed,
            output_dir=f"{cfg.output_dir}/cold_start" if cfg.output_dir is not None else None,
            resume=cfg.resume,
            show_progress=cfg.show_progress,
            metric=cold_start_metric if cfg.cold_start == "self" else None,
            teacher=self.teacher,
        )

    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **kw: Any) -> Any:
        """Cold-start ``student`` (a D2Plan on a ``LocalLM``), then train its Reasoner with GRPO; returns it.

        Raises:
            ConfigError: the program is not D2Plan or not on a ``LocalLM``, the trainset holds no rolecall
                ``Example``, or the ``self`` cold start kept no run.
        """
        if not isinstance(student, D2Plan):
            raise ConfigError(f"SPlanRL applies to the d2plan program; got {type(student).__name__}")
        self.examples = trainable_examples("SPlanRL", student, trainset, "with gold answers and hop counts")
        cold = self.cold_start_optimizer()
        if cold is not None:
            logger.info("SPlanRL: cold start with %s", type(cold).__name__)
            try:
                student = student.compile(optimizer=cold, trainset=trainset)
            except ConfigError as err:
                if self.warm_start is not None or self.splanrl_config.cold_start != "self":
                    raise
                raise ConfigError(f"SPlanRL cold start: {err}; or use cold_start='gold' (D2Plan's gold path)") from err
        self.program = student
        return super().compile(student, trainset=trainset, valset=valset, **kw)

    # ------------------------------------------------------------------ the weight-optimizer contract
    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """One GRPO stage on the Reasoner's adapter; the Purifier's adapter gets none (frozen).

        Raises:
            ConfigError: the Reasoner calls do not share one adapter, or the Purifier shares it.
        """
        cfg = self.splanrl_config
        roles = tuple(r for r in REASONER_ROLES if r in student.roles)
        adapters = sorted({student.adapter_name(r) for r in roles})
        if len(adapters) != 1:
            raise ConfigError(f"SPlanRL trains the Reasoner as one policy: its calls {list(roles)} must share one "
                              f"adapter (the default group 'reasoner'); they use {adapters}")  # fmt: skip
        adapter = adapters[0]
        if "purifier" in student.roles and student.adapter_name("purifier") == adapter:
            raise ConfigError(f"SPlanRL freezes the Purifier, but it shares the Reasoner's adapter {adapter!r}: give "
                              "it its own (the default adapter groups do)")  # fmt: skip
        backend = self.backend(student)
        ref_adapter = None  # the base model: right for an untrained adapter (it is the identity)
        if cfg.kl_beta > 0 and adapter in backend.adapters and not backend.is_identity_adapter(adapter):
            ref_adapter = f"{adapter}_ref"  # a frozen copy of the cold-started Reasoner
            backend.copy_adapter(adapter, ref_adapter)
        per_step = cfg.questions_per_step * cfg.group_size * max_reasoner_calls(student)
        max_tokens = [student.lm_kwargs.get(r, {}).get("max_tokens", D2Plan.MAX_TOKENS.get(r, 112)) for r in roles]
        trainer = TrainerConfig(
            loss="grpo",
            learning_rate=cfg.learning_rate,
            micro_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=max(1, math.ceil(per_step / cfg.micro_batch_size)),  # one optimizer step
            kl_beta=cfg.kl_beta,
            epsilon=cfg.epsilon,
            loss_type=cfg.loss_type,
            max_completion_length=max(max_tokens),
            temperature=cfg.temperature,
            ref_adapter=ref_adapter,
            **cfg.trainer_fields(),
        )
        return [Stage(name="reasoner", adapter=adapter, steps=cfg.steps, trainer=trainer, roles=roles)]

    def collect(self, ctx: StepContext) -> list[Example]:
        """The step's ``questions_per_step`` training questions (reshuffled each epoch)."""
        return ctx.take(self.examples, min(self.splanrl_config.questions_per_step, len(self.examples)))

    def generate(self, ctx: StepContext, batch: list[Example]) -> ReasonerRollouts:
        """G rollouts of the whole program per question, Reasoner sampled, Purifier greedy, all run concurrently."""
        cfg = self.splanrl_config
        jobs = [(i, example) for i, example in enumerate(batch) for _ in range(cfg.group_size)]
        sampling = {
            **{role: {"temperature": cfg.temperature} for role in REASONER_ROLES},
            "purifier": {"temperature": 0.0},
        }
        with role_lm_overrides(self.program, sampling):  # the Reasoner sampled, the Purifier greedy
            preds = parallel_map(lambda job: self.program(question=job[1].question), jobs,
                                 max_workers=cfg.num_threads)  # fmt: skip
        groups: list[list[Any]] = [[] for _ in batch]
        for (i, _), pred in zip(jobs, preds, strict=True):
            groups[i].append(pred)
        return ReasonerRollouts(batch=batch, groups=groups)

    def score(self, ctx: StepContext, rollouts: ReasonerRollouts) -> tuple[list[TrainingSample], dict[str, float]]:
        """R_i of every rollout, A_i within its question's group, one sample per Reasoner call; all-equal groups are
        skipped and counted (``groups/skipped``)."""
        weights, lm = self.splanrl_config.weights, self.program.lm
        samples: list[TrainingSample] = []
        terms: dict[str, list[float]] = {}
        skipped, calls, parsed = 0, 0, 0
        for example, preds in zip(rollouts.batch, rollouts.groups, strict=True):
            rewards = []
            for pred in preds:
                r = splanrl_rewards(pred.trajectory, answer=str(pred.answer or ""), gold_answers=list(example.answers),
                                    hop_count=max(1, int(example.hops)), gold_passage_ids=list(example.supporting_ids),
                                    weights=weights)  # fmt: skip
                rewards.append(r["reward/total"])
                for key, value in r.items():
                    terms.setdefault(key, []).append(value)
                steps = [s for role in ctx.stage.roles for s in pred.trajectory.role_steps(role)]
                calls, parsed = calls + len(steps), parsed + sum(s.ok for s in steps)
            group, _ = reasoner_group_samples([p.trajectory for p in preds], rewards, lm, adapter=ctx.stage.adapter,
                                              roles=ctx.stage.roles,
                                              scale=self.splanrl_config.advantage_scale)  # fmt: skip
            skipped += not group
            samples += group
        totals = terms.get("reward/total", [])
        metrics = {key: sum(v) / len(v) for key, v in terms.items()}
        metrics.update({
            "reward/mean": metrics.get("reward/total", 0.0),
            "reward/std": float(torch.tensor(totals).std()) if len(totals) > 1 else 0.0,
            "reward/max": max(totals, default=0.0),
            "parse/rate": parsed / max(1, calls),
            "rollouts/reasoner_calls": calls / max(1, len(totals)),
            "groups/skipped": float(skipped),
            "groups/total": float(len(rollouts.batch)),
        })  # fmt: skip
        return samples, metrics

    def update(self, ctx: StepContext, samples: list[TrainingSample], trainer: Any) -> dict[str, float]:
        """``num_iterations`` optimizer passes over the step's samples (:func:`policy_passes`)."""
        return policy_passes(trainer, samples, self.splanrl_config.num_iterations)
