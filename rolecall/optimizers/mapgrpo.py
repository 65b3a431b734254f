"""MAPGRPO: Multi-Agents Progressive GRPO (OPERA, Liu et al., arXiv 2508.16438, Sec. 4).

Agents train one after another (plan -> analysis -> rewrite). Stage k collects its role's inputs by running the
program with the agents < k already trained (Eq. 5-6). For each input x it samples G-1 candidates from the current
policy and adds c_best, the best pre-scored candidate (Eq. 11), which enters the group baseline but gets no gradient:

    A_i = r_i - mean_j r_j                                   (Eq. 2, j over the G-1 samples and c_best)
    L = -(1/|o|) sum_t min(ρ_t A_i, clip(ρ_t, 1-ε, 1+ε) A_i) + β KL_k3(π_θ || π_ref)    (Eq. 3-4)

π_ref is the initial model (the role's LoRA adapter disabled). Each role owns its LoRA adapter on one shared base
model, so updating the plan agent never disturbs the analysis agent. Rollouts use ``LocalLM.sample``: the G-1
samples of one prompt share a single prefill, and the groups of one step are batched together.

The loop is :class:`~rolecall.optimizers.core.base.WeightOptimizer`'s (sequential stages, the time budget split by
measured step cost, a checkpoint every step, resume, ``metrics.jsonl`` with per-phase timing).

One step, in order, in three files: the loop ``core/base.py``, the step ``mapgrpo.py`` (this one) and the role tasks
``mapgrpo_roles.py`` (inputs, rewards, experts, plan execution). The phases hand each other typed records:
``list[RoleInput]`` -> :class:`Rollouts` -> :class:`Executed` -> ``(samples, metrics)``.

0. ``base.py`` ``WeightOptimizer._train``: picks the stage, checks the budget and builds the ``StepContext``; on the
   stage's first step ``MAPGRPO.start_stage`` (here) calls ``OperaRoleTasks.collect`` (``mapgrpo_roles.py``), which
   collects the role's input pool with the earlier agents trained (Eq. 5-6). ``base.py`` ``WeightOptimizer._step``
   then runs and times phases 1-5, and ``_train`` writes the checkpoint.
1. collect: ``MAPGRPO.collect`` (here): ``inputs_per_step`` :class:`RoleInput` s of the pool (``ctx.take``).
2. generate: ``MAPGRPO.generate`` (here): each input's prompt, its G-1 on-policy candidates and best-of-N extras,
   sampled in one batch -> :class:`Rollouts`.
3. execute: ``MAPGRPO.execute`` (here): the candidates parsed, the gold c_best from ``OperaRoleTasks.gold_expert``
   (``mapgrpo_roles.py``); in the plan stage, ``OperaRoleTasks.execute_plans`` runs the step's :func:`plan_wave`
   downstream, each distinct plan once, into its cache -> :class:`Executed`.
4. score: ``MAPGRPO.score`` (here): ``OperaRoleTasks.score`` (``mapgrpo_roles.py``; the pure reward functions of
   :mod:`rolecall.optimizers.rewards.opera`, a plan's executed answer from the cache) rewards every candidate, c_best
   is added to each group, ``group_advantages`` (pure) gives A_i, and the groups become GRPO ``TrainingSample`` s.
5. update: ``MAPGRPO.update`` (here): ``num_iterations`` GRPO passes of the stage's ``AdapterTrainer.step``.

``MAPGRPO(warm_start=SFT(...))`` (or ``program.compile(optimizer=[SFT(...), MAPGRPO(...)])``) starts from the
supervised roles, as every seed paper does; pi_ref is then the warm-started adapter. :class:`JointGRPO` is the
single-stage baseline that trains all roles at once from the same start.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dspy
import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core.base import WeightOptimizer
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.grpo.advantages import AdvantageScale, all_equal, group_advantages
from rolecall.optimizers.core.policy_update import policy_passes
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.mapgrpo_config import MAPGRPOConfig
from rolecall.optimizers.mapgrpo_roles import OperaRoleTasks, RoleInput, as_gold_record, plan_of
from rolecall.programs.core.parallel import parallel_map

if TYPE_CHECKING:
    from rolecall.lm.generation import Completion

__all__ = ["MAPGRPO", "Executed", "JointGRPO", "Rollouts", "expert_group_advantages"]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Rollouts:
    """What :meth:`MAPGRPO.generate` sampled for one step: one entry per input, in ``batch`` order."""

    batch: list[RoleInput]
    """The step's inputs (from ``collect``)."""
    messages: list[list[dict[str, Any]]]
    """Each input's chat prompt: the role's signature, demos and inputs, formatted by ``adapter``."""
    groups: list[list[Completion]]
    """Each input's ``policy_samples`` (G-1) on-policy candidates: text, token ids and the sampler's log-probs."""
    extras: list[list[Completion]]
    """Each input's extra samples the best-of-N expert is picked from (``expert_samples``; empty unless
    ``expert="best_of_n"``)."""
    adapter: dspy.Adapter
    """The DSPy adapter that formatted ``messages``; it also parses the candidates and writes c_best's completion."""


