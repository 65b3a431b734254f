"""MultiAgent-OPD Stage I: the cascaded Searcher -> Answerer Teacher trained with GRPO (Zhao et al., arXiv 2610.23234,
Sec. 3.2; PAPERS.md section 3), and the rollout helpers both stages share.

For a question x, G rollouts τ_1..τ_G of the :class:`~rolecall.programs.team.program.CascadedTeam`, every role sampled
at ``temperature`` and the Answerer drawing J candidates per request (Eq. 2,
:func:`~rolecall.optimizers.rewards.team.cascaded_team_rewards`)::

    R_A,i,j = c_ij                          R_S,i = 0.9 R_EM,i + 0.1 b_S,i          (-1 for an invalid format)
    Â_S,i   = (R_S,i - μ_x,S) / (σ_x,S + ε)   over the G rollouts                  (Eq. 1, role-wise)
    Â_A,i,j = (R_A,i,j - μ_i,A) / (σ_i,A + ε) over the J candidates of rollout i    (the parent workflow)

Every Searcher turn of rollout i is a sample with Â_S,i, every Answerer candidate one with Â_A,i,j, all on the
Teacher's one shared adapter (the paper's Teacher is one model; a role prompt selects the role), trained with the
clipped GRPO surrogate (``dapo`` token mean, no KL). Samples whose advantage is 0 (an all-equal group) are dropped.
Afterwards the adapter is the frozen Teacher π_T: Stage II trains only the student's adapters.

Retrieved passages: each Searcher turn is a separate role call whose prompt holds its notes (the passages), and its
completion is only what it wrote (the action and its content), so passages are never a loss token.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core.base import WeightOptimizer
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.grpo.logprobs import build_completion_batch
from rolecall.optimizers.core.logprobs import reference_per_token_logps
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.samples import samples_from_trajectory
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.mapgrpo_roles import GoldRecord, as_gold_record
from rolecall.optimizers.opd_config import OPDConfig
from rolecall.optimizers.rewards.team import TeamRewards, cascaded_team_rewards, role_advantages
from rolecall.programs.core.calls import read_sections
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.team.base import team_lm_kwargs
from rolecall.programs.team.program import CascadedTeam

__all__ = [
    "OPDTeacher",
    "TeamRollouts",
    "answerer_samples",
    "completion_logps",
    "load_teacher",
    "role_samples",
    "team_sampling",
    "with_advantage",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- shared helpers
def load_teacher(lm: Any, path: str | Path, teacher_adapter: str = "opd_teacher") -> str:
    """Load a CascadedTeam saved by ``Program.save`` (a Stage I run) into ``lm`` and copy its shared adapter to
    ``teacher_adapter``, the frozen π_T that ``OPD(train_teacher=False)`` reads.

    Returns the cascade's own adapter name. When the student's adapter has that name (both default to ``"team"``), the
    cascade's weights replaced it: load the student after this call.
    """
    cascade = CascadedTeam.load(path, lm=lm)
    (adapter,) = cascade.adapter_roles()
    lm.backend.copy_adapter(adapter, teacher_adapter)
    return adapter


def role_samples(trajectory: Trajectory, lm: Any, role: str, adapter_of: Callable[[str], str]) -> list[TrainingSample]:
    """One sample per recorded call of ``role`` (unparsed ones kept: the -1 format reward must reach them), each on
    the exact messages it saw; the passages of a Searcher turn are in its prompt, so they carry no loss."""
    return samples_from_trajectory(trajectory, lm, roles=(role,), adapter_of=lambda s: adapter_of(s.role),
                                   include_failed=True)  # fmt: skip


def answerer_samples(trajectory: Trajectory, lm: Any, adapter_of: Callable[[str], str]) -> list[TrainingSample]:
    """One sample per candidate j of the last Answerer request, in candidate order (``meta["candidates"]``), each on
    the messages of the call that wrote it.

    The request's completions are those of its LM calls (``meta["attempts"]``, else ``meta["completions"]``, else its
    one completion): one call with J samples, or J concurrent one-sample calls, recorded in start order, which need
    not be candidate order, then the JSON fallback's calls if any. Candidate j is matched to the first unused
    completion whose answer field reads as c_j (``None``: unreadable); a candidate matching none takes the first
    unused completion.
    """
    steps = trajectory.role_steps("answerer")
    if not steps:
        return []
    step = steps[-1]
    # (messages, text, meta): a one-completion call keeps its sampled token ids, so the sample trains on exactly them
    if step.meta.get("attempts"):
        pairs = [(a["messages"], text, {"sampled": a["sampled"]} if "sampled" in a else {})
                 for a in step.meta["attempts"] for text in a.get("completions") or []]  # fmt: skip
    elif step.meta.get("completions"):
        pairs = [(step.messages, text, {}) for text in step.meta["completions"]]
    else:
        pairs = [(step.messages, step.completion, {k: v for k, v in step.meta.items() if k == "sampled"})]
    pairs = [pair for pair in pairs if pair[1] is not None]
    candidates = step.meta.get("candidates")
    if candidates is not None:
        pairs = _match_candidates(pairs, list(candidates))
    calls = [replace(step, messages=messages, completion=text, meta=meta) for messages, text, meta in pairs]
    return samples_from_trajectory(calls, lm, roles=("answerer",), adapter_of=lambda s: adapter_of(s.role),
                                   include_failed=True)  # fmt: skip


def _match_candidates(pairs: list[tuple[Any, str, dict]], candidates: list[str | None]) -> list[tuple[Any, str, dict]]:
    """``pairs`` (messages, completion, meta) reordered so that pair j wrote candidate j (see
    :func:`answerer_samples`)."""
    read = [" ".join(str(read_sections(pair[1], ["answer"]).get("answer") or "").split()) or None for pair in pairs]
    free = list(range(len(pairs)))
    chosen = []
    for candidate in candidates:
        if not free:
            break
        index = next((i for i in free if read[i] == candidate), free[0])
        free.remove(index)
        chosen.append(pairs[index])
    return chosen


def with_advantage(samples: Sequence[TrainingSample], advantage: float) -> list[TrainingSample]:
    """The samples carrying ``advantage``; none when it is 0 (no gradient, so no cost)."""
    if abs(advantage) < 1e-12:
        return []
    return [replace(s, advantage=float(advantage), token_advantages=None) for s in samples]


def completion_logps(
    backend: Any, samples: Sequence[TrainingSample], adapter: str, *, temperature: float = 1.0, batch_size: int = 4
) -> list[torch.Tensor]:
    """log π_adapter(a_t | h_t) of each sample's completion tokens, no gradient: shape (len(completion),) per sample,
    0 where the loss mask is 0. The prompt is the sample's own (the same role prompt, subtask and passages), so the
    Teacher scores the student's own prefix. Naive equivalent per sample: ``per_token_logps`` of
    ``prompt_ids + completion_ids`` with ``adapter`` active, cut to the completion, times the loss mask."""

    def run() -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        model = backend.model
        device = next(model.parameters()).device
        training = model.training
        with backend.lock:
            model.eval()  # no LoRA dropout in a scoring pass
            try:
                for start in range(0, len(samples), batch_size):
                    chunk = samples[start : start + batch_size]
                    batch = build_completion_batch(backend.tokenizer, [s.prompt_ids for s in chunk],
                                                   [s.completion_ids for s in chunk],
                                                   loss_masks=[s.loss_mask for s in chunk], device=device)  # fmt: skip
                    logps = reference_per_token_logps(model, batch["input_ids"], batch["attention_mask"],
                                                      batch["completion_mask"], adapter=adapter,
                                                      temperature=temperature)  # (B, T)  # fmt: skip
                    for i, s in enumerate(chunk):
                        begin = len(s.prompt_ids)
                        out.append(logps[i, begin : begin + len(s.completion_ids)].detach().cpu())
            finally:
                model.train(training)
        return out

    if not samples:
        return []
    return backend.run_on_model_thread(run)


@contextlib.contextmanager
def team_sampling(program: Any, *, temperature: float, answer_candidates: int) -> Iterator[None]:
    """Every role sampled at ``temperature`` and the Answerer drawing ``answer_candidates`` samples per request, for
    the rollouts only (the program's own settings come back afterwards)."""
    saved_kwargs = {role: dict(v) for role, v in program.lm_kwargs.items()}
    saved_candidates = program.answer_candidates
    kwargs = team_lm_kwargs(program.lm_kwargs, answer_candidates)
    for role in program.ROLES:
        entry = kwargs.setdefault(role, {})
        entry["temperature"] = temperature
    program.lm_kwargs.clear()
    program.lm_kwargs.update(kwargs)
    program.answer_candidates = answer_candidates
    try:
        yield
    finally:
        program.lm_kwargs.clear()
        program.lm_kwargs.update(saved_kwargs)
        program.answer_candidates = saved_candidates


@dataclass(kw_only=True)
class TeamRollouts:
    """What ``generate`` ran for one step of either stage (:class:`OPDTeacher`, :class:`~rolecall.optimizers.opd.OPD`):
    G team rollouts per question, in ``batch`` order."""

    batch: list[GoldRecord]
    """The step's training questions (from ``collect``)."""
    groups: list[list[Any]]
    """Each question's G predictions (``group_size``, :func:`rollouts`), each with its ``trajectory``."""


def rollouts(program: Any, batch: Sequence[GoldRecord], cfg: OPDConfig) -> list[list[Any]]:
    """G sampled rollouts per question, all concurrent (their LM calls batch together); one list per question."""
    jobs = [record for record in batch for _ in range(cfg.group_size)]
    with team_sampling(program, temperature=cfg.temperature, answer_candidates=cfg.answer_candidates):
        preds = parallel_map(lambda r: program(question=r.question), jobs, max_workers=cfg.num_threads)
    return [preds[i : i + cfg.group_size] for i in range(0, len(jobs), cfg.group_size)]


def steps_per_update(program: Any, cfg: OPDConfig, *, searcher_calls: int) -> int:
    """Gradient-accumulation micro-batches so one step's samples make one optimizer step."""
    leader = int(getattr(program, "max_rounds", -1)) + 1
    per_rollout = searcher_calls + leader + cfg.answer_candidates
    return max(1, math.ceil(cfg.questions_per_step * cfg.group_size * per_rollout / cfg.micro_batch_size))


def reward_metrics(scored: Sequence[TeamRewards]) -> dict[str, float]:
    """The mean of every reward term over the step's rollouts (flat, namespaced)."""
    terms: dict[str, list[float]] = {}
    for rewards in scored:
        for key, value in rewards.metrics().items():
            terms.setdefault(key, []).append(value)
    outcomes = terms.get("reward/outcome", [])
    return {
        **{key: sum(v) / len(v) for key, v in terms.items()},
        "reward/std": float(torch.tensor(outcomes).std()) if len(outcomes) > 1 else 0.0,
        "reward/max": max(outcomes, default=0.0),
    }


# ---------------------------------------------------------------------------------------------- Stage I
class OPDTeacher(WeightOptimizer[list[GoldRecord], TeamRollouts, TeamRollouts]):
    """MultiAgent-OPD's Stage I: GRPO on the cascaded Searcher -> Answerer workflow's one shared adapter (see module).

    Args:
        config: an :class:`~rolecall.optimizers.opd_config.OPDConfig` (``group_size``, ``teacher_steps``,
            ``teacher_minutes``, ``answer_candidates``, ``temperature``, ``learning_rate``, ...).
    """

    def __init__(self, config: OPDConfig | None = None, **kw: Any) -> None:
        self.opd_config = config = OPDConfig.merged(config, kw)
        loop = config.loop_config("sequential")
        loop.time_budget_minutes = config.teacher_minutes
        loop.output_dir = f"{config.output_dir}/teacher" if config.output_dir is not None else None
        super().__init__(loop)
        self.records: list[GoldRecord] = []

    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **kw: Any) -> Any:
        """Train the cascade's shared adapter in place and return the cascade.

        Raises:
            ConfigError: the program is not a CascadedTeam, its roles do not share one adapter, or no trainset.
        """
        if not isinstance(student, CascadedTeam):
            raise ConfigError(f"OPD's Stage I trains a CascadedTeam (the Teacher's workflow); got "
                              f"{type(student).__name__}")  # fmt: skip
        adapters = sorted(student.adapter_roles())
        if len(adapters) != 1:
            raise ConfigError(f"OPD's Teacher is one model with role prompts: its Searcher and Answerer must share one "
                              f"adapter (parameter_sharing='shared'); they use {adapters}")  # fmt: skip
        self.records = [as_gold_record(e) for e in trainset]
        if not self.records:
            raise ConfigError("OPD needs a non-empty trainset with gold answers")
        self.program = student
        return super().compile(student, trainset=trainset, valset=valset, **kw)

    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """One GRPO stage on the cascade's shared adapter."""
        cfg = self.opd_config
        (adapter,) = student.adapter_roles()
        trainer = TrainerConfig(
            loss="grpo",
            learning_rate=cfg.learning_rate,
            micro_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=steps_per_update(student, cfg, searcher_calls=student.max_steps),
            epsilon=cfg.epsilon,
            loss_type="dapo",
            temperature=cfg.temperature,
        )
        return [Stage(name="teacher", adapter=adapter, steps=cfg.teacher_steps, trainer=trainer,
                      roles=tuple(student.ROLES))]  # fmt: skip

    def collect(self, ctx: StepContext) -> list[GoldRecord]:
        """The step's ``questions_per_step`` training questions."""
        return ctx.take(self.records, min(self.opd_config.questions_per_step, len(self.records)))

    def generate(self, ctx: StepContext, batch: list[GoldRecord]) -> TeamRollouts:
        """G sampled cascaded rollouts per question."""
        return TeamRollouts(batch=batch, groups=rollouts(self.program, batch, self.opd_config))

    def team_rewards(self, trajectory: Trajectory, record: GoldRecord) -> TeamRewards:
        """R_S and every R_A,i,j of one rollout (Eq. 2; a test may override it)."""
        return cascaded_team_rewards(trajectory, record.answers, weights=self.opd_config.weights)

    def score(self, ctx: StepContext, team_rollouts: TeamRollouts) -> tuple[list[TrainingSample], dict[str, float]]:
        """Role-wise advantages: Â_S over the G rollouts, Â_A over each request's J candidates (Eq. 1)."""
        lm, adapter_of = self.program.lm, self.program.adapter_name
        samples: list[TrainingSample] = []
        scored_all: list[TeamRewards] = []
        skipped = 0
        for record, preds in zip(team_rollouts.batch, team_rollouts.groups, strict=True):
            trajectories = [p.trajectory for p in preds]
            scored = [self.team_rewards(t, record) for t in trajectories]
            scored_all += scored
            a_s = role_advantages([r.searcher or 0.0 for r in scored]).tolist()  # (G,)
            before = len(samples)
            for trajectory, rewards, a in zip(trajectories, scored, a_s, strict=True):
                samples += with_advantage(role_samples(trajectory, lm, "searcher", adapter_of), a)
                candidates = answerer_samples(trajectory, lm, adapter_of)
                if len(rewards.answerer) > 1:
                    a_a = role_advantages(rewards.answerer).tolist()  # (J,)
                    for sample, advantage in zip(candidates, a_a, strict=False):
                        samples += with_advantage([sample], advantage)
            skipped += len(samples) == before
        return samples, {**reward_metrics(scored_all), "groups/skipped": float(skipped),
                         "groups/total": float(len(team_rollouts.batch))}  # fmt: skip