@dataclass(kw_only=True)
class Executed(Rollouts):
    """:class:`Rollouts` plus what :meth:`MAPGRPO.execute` added: the parsed candidates and the gold experts. In the
    plan stage the candidate plans have run by then; their answers wait in the role tasks' execution cache."""

    outputs: list[list[dict[str, Any] | None]]
    """``groups`` parsed into the role's output fields (None: unparseable; it scores 0)."""
    extra_outputs: list[list[dict[str, Any] | None]]
    """``extras`` parsed the same way."""
    gold: list[dict[str, Any] | None]
    """Each input's gold expert c_best (``expert="gold"``; None otherwise, or where the dataset has none)."""


class MAPGRPO(WeightOptimizer[list[RoleInput], Rollouts, Executed]):
    """Trains each role of an OPERA program in turn with GRPO and an expert-augmented group (a ``dspy.Teleprompter``).

    Args:
        config: a :class:`MAPGRPOConfig`; keyword arguments override its fields (``MAPGRPO(group_size=4)``).
        warm_start: an optimizer (usually :class:`~rolecall.optimizers.SFT`) compiled on the same trainset first.

    Example:
        >>> program = OPERA(BM25(world.corpus), lm=LocalLM())                    # doctest: +SKIP
        >>> program.compile(optimizer=MAPGRPO(group_size=4, warm_start=SFT()), trainset=world.train)  # doctest: +SKIP
    """

    defaults: dict[str, Any] = {}
    """Config fields a subclass sets differently (:class:`JointGRPO`), applied over a given config as well."""

    def __init__(self, config: MAPGRPOConfig | None = None, *, warm_start: Any = None, **overrides: Any) -> None:
        # a subclass's defaults hold over a given config too (JointGRPO is never progressive); overrides win
        self.mapgrpo_config = cfg = MAPGRPOConfig.merged(config, {**self.defaults, **overrides})
        self.warm_start = warm_start
        super().__init__(cfg.loop_config("sequential" if cfg.progressive else "interleaved"))
        self.pools: dict[str, list[RoleInput]] = {}
        self.screened: dict[str, dict[str, int]] = {}  # per stage: inputs collected and kept by ``screen_pool``

    # ------------------------------------------------------------------ the weight-optimizer contract
    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **kw: Any) -> Any:
        """Train ``student``'s role adapters in place and return it.

        Raises:
            ConfigError: when the trainset is empty, or a stage's role is missing or is not bound to a LocalLM LoRA
                adapter view.
        """
        self.records = [as_gold_record(e) for e in trainset]
        if not self.records:
            raise ConfigError(f"{type(self).__name__} needs a non-empty trainset")
        if self.warm_start is not None:
            logger.info("%s: warm start with %s", type(self).__name__, type(self.warm_start).__name__)
            student = student.compile(optimizer=self.warm_start, trainset=trainset)
        self.program = student
        synthesizes = bool(getattr(student, "final_synthesis", False)) and "synthesis" in getattr(student, "roles", {})
        self.stage_roles = self.mapgrpo_config.stage_order(synthesizes)
        self.views = self._role_views(student)
        self.tasks = OperaRoleTasks(student, self.mapgrpo_config)
        return super().compile(student, trainset=trainset, valset=valset, **kw)

    def backend(self, student: Any) -> Any:
        """The model backend of the trained roles' LocalLM views."""
        return next(iter(self.views.values())).backend

    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """One GRPO stage per role in ``config.stage_order(...)``, one optimizer step per MAPGRPO step."""
        cfg = self.mapgrpo_config
        per_step = cfg.inputs_per_step * (cfg.policy_samples + int(cfg.expert_gradient))
        backend = self.backend(student)
        stages = []
        for role in self.stage_roles:
            adapter = self.views[role].adapter
            ref_adapter = None  # the base model: right for an untrained adapter (it is the identity)
            if cfg.reference == "start" and cfg.kl_beta[role] > 0 and not backend.is_identity_adapter(adapter):
                ref_adapter = f"{adapter}_ref"  # a frozen copy of the warm-started adapter
                backend.copy_adapter(adapter, ref_adapter)
            trainer = TrainerConfig(
                loss="grpo",
                learning_rate=cfg.learning_rate[role],
                micro_batch_size=cfg.micro_batch_size,
                gradient_accumulation_steps=max(1, math.ceil(per_step / cfg.micro_batch_size)),
                kl_beta=cfg.kl_beta[role],
                epsilon=cfg.epsilon,
                epsilon_high=cfg.epsilon,
                loss_type=cfg.loss_type,
                max_completion_length=cfg.max_completion_length,
                temperature=cfg.temperature,
                tis_cap=cfg.tis_cap,
                ref_adapter=ref_adapter,
                **cfg.trainer_fields(),
            )
            stages.append(Stage(name=role, adapter=adapter, steps=cfg.steps[role], trainer=trainer,
                                roles=(role,)))  # fmt: skip
        return stages

    def setup(self, student: Any, trainset: Sequence[Any], stages: list[Stage]) -> None:
        """Single-stage GRPO: every role's inputs from the starting program, before any role trains."""
        if not self.mapgrpo_config.progressive:
            for stage in stages:
                self._collect_pool(stage.name)

    def start_stage(self, ctx: StepContext) -> bool:
        """Phase 0, on the stage's first step: collect its training inputs with the earlier agents trained (Eq. 5-6,
        ``OperaRoleTasks.collect``); False when there are none."""
        if ctx.stage.name not in self.pools:
            self._collect_pool(ctx.stage.name)
        return bool(self.pools[ctx.stage.name])

    def _collect_pool(self, role: str) -> None:
        self.pools[role] = self.tasks.collect(role, self.records, random.Random(f"{self.mapgrpo_config.seed}-{role}"))
        logger.info("%s %s: %d training inputs collected", type(self).__name__, role, len(self.pools[role]))
        if self.mapgrpo_config.screen_pool and self.pools[role]:
            collected = len(self.pools[role])
            self.pools[role] = self.screen(role, self.pools[role])
            self.screened[role] = {"collected": collected, "kept": len(self.pools[role])}
            logger.info("%s %s: %d of %d inputs kept by screening (their groups disagree or c_best stands apart)",
                        type(self).__name__, role, len(self.pools[role]), collected)  # fmt: skip

    def _teaches(self, role: str, item: RoleInput, outputs: list[Any], expert_out: dict[str, Any] | None) -> bool:
        """Whether a group of ``outputs`` for ``item`` is informative: rewards that differ, or under off-policy
        guidance a c_best whose reward differs from their mean."""
        rewards = [r for r, _ in self.tasks.score(role, item, outputs)]
        if not all_equal(rewards):
            return True
        if not (self.mapgrpo_config.expert_gradient and expert_out is not None):
            return False
        expert = self.tasks.score(role, item, [expert_out])[0][0]
        return abs(expert - sum(rewards) / len(rewards)) > 1e-9

    def summary_extra(self) -> dict[str, Any]:
        """``pool_screening``: per screened stage, the inputs collected and those kept."""
        return {"pool_screening": dict(self.screened)} if self.screened else {}

    def screen(self, role: str, pool: list[RoleInput]) -> list[RoleInput]:
        """The inputs of ``pool`` whose group, sampled once now, would be informative (:attr:`~MAPGRPOConfig.
        screen_pool`): on-policy rewards that differ, or under off-policy guidance a c_best whose reward differs
        from the samples' mean.

        Sampled ``inputs_per_step`` prompts at a time, the batch a training step sends: vLLM 0.32's CPU engine dies
        on seeded requests whose prefill it splits over several steps ("CPU Generator does not use offset"), which
        32 synthesis prompts at once made it do."""
        cfg = self.mapgrpo_config
        chunk = cfg.inputs_per_step
        predictor, view = self.program.roles[role], self.views[role]
        kept: list[RoleInput] = []
        for start in range(0, len(pool), chunk):
            batch = pool[start : start + chunk]
            adapter, messages = self._prompts(role, batch)
            groups = view.sample(messages, n=cfg.policy_samples, seed=cfg.seed * 7919 + 10**6 + start,
                                 **self._sampling(role))  # fmt: skip
            outputs = [[_parse(adapter, predictor.signature, c.text) for c in g] for g in groups]
            gold = [self.tasks.gold_expert(role, item) if cfg.expert == "gold" else None for item in batch]
            if role == "plan":
                self.tasks.execute_plans(plan_wave(batch, outputs, [[] for _ in batch], gold))

            verdicts = parallel_map(lambda i, b=batch, o=outputs, g=gold: self._teaches(role, b[i], o[i], g[i]),
                                    list(range(len(batch))))  # fmt: skip
            kept += [item for item, keep in zip(batch, verdicts, strict=True) if keep]
        return kept

    # ------------------------------------------------------------------ one step (phases 1-5, see the module)
    def stage_exhausted(self, stage: str, records: list[dict[str, Any]]) -> str | None:
        """A stage ends early once its last ``stage_patience`` steps had fewer than ``min_informative`` of their
        groups informative: the time left goes to the later stages, which still have signal to learn from."""
        patience = self.mapgrpo_config.stage_patience
        if patience == 0 or len(records) < patience:
            return None
        recent = records[-patience:]
        informative = sum(r.get("groups/informative", 0.0) for r in recent)
        total = sum(r.get("groups/total", 0.0) for r in recent)
        if total and informative / total < self.mapgrpo_config.min_informative:
            return (
                f"out of signal: {informative:.0f} of {total:.0f} groups informative in its last {patience} steps "
                f"(min_informative={self.mapgrpo_config.min_informative:g})"
            )
        return None

    def collect(self, ctx: StepContext) -> list[RoleInput]:
        """Phase 1: the step's ``inputs_per_step`` inputs from the stage's pool."""
        return ctx.take(
            self.pools[ctx.stage.name], min(self.mapgrpo_config.inputs_per_step, len(self.pools[ctx.stage.name]))
        )

    def generate(self, ctx: StepContext, batch: list[RoleInput]) -> Rollouts:
        """Phase 2: G-1 samples per input from the current policy (one prefill per prompt, the groups batched), plus
        the extra samples best-of-N experts are picked from, in the same batch."""
        cfg, role = self.mapgrpo_config, ctx.stage.name
        view = self.views[role]
        adapter, messages = self._prompts(role, batch)
        seed = cfg.seed * 7919 + ctx.step
        n = cfg.policy_samples + (cfg.expert_samples if cfg.expert == "best_of_n" else 0)
        groups = view.sample(messages, n=n, seed=seed, logprobs=True, **self._sampling(role))
        extras = [g[cfg.policy_samples :] for g in groups]
        groups = [g[: cfg.policy_samples] for g in groups]
        return Rollouts(batch=batch, messages=messages, groups=groups, extras=extras, adapter=adapter)

    def _prompts(self, role: str, batch: list[RoleInput]) -> tuple[Any, list[Any]]:
        """The role's adapter and the messages it formats for each input of ``batch`` (the role's own demos)."""
        predictor = self.program.roles[role]
        role_adapter = getattr(self.program, "role_adapter", None)
        adapter = (role_adapter(role) if role_adapter else None) or dspy.settings.adapter or dspy.ChatAdapter()
        return adapter, [adapter.format(predictor.signature, _demos(predictor), item.inputs) for item in batch]

    def _sampling(self, role: str) -> dict[str, Any]:
        """The role's own stop strings and token budget, with the policy's temperature and nucleus mass."""
        cfg = self.mapgrpo_config
        lm_kwargs = getattr(self.program, "lm_kwargs", {})
        role_kwargs = {**lm_kwargs.get("*", {}), **lm_kwargs.get(role, {})}
        return {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": min(cfg.max_completion_length, role_kwargs.get("max_tokens", cfg.max_completion_length)),
            "stop": tuple(role_kwargs.get("stop", ())),
        }

    def execute(self, ctx: StepContext, rollouts: Rollouts) -> Executed:
        """Phase 3: parse the candidates and build the gold experts; in the plan stage, execute the step's candidate
        plans, extra best-of-N samples and expert plans in one concurrent wave (each distinct plan once, cached)."""
        cfg, role = self.mapgrpo_config, ctx.stage.name
        signature, adapter, batch = self.program.roles[role].signature, rollouts.adapter, rollouts.batch
        outputs = [[_parse(adapter, signature, c.text) for c in g] for g in rollouts.groups]
        extra_outputs = [[_parse(adapter, signature, c.text) for c in g] for g in rollouts.extras]
        gold = [self.tasks.gold_expert(role, item) if cfg.expert == "gold" else None for item in batch]
        if role == "plan":  # one wave of executions for the step; score_one reads them from the cache
            self.tasks.execute_plans(plan_wave(batch, outputs, extra_outputs, gold))
        return Executed(**vars(rollouts), outputs=outputs, extra_outputs=extra_outputs, gold=gold)

    def score(self, ctx: StepContext, executed: Executed) -> tuple[list[TrainingSample], dict[str, float]]:
        """Phase 4: score the candidates (plans from the execution cache), add c_best to each group, and turn the
        groups into GRPO samples. A group whose on-policy rewards are all equal (and c_best's too, with
        ``skip_groups="with_expert"``) is skipped and counted (``groups/skipped``)."""
        cfg, role = self.mapgrpo_config, ctx.stage.name
        predictor, view, tasks = self.program.roles[role], self.views[role], self.tasks
        batch, messages, groups = executed.batch, executed.messages, executed.groups
        outputs, extra_outputs, gold = executed.outputs, executed.extra_outputs, executed.gold
        adapter = executed.adapter

        def score_one(i: int) -> tuple[list[tuple[float, dict]], tuple[float, dict] | None, dict[str, Any] | None]:
            scored = tasks.score(role, batch[i], outputs[i])
            expert_out = gold[i]
            if cfg.expert == "best_of_n" and extra_outputs[i]:
                extra_scored = tasks.score(role, batch[i], extra_outputs[i])
                best = max(range(len(extra_scored)), key=lambda j: extra_scored[j][0])
                return scored, extra_scored[best], extra_outputs[i][best]
            expert = tasks.score(role, batch[i], [expert_out])[0] if expert_out is not None else None
            return scored, expert, expert_out

        scored = parallel_map(score_one, list(range(len(batch))))
        samples: list[TrainingSample] = []
        rewards_all, expert_all = [], []
        components: dict[str, list[float]] = {}
        skipped = flat_below = 0
        trained_abs: list[float] = []  # |A_i| of the on-policy samples that train
        informative = 0  # groups that train something: on-policy samples with a non-zero advantage, or c_best
        name = ctx.stage.adapter
        for item_msgs, comps, (cand, expert, expert_out) in zip(messages, groups, scored, strict=True):
            rewards = [r for r, _ in cand]
            rewards_all += rewards
            if expert is not None:
                expert_all.append(expert[0])
            for _, parts in cand:
                for k, v in parts.items():
                    components.setdefault(k, []).append(v)
            group = rewards + ([expert[0]] if expert is not None else [])
            advantages = expert_group_advantages(rewards, None if expert is None else expert[0],
                                                 expert_in_baseline=cfg.expert_in_baseline,
                                                 scale=cfg.advantage_scale)  # fmt: skip
            prompt_ids = view.backend.encode_messages(item_msgs)
            flat = all_equal(rewards)
            if flat and rewards and expert is not None and rewards[0] < expert[0] - 1e-9:
                flat_below += 1  # the samples agree and all score below c_best
            teaches = False  # does the group train anything (a non-zero advantage on a policy sample, or c_best)?
            if all_equal(group) if cfg.skip_groups == "with_expert" else flat:
                skipped += 1  # equal rewards (skip_groups decides whether c_best's counts): no forward pass for them
            else:
                trained_abs += [abs(a) for a in advantages[: len(comps)].tolist()]
                teaches = any(a != 0 for a in advantages[: len(comps)].tolist())
                for c, adv in zip(comps, advantages[: len(comps)].tolist(), strict=True):  # c_best: no gradient
                    # the sampler's log-probs correct the sampler/trainer mismatch (TIS); pi_old is the trainer's own
                    samples.append(TrainingSample(role=role, adapter=name, prompt_ids=prompt_ids,
                                                  completion_ids=c.token_ids, advantage=adv,
                                                  sampler_logps=_recorded(c.logprobs, c.token_ids)))  # fmt: skip
            if cfg.expert_gradient and expert is not None and expert_out is not None and float(advantages[-1]) != 0:
                ids = _expert_ids(view, adapter, predictor.signature, expert_out)
                samples.append(TrainingSample(role=role, adapter=name, prompt_ids=prompt_ids, completion_ids=ids,
                                              advantage=float(advantages[-1])))  # fmt: skip
                teaches = True  # a skipped group still teaches c_best (off-policy guidance)
            informative += teaches
        parsed = sum(o is not None for outs in outputs for o in outs)
        metrics = {
            "reward/mean": _mean(rewards_all),
            "reward/std": float(torch.tensor(rewards_all).std()) if len(rewards_all) > 1 else 0.0,
            "reward/max": max(rewards_all, default=0.0),
            "reward/expert": _mean(expert_all),
            "parse/rate": parsed / max(1, len(rewards_all)),
            "groups/skipped": float(skipped),
            "groups/informative": float(informative),
            "groups/total": float(len(batch)),
            "advantage/abs_mean": _mean(trained_abs),
            "groups/flat_below_expert": float(flat_below),
            "pool/size": float(len(self.pools.get(role, ()))),
        }
        if role == "plan":
            metrics.update({f"plan/{k}": float(v) for k, v in tasks.execution_stats.items()})
        metrics.update({f"reward/{k}": _mean(v) for k, v in components.items()})
        return samples, metrics

    def update(self, ctx: StepContext, samples: list[TrainingSample], trainer: Any) -> dict[str, float]:
        """Phase 5: ``num_iterations`` passes of GRPO over the step's samples (one optimizer step each); nothing to
        train on when every group was skipped (the trainer is still called: under several processes every process
        must call it as often, and the main process's samples decide).

        With several passes, pi_old is the trainer's own forward before the first one (``trainer.policy_logps``,
        stored as ``old_logps``), so the first pass's ratio is exactly 1 and the later ones clip against it; the
        sampler's log-probs only weigh the advantages (truncated importance sampling, ``tis_cap``)."""
        return policy_passes(trainer, samples, self.mapgrpo_config.num_iterations)

    def _role_views(self, program: Any) -> dict[str, Any]:
        roles = program.roles
        views = {}
        for stage in self.stage_roles:
            if stage not in roles:
                raise ConfigError(f"MAPGRPO stage {stage!r} is not a role of this program; roles: {sorted(roles)}")
            lm = roles[stage].lm
            if lm is None or getattr(lm, "adapter", None) is None or not hasattr(lm, "sample"):
                raise ConfigError(
                    f"role {stage!r} must run on a rolecall LocalLM adapter view: build the program with "
                    "lm=LocalLM() (per_role_adapters=True) or call program.bind_role_adapters(local_lm)"
                )
            views[stage] = lm
        return views


class JointGRPO(MAPGRPO):
    """Single-stage GRPO over all of OPERA's roles at once (the paper's "GRPO" row of the ablation ladder).

    The same rewards, group sampling and trainer as :class:`MAPGRPO`, but not progressive: every role's inputs are
    collected from the starting program (no agent sees the inputs of an earlier trained agent), the roles' steps
    interleave over one budget, and there is no expert c_best (``expert="none"``; pass ``expert="gold"`` to keep it).

    Example:
        >>> program.compile(optimizer=JointGRPO(warm_start=SFT()), trainset=world.train)  # doctest: +SKIP
    """

    defaults = {"progressive": False, "expert": "none"}


def expert_group_advantages(
    rewards: Sequence[float], expert: float | None, *, expert_in_baseline: bool = True, scale: AdvantageScale = "none"
) -> torch.Tensor:
    """A_i of one group: its on-policy rewards ``rewards`` and, last, c_best's ``expert`` reward (None: no expert).

    With ``expert_in_baseline`` (the paper's Eq. 11), c_best enters the group mean, so when gold wins the on-policy
    advantages sum to (G-1)/G * (mean_policy - r_expert) < 0; without it the baseline is the on-policy samples' own mean
    (their advantages sum to 0) and c_best's advantage is measured against it. ``scale="std"`` divides by a standard
    deviation (GRPO), ``"none"`` is Eq. 2's r - mean. With c_best outside the baseline the std is the whole group's
    (c_best included): the on-policy samples' own std is 0 whenever they agree, which would give c_best an advantage
    of (r_expert - mean) / 1e-4.

    Example:
        >>> expert_group_advantages([0.0, 0.5], 1.0).tolist()
        [-0.5, 0.0, 0.5]
        >>> expert_group_advantages([0.0, 0.5], 1.0, expert_in_baseline=False).tolist()
        [-0.25, 0.25, 0.75]
        >>> adv = expert_group_advantages([0.0, 0.0], 1.0, expert_in_baseline=False, scale="std")
        >>> [round(a, 3) for a in adv.tolist()]
        [0.0, 0.0, 1.732]
    """
    group = [*rewards, *([] if expert is None else [expert])]
    mask = None
    if expert is not None and not expert_in_baseline:
        mask = torch.tensor([[True] * len(rewards) + [False]])
    return group_advantages(torch.tensor([group]), scale=scale, baseline_mask=mask)[0]


def _demos(predictor: Any) -> list[dict[str, Any]]:
    return [d.toDict() if hasattr(d, "toDict") else dict(d) for d in (predictor.demos or [])]


def _expert_ids(view: Any, adapter: Any, signature: Any, outputs: dict[str, Any]) -> list[int]:
    """Token ids of c_best written in the adapter's output format, ending in EOS (as a sampled completion would)."""
    text = adapter.format_assistant_message_content(signature, outputs)
    tokenizer = view.backend.tokenizer
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [view.backend.eos_token_ids[0]]


def _parse(adapter: Any, signature: Any, text: str) -> dict[str, Any] | None:
    try:
        return adapter.parse(signature, text)
    except Exception:  # an unparseable candidate is data: it scores 0
        return None


def plan_wave(
    batch: Sequence[Any],
    outputs: Sequence[Sequence[dict[str, Any] | None]],
    extra_outputs: Sequence[Sequence[dict[str, Any] | None]],
    gold: Sequence[dict[str, Any] | None],
) -> list[tuple[str, list[str]]]:
    """The plan stage's executions for one step: for each input (its ``record.question``), the parsed plans of its
    on-policy candidates, its extra best-of-N samples and its expert output, in that order. Duplicates are kept; the
    execution cache runs each distinct (question, plan) once."""
    wave = []
    for item, outs, more, expert_out in zip(batch, outputs, extra_outputs, gold, strict=True):
        wave += [(item.record.question, plan) for plan in _plans([*outs, *more, expert_out])]
    return wave


def _plans(outputs: Sequence[dict[str, Any] | None]) -> list[list[str]]:
    """The parsed plans among ``outputs`` (unparseable and empty ones dropped)."""
    return [plan for plan in (plan_of(o) for o in outputs) if plan]


def _recorded(logprobs: Any, token_ids: Sequence[int]) -> list[float] | None:
    """The sampler's per-token log-probs when it recorded one per completion token, else None (no TIS weight)."""
    if logprobs is None or len(logprobs) != len(token_ids):
        return None
    return [float(v) for v in logprobs]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
